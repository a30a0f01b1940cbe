#include "engine/bench.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kernels/linear/quant.h"
#include "kernels/select/quest.h"
#include "model/core/step_bytes.h"
#include "model/cpu/llama_cpu.h"
#include "kernels/common/error.h"
#include "model/core/memory.h"
#include "model/io/quantize.h"
#include "tokenizer/tokenizer.h"

namespace quest {

namespace {

// The row label of a folder's own format: fp16, int4-g<G> (quest-int4) or awq-g<G>.
std::string stored_weights_label(const ModelFolder& folder) {
    if (folder.is_gguf()) return "fp16";  // dequantized on load (the CPU backend holds fp32)
    const QuantizationInfo q = read_quantization_info(folder.dir);
    if (q.method == QuantizationInfo::Method::QuestInt4) return "int4-g" + std::to_string(q.group);
    if (q.method == QuantizationInfo::Method::Awq) return "awq-g" + std::to_string(q.group);
    return "fp16";
}

// Sets the backend's weight format for one --weights entry; returns the row label.
std::string apply_weights(BackendOptions& o, const std::string& spec, const std::string& stored) {
    if (spec.empty()) {
        o.weights = WeightRequest::as_stored();
        return stored;
    }
    if (spec == "fp16") {
        o.weights = WeightRequest::f16();
        return spec;
    }
    o.weights = WeightRequest::int4(std::stoi(spec.substr(6)));  // "int4-g<G>"
    return stored == "fp16" ? spec : stored;  // 4-bit folders keep their own layers
}

}  // namespace

std::vector<std::string> parse_weights_list(const std::string& s) {
    std::vector<std::string> out;
    if (s.empty()) return out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        int group = 0;
        if (item == "fp16") {
            out.push_back(item);
            continue;
        }
        if (item == "int4") group = kInt4DefaultGroup;
        else if (item.rfind("int4-g", 0) == 0 && item.size() > 6 && item.size() < 13 &&
                 item.find_first_not_of("0123456789", 6) == std::string::npos)
            group = std::stoi(item.substr(6));
        if (!int4_group_valid(group))
            throw InputError("--weights: expected fp16, int4 or int4-g<G> (G a power of two >= 32), got '" + item + "'");
        out.push_back("int4-g" + std::to_string(group));
    }
    if (out.empty()) throw InputError("--weights: empty list");
    return out;
}

