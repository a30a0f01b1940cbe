#pragma once
// `quest quantize -m IN -o OUT [--group G] [--awq-calib FILE]`: writes a 4-bit (quest-int4) model folder
// (model/io/quantize.h) and prints what was quantized and what stayed FP16.
#include <string>

namespace CLI {
class App;
}

namespace quest {

struct QuantizeFlags {
    std::string in, out, calib;
    int group = 0;           // 0: 128, or the input's group when it is already 4-bit
    int calib_tokens = 512;  // --awq-calib: tokens of the calibration text used
    int threads = 0;         // 0: all cores
};

// Registers the subcommand on `app` (its flags land in `f`); run it with cmd_quantize when it was parsed.
CLI::App* add_quantize_subcommand(CLI::App& app, QuantizeFlags& f);
int cmd_quantize(const QuantizeFlags& f);

}  // namespace quest
