#pragma once
// The command-line flags of the settings tables (quest_settings_table(), backend_settings_table()), registered by one
// function for every subcommand that runs a model: the flag spelling, type, default (shown in --help) and help text
// come from the table, and a value is checked against the entry's range when the command starts, before any model
// is loaded (InputError "--page-size: expected an integer between 1 and 256, got '512'").
#include <CLI/CLI.hpp>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "engine/backend_factory.h"

namespace quest {

struct SettingsFlags {
    std::string quest_config;                                  // --quest-config
    std::map<std::string, std::optional<std::string>> values;  // table key -> the flag's text, when given
    std::map<std::string, bool> switches;                      // table key -> a Bool entry's flag was given

    // The defaults (configs/quest-default.json), then --quest-config, then the flags; validated when `validate`.
    QuestSettings quest(bool validate = true) const;
    // --dense-layers, when given, beyond the model's layers (the default fits any model: layers past the last are
    // simply none): InputError naming the flag and the count. Called once config.json is read, before the weights.
    void check_model(const ModelConfig& c) const;
    // The backend flags onto `o` (the Quest settings and the capacity untouched).
    void apply_backend(BackendOptions& o) const;
    // BackendOptions{} with the backend flags, the capacity and quest().
    BackendOptions backend(int capacity) const;
};

// Registers --quest-config and the flag of every entry of both tables on `app`, except the keys in `skip` (a
// subcommand that sets them otherwise, e.g. eval's --budgets); "quest_config" in `skip` leaves out --quest-config.
void add_settings_flags(CLI::App& app, SettingsFlags& flags, const std::set<std::string>& skip = {});

}  // namespace quest
