#include "engine/quantize_cmd.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "engine/timing.h"
#include "model/io/quantize.h"

namespace quest {

CLI::App* add_quantize_subcommand(CLI::App& app, QuantizeFlags& f) {
    auto* q = app.add_subcommand("quantize", "Write a 4-bit (int4, group-quantized) copy of a model folder; reads FP16/"
                                             "BF16/F32, quest-int4 and AutoAWQ (GEMM) checkpoints");
    q->add_option("-m,--model", f.in, "input model folder or .gguf file")->required();
    q->add_option("-o,--out", f.out, "output folder (config.json, model.safetensors, tokenizer)")->required();
    q->add_option("--group", f.options.group, "group size: a power of two >= 32 (default 128, or the input's group)");
    q->add_option("--awq-calib", f.options.calib_file, "text file: activation-aware (AWQ-style) scaling calibrated on it");
    q->add_option("--calib-tokens", f.options.calib_tokens, "tokens of the calibration text to use")->capture_default_str();
    q->add_option("--threads", f.options.threads, "quantization threads (0: all cores)")->capture_default_str();
    return q;
}

int cmd_quantize(const QuantizeFlags& f) {
    Stopwatch sw;
    const QuantizeSummary s =
        quantize_model(f.in, f.out, f.options, [](const std::string& line) { spdlog::info("{}", line); });
    std::fputs(s.text().c_str(), stderr);
    spdlog::info("wrote {} in {:.1f} s", f.out, sw.ms() / 1000.0);
    return 0;
}

}  // namespace quest
