#pragma once
// `quest eval passkey|ppl`: the command-line side of engine/eval.h.
#include <CLI/CLI.hpp>
#include <functional>

namespace quest {

struct EvalCommand {
    CLI::App* app = nullptr;   // the `eval` subcommand
    std::function<int()> run;  // runs whichever of passkey / ppl was parsed
};
EvalCommand add_eval_command(CLI::App& parent);

}  // namespace quest
