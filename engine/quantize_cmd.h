#pragma once
// `quest quantize -m IN -o OUT [--group G] [--awq-calib FILE]`: writes a 4-bit (quest-int4) model folder
// (model/io/quantize.h) and prints what was quantized and what stayed FP16.
#include <string>

#include "model/io/quantize.h"

namespace CLI {
class App;
}

namespace quest {

struct QuantizeFlags {
    std::string in, out;
    QuantizeOptions options;  // --group, --awq-calib, --calib-tokens, --threads (defaults: model/io/quantize.h)
};

// Registers the subcommand on `app` (its flags land in `f`); run it with cmd_quantize when it was parsed.
CLI::App* add_quantize_subcommand(CLI::App& app, QuantizeFlags& f);
int cmd_quantize(const QuantizeFlags& f);

}  // namespace quest