std::vector<BenchRow> run_bench(const BenchRequest& r, const std::function<void(const std::string&)>& progress) {
    if (r.contexts.empty() || r.budgets.empty()) throw InputError("bench: --contexts and --budgets must not be empty");
    if (r.steps < 1 || r.warmup < 0) throw InputError("bench: --steps must be >= 1 and --warmup >= 0");
    const ModelFolder folder = open_model_or_config(r.model, r.random_weights);
    const ModelConfig& config = folder.config;
    std::vector<int> text_ids;
    if (!r.text_file.empty()) {
        if (r.random_weights) throw InputError("bench: --text needs a model with a tokenizer (a folder or a .gguf file), not --random-weights");
        std::ifstream in(r.text_file, std::ios::binary);
        if (!in) throw InputError(r.text_file + ": cannot open (--text)");
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        const auto tok = load_model_tokenizer(folder);
        check_tokenizer_vocab(*tok, folder);
        text_ids = tok->encode(text, /*add_bos=*/false);
        if (text_ids.empty()) throw InputError(r.text_file + ": no tokens in the text (--text)");
    }
    const std::string stored = r.random_weights ? "fp16" : stored_weights_label(folder);
    const std::vector<std::string> weights = r.weights.empty() ? std::vector<std::string>{""} : r.weights;
    // Every context is checked before the first row runs. Real weights: the one context rule (positions past the
    // model's maximum give noise). Random weights measure latency only (no text, no quality): any length, e.g.
    // configs/llama2-7b.json at 32K.
    for (int ctx : r.contexts) {
        if (ctx < 1) throw InputError("bench: contexts must be >= 1");
        const int64_t positions = int64_t(ctx) + r.warmup + r.steps;  // 64 bits: --steps 2^31-1 overflowed
        if (positions > (int64_t(1) << 30))
            throw InputError("bench: context " + std::to_string(ctx) + " + --warmup + --steps = " +
                             std::to_string(positions) + " tokens exceeds 2^30");
        if (!r.random_weights)
            check_context(config, positions,
                          "--contexts " + std::to_string(ctx) + " (+ --warmup " + std::to_string(r.warmup) +
                              " + --steps " + std::to_string(r.steps) + " = " + std::to_string(positions) + ")",
                          folder.config_file().string());
    }
    std::vector<BenchRow> rows;
    for (int ctx : r.contexts) {
        for (int budget : r.budgets) for (const std::string& wspec : weights) {
            BackendOptions o = r.backend;
            const std::string wlabel = apply_weights(o, wspec, stored);
            o.capacity = static_cast<int>(int64_t(ctx) + r.warmup + r.steps);  // checked above
            if (budget == 0) {
                o.quest.full_attention = true;
            } else {
                o.quest.full_attention = false;
                o.quest.budget = budget;
            }
            o.quest.validate();
            progress("context " + std::to_string(ctx) + ", " + (budget ? "budget " + std::to_string(budget) : "full") + ", " +
                     wlabel + " weights: building the model");
            auto b = r.random_weights ? create_random_backend(config, r.seed, o) : create_backend(folder, o);
            std::mt19937 rng(static_cast<uint32_t>(r.seed));
            std::uniform_int_distribution<int> tok(3, config.vocab_size - 1);
            std::vector<int> prompt(ctx);
            for (int i = 0; i < ctx; ++i)  // the text repeated, or random ids
                prompt[i] = text_ids.empty() ? tok(rng) : text_ids[(i - 1 + text_ids.size()) % text_ids.size()];
            prompt[0] = config.bos_token_id;
            Stopwatch sw;
            b->prefill(prompt);
            BenchRow row;
            row.prefill_s = sw.ms() / 1000.0;
            progress("  prefill " + std::to_string(ctx) + " tokens: " + std::to_string(row.prefill_s) + " s");
            std::vector<double> ms;
            size_t bytes = 0;
            std::pair<double, double> model_bytes{0, 0};
            for (int i = 0; i < r.warmup + r.steps; ++i) {
                if (i == r.warmup) b->reset_read_stats();
                b->decode(tok(rng));
                if (i >= r.warmup) ms.push_back(b->last_decode_ms());
                if (i == r.warmup + r.steps / 2) {
                    bytes = b->decode_bytes();
                    if (!b->read_stats()) model_bytes = quest_step_bytes_model(config, o.quest, b->position());
                }
            }
            row.backend = b->name();
            row.weights = wlabel;
            row.context = ctx;
            row.budget = budget;
            row.page_size = o.quest.page_size;
            row.ms = summarize_latency(ms);
            row.tokens_per_s = 1000.0 / row.ms.mean;
            row.bytes = bytes;
            row.selector = o.quest.policy_label();
            if (const ReadStats* st = b->read_stats()) {  // what the backend counted over the timed steps
                row.attention_bytes = st->bytes_per_step();
                row.metadata_bytes = st->metadata_bytes_per_step();
                row.bytes = b->decode_bytes();  // the weights and that average
                if (row.weights == "fp16" && b->name() == "cpu") row.weights = "fp32";  // float checkpoints in fp32
            } else {
                row.attention_bytes = model_bytes.first;
                row.metadata_bytes = model_bytes.second;
            }
            row.gbps = static_cast<double>(row.bytes) / (row.ms.p50 * 1e-3) / 1e9;
            row.gpus = o.kind == "cuda" ? o.tp : 1;
            // cuda: the device memory held (peak); cpu: the host memory of its plan (weights + KV + metadata +
            // activations, model/core/memory.h).
            row.device_memory = b->device_memory_bytes() + b->host_memory_bytes();
            if (const std::string report = b->profile_report(); !report.empty()) progress(report);
            rows.push_back(row);
            char line[200];
            if (row.gpus > 1)
                std::snprintf(line, sizeof line, "  decode: p50 %.3f ms/token, %.0f GB/s over %d GPUs (%.0f GB/s each)",
                              row.ms.p50, row.gbps, row.gpus, row.gbps / row.gpus);
            else
                std::snprintf(line, sizeof line, "  decode: p50 %.3f ms/token, %.0f GB/s", row.ms.p50, row.gbps);
            progress(line);
        }
    }
    return rows;
}

