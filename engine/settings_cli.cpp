#include "engine/settings_cli.h"

#include "kernels/common/error.h"

namespace quest {

namespace {

template <class T>
void add_table(CLI::App& app, SettingsFlags& flags, const std::vector<Setting<T>>& table, const T& defaults,
               const std::set<std::string>& skip) {
    for (const auto& e : table) {
        if (!e.flag || skip.count(e.key)) continue;
        if (e.kind == SettingKind::Bool) {
            app.add_flag(e.flag, flags.switches[e.key], e.help);
            continue;
        }
        CLI::Option* o = app.add_option(e.flag, flags.values[e.key], e.help);
        switch (e.kind) {
        case SettingKind::Int: o->type_name("INT"); break;
        case SettingKind::Double: o->type_name("FLOAT"); break;
        case SettingKind::Bytes: o->type_name("SIZE"); break;
        default: {
            std::string names;
            for (const char* c : e.names()) names += (names.empty() ? "" : "|") + std::string(c);
            o->type_name(names);
        }
        }
        if (e.kind != SettingKind::Bytes || e.get(defaults) != 0) o->default_str(e.text(defaults));
    }
}

template <class T>
void apply_table(const SettingsFlags& flags, const std::vector<Setting<T>>& table, const T& defaults, T& t) {
    for (const auto& e : table) {
        if (!e.flag) continue;
        if (e.kind == SettingKind::Bool) {
            const auto it = flags.switches.find(e.key);
            if (it != flags.switches.end() && it->second) e.set(t, e.get(defaults) != 0 ? 0 : 1);
            continue;
        }
        const auto it = flags.values.find(e.key);
        if (it == flags.values.end() || !it->second) continue;
        const std::string err = e.set_text(t, *it->second);
        if (!err.empty()) throw InputError(std::string(e.flag) + ": " + err);
    }
}

}  // namespace

void add_settings_flags(CLI::App& app, SettingsFlags& flags, const std::set<std::string>& skip) {
    if (!skip.count("quest_config"))
        app.add_option("--quest-config", flags.quest_config, "JSON file with Quest settings (see configs/)");
    add_table(app, flags, quest_settings_table(), default_quest_settings(), skip);
    add_table(app, flags, backend_settings_table(), BackendOptions{}, skip);
}

QuestSettings SettingsFlags::quest(bool validate) const {
    const QuestSettings defaults = default_quest_settings();
    QuestSettings s = defaults;
    if (!quest_config.empty()) s = load_quest_settings(quest_config, s);
    apply_table(*this, quest_settings_table(), defaults, s);
    if (validate) s.validate();
    return s;
}

void SettingsFlags::check_model(const ModelConfig& c) const {
    const auto it = values.find("dense_layers");
    if (it == values.end() || !it->second) return;
    const int n = quest(/*validate=*/false).dense_layers;
    if (n > c.num_layers)
        throw InputError("--dense-layers: " + std::to_string(n) + " exceeds the model's " +
                         std::to_string(c.num_layers) + " layers (num_hidden_layers in config.json)");
}

void SettingsFlags::apply_backend(BackendOptions& o) const {
    apply_table(*this, backend_settings_table(), BackendOptions{}, o);
    if (o.tp != 1 && o.kind != "cuda")  // before any work (create_backend checks it again)
        throw InputError("--tp " + std::to_string(o.tp) + ": tensor parallelism runs on --backend cuda");
}

BackendOptions SettingsFlags::backend(int capacity) const {
    BackendOptions o;
    apply_backend(o);
    o.capacity = capacity;
    o.quest = quest();
    return o;
}

}  // namespace quest
