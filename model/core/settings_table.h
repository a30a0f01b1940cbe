#pragma once
// Settings declared once: a table entry per setting (its JSON key, CLI flag, type, valid range, help, and how to read
// and write it in the struct it belongs to). Every reader works from the table: the JSON preset parser, the CLI
// flags (engine/settings_cli.h), the `--policies` spec parser, describe() / policy_label(), the fuzz target.
// Tables: quest_settings_table() over QuestSettings (model/core/quest_settings.h), backend_settings_table() over
// BackendOptions (engine/backend_factory.h).
#include <functional>
#include <string>
#include <vector>

namespace quest {

enum class SettingKind {
    Int,     // an integer in [min, max]
    Double,  // a finite number in [min, max]
    Bool,    // true / false; on the command line a flag that sets the opposite of the default (--no-graph)
    Enum,    // one of `choices` (the value is the index)
    Bytes,   // a byte size ("24GiB", model/core/memory.h parse_byte_size); 0: the default (what is free)
};

// Text <-> value for one kind, shared by every table (the value travels as a double: exact for int and size_t up to
// 2^53). parse_setting_text returns the error ("expected an integer between 1 and 256, got 'x'") or "".
std::string parse_setting_text(SettingKind kind, const std::vector<const char*>& choices, double min, double max,
                               const std::string& text, double& out);
std::string format_setting_value(SettingKind kind, const std::vector<const char*>& choices, double value);
// What a value must be: "an integer between 1 and 256", "one of kv-max, kv-sum, per-head", ...
std::string setting_expectation(SettingKind kind, const std::vector<const char*>& choices, double min, double max);

template <class T>
struct Setting {
    const char* key;   // JSON key and the name in messages ("page_size")
    const char* flag;  // command-line flag ("--page-size"); nullptr: no flag of its own
    SettingKind kind;
    const char* help;
    std::function<double(const T&)> get;  // Enum: the index into choices; Bool: 0 / 1
    std::function<void(T&, double)> set;
    std::vector<const char*> choices = {};  // Enum: the names, index = value
    // Enum whose names grow at run time (the page selectors: kernels/select/registry.h): asked at each use instead.
    std::vector<const char*> (*choices_now)() = nullptr;
    double min = 0, max = 0;                // Int, Double: the valid range (validate() adds rules across settings)
    // QuestSettings only: the `--policies` option (a one-letter prefix before the number, "S8"; a bare token for a
    // Bool, "m"; an Enum's names are tokens themselves: "" ), the order in policy_label() (0: not in a policy),
    // describe()'s name ("B=2048"; nullptr: not described), whether describe() leaves out the value 0 / false (off),
    // and whether the setting matters under the settings' selector (nullptr: always).
    const char* token = nullptr;
    int label_rank = 0;
    const char* short_name = nullptr;
    bool hidden_when_off = false;
    bool (*relevant)(const T&) = nullptr;

    std::vector<const char*> names() const { return choices_now ? choices_now() : choices; }
    std::string text(const T& t) const { return format_setting_value(kind, names(), get(t)); }
    std::string expectation() const { return setting_expectation(kind, names(), min, max); }
    bool applies(const T& t) const { return relevant == nullptr || relevant(t); }
    // Sets the entry from text (a flag's value, a policy option's number, an enum name); returns the error or "".
    std::string set_text(T& t, const std::string& value) const {
        double v = 0;
        std::string err = parse_setting_text(kind, names(), min, max, value, v);
        if (err.empty()) set(t, v);
        return err;
    }
    // Int, Double: within [min, max] (NaN is not).
    bool in_range(double v) const { return v >= min && v <= max; }
};

// The entry with this key (nullptr when there is none).
template <class T>
const Setting<T>* find_setting(const std::vector<Setting<T>>& table, const std::string& key) {
    for (const auto& e : table)
        if (key == e.key) return &e;
    return nullptr;
}

}  // namespace quest