std::string bench_table(const std::vector<BenchRow>& rows) {
    std::ostringstream o;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%-7s %-9s %-16s %8s %7s %9s %9s %9s %9s %9s %9s %9s %10s %11s %11s %8s %4s\n", "backend",
                  "weights", "policy", "context", "budget", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "tok/s", "GB/step", "GB/s",
                  "prefill_s", "attn_KiB", "meta_KiB", "mem_GiB", "gpus");
    o << buf;
    for (const BenchRow& r : rows) {
        // cuda: device memory the backend held (its peak); cpu: host memory of the plan.
        char mem_buf[32] = "-";
        if (r.device_memory)
            std::snprintf(mem_buf, sizeof mem_buf, "%.2f", static_cast<double>(r.device_memory) / (1ull << 30));
        const std::string mem = mem_buf;
        std::snprintf(buf, sizeof buf,
                      "%-7s %-9s %-16s %8d %7s %9.3f %9.3f %9.3f %9.3f %9.1f %9.3f %9.0f %10.2f %11.1f %11.1f %8s %4d\n",
                      r.backend.c_str(), r.weights.c_str(), r.selector.c_str(), r.context,
                      r.budget ? std::to_string(r.budget).c_str() : "full", r.ms.p50, r.ms.p90, r.ms.p99, r.ms.mean,
                      r.tokens_per_s, r.bytes / 1e9, r.gbps, r.prefill_s, r.attention_bytes / 1024.0,
                      r.metadata_bytes / 1024.0, mem.c_str(), r.gpus);
        o << buf;
    }

    return o.str();
}

std::string bench_json(const std::vector<BenchRow>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const BenchRow& r : rows)
        a.push_back({{"backend", r.backend},
                     {"weights", r.weights},
                     {"context", r.context},
                     {"budget", r.budget ? nlohmann::json(r.budget) : nlohmann::json("full")},
                     {"page_size", r.page_size},
                     {"p50", r.ms.p50},
                     {"p90", r.ms.p90},
                     {"p99", r.ms.p99},
                     {"mean", r.ms.mean},
                     {"steps", r.ms.count},
                     {"tokens_per_s", r.tokens_per_s},
                     {"bytes", r.bytes},
                     {"selector", r.selector},
                     {"attention_bytes", r.attention_bytes},
                     {"metadata_bytes", r.metadata_bytes},
                     {"gbps", r.gbps},
                     {"prefill_s", r.prefill_s},
                     {"device_memory", r.device_memory},
                     {"gpus", r.gpus},
                     {"gbps_per_gpu", r.gbps / r.gpus}});
    return a.dump(2) + "\n";
}

std::string bench_csv(const std::vector<BenchRow>& rows) {
    std::ostringstream o;
    o << "backend,weights,context,budget,page_size,p50,p90,p99,mean,tokens_per_s,bytes,gbps,prefill_s,device_memory,"
         "policy,attention_bytes,metadata_bytes,gpus\n";
    for (const BenchRow& r : rows)
        o << r.backend << ',' << r.weights << ',' << r.context << ',' << (r.budget ? std::to_string(r.budget) : "full")
          << ',' << r.page_size << ',' << r.ms.p50 << ',' << r.ms.p90 << ',' << r.ms.p99 << ',' << r.ms.mean << ','
          << r.tokens_per_s << ',' << r.bytes << ',' << r.gbps << ',' << r.prefill_s << ',' << r.device_memory << ','
          << r.selector << ',' << r.attention_bytes << ',' << r.metadata_bytes << ',' << r.gpus << '\n';
    return o.str();
}

}  // namespace quest
