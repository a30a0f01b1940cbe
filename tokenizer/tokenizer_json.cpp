// Hugging Face tokenizer.json (and tokenizer_config.json) -> BpeData. Only what the byte-level BPE families
// (GPT-2, SmolLM2, Qwen2, Llama-3) use is accepted; anything else is an InputError naming the file, the field and
// what was expected, never silently ignored.
#include <algorithm>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "kernels/common/error.h"
#include "tokenizer/bpe.h"

namespace quest {

namespace {

using nlohmann::json;

// Added tokens that end an assistant turn in these families, and the EOS guesses when no tokenizer_config.json
// names one.
constexpr const char* kEndOfTurnNames[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>",
                                           "<|endoftext|>"};
constexpr const char* kEosNames[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<|eot_id|>"};

struct Parser {
    std::string name;  // "tokenizer file <path>"

    [[noreturn]] void fail(const std::string& what) const { throw InputError(name + ": " + what); }

    const json& member(const json& obj, const char* key, const std::string& where) const {
        if (!obj.is_object() || !obj.contains(key)) fail(where + " has no \"" + key + "\"");
        return obj[key];
    }
    std::string str(const json& v, const std::string& where) const {
        if (!v.is_string()) fail(where + ": expected a string, got " + std::string(v.type_name()));
        return v.get<std::string>();
    }
    bool flag(const json& obj, const char* key, bool fallback, const std::string& where) const {
        if (!obj.contains(key) || obj[key].is_null()) return fallback;
        if (!obj[key].is_boolean()) fail(where + "." + key + ": expected true or false");
        return obj[key].get<bool>();
    }
    std::string opt_str(const json& obj, const char* key, const std::string& where) const {
        if (!obj.contains(key) || obj[key].is_null()) return {};
        return str(obj[key], where + "." + key);
    }
    std::string type_of(const json& v, const std::string& where) const {
        if (!v.is_object()) fail(where + ": expected an object with a \"type\"");
        return str(member(v, "type", where), where + ".type");
    }
    // Calls each(element, its path) for every element of a Sequence's list `key` (an array).
    template <class Each>
    void sequence(const json& obj, const char* key, const std::string& where, Each each) const {
        const json& list = member(obj, key, where);
        if (!list.is_array()) fail(where + "." + key + ": expected an array");
        for (size_t i = 0; i < list.size(); ++i) each(list[i], where + "." + key + "[" + std::to_string(i) + "]");
    }

    void model(const json& m, BpeData& d, std::vector<int>& owner) const {
        if (!m.is_object()) fail("\"model\" is not an object (expected a BPE model with vocab and merges)");
        const std::string type = m.contains("type") ? str(m["type"], "model.type") : std::string("BPE");
        if (type != "BPE")
            fail("model.type is \"" + type + "\", expected \"BPE\" (WordPiece, Unigram and WordLevel are not "
                 "supported)");
        const json& vocab = member(m, "vocab", "model");
        if (!vocab.is_object()) fail("model.vocab: expected an object mapping pieces to ids");
        int max_id = -1;
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            if (!it.value().is_number_integer()) fail("model.vocab[\"" + it.key() + "\"]: expected an integer id");
            const int64_t id = it.value().get<int64_t>();
            if (id < 0 || id > 16'000'000) fail("model.vocab[\"" + it.key() + "\"]: id " + std::to_string(id) +
                                                " out of range (expected 0 <= id < 16000000)");
            max_id = std::max(max_id, static_cast<int>(id));
        }
        d.vocab.assign(static_cast<size_t>(max_id + 1), {});
        owner.assign(static_cast<size_t>(max_id + 1), 0);
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            const int id = it.value().get<int>();
            if (owner[id])
                fail("model.vocab: id " + std::to_string(id) + " is given to both \"" + d.vocab[id] + "\" and \"" +
                     it.key() + "\" (expected one piece per id)");
            if (it.key().empty()) fail("model.vocab: an empty piece (id " + std::to_string(id) + ")");
            owner[id] = 1;
            d.vocab[id] = it.key();
        }
        const json& merges = member(m, "merges", "model");
        if (!merges.is_array()) fail("model.merges: expected an array");
        d.merges.reserve(merges.size());
        for (size_t i = 0; i < merges.size(); ++i) {
            const json& e = merges[i];
            const std::string where = "model.merges[" + std::to_string(i) + "]";
            if (e.is_string()) {
                const std::string s = e.get<std::string>();
                const size_t sp = s.find(' ');
                if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
                    s.find(' ', sp + 1) != std::string::npos)
                    fail(where + " is \"" + s + "\", expected two pieces separated by one space");
                d.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
            } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
                d.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
            } else {
                fail(where + ": expected \"a b\" or [\"a\", \"b\"]");
            }
        }
        if (m.contains("dropout") && !m["dropout"].is_null() &&
            !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
            fail("model.dropout: BPE dropout is not supported (expected null)");
        d.unk_token = opt_str(m, "unk_token", "model");
        d.continuing_subword_prefix = opt_str(m, "continuing_subword_prefix", "model");
        d.end_of_word_suffix = opt_str(m, "end_of_word_suffix", "model");
        d.fuse_unk = flag(m, "fuse_unk", false, "model");
        d.byte_fallback = flag(m, "byte_fallback", false, "model");
        d.ignore_merges = flag(m, "ignore_merges", false, "model");
    }

    void added_tokens(const json& root, BpeData& d) const {
        if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return;
        const json& arr = root["added_tokens"];
        if (!arr.is_array()) fail("added_tokens: expected an array");
        for (size_t i = 0; i < arr.size(); ++i) {
            const std::string where = "added_tokens[" + std::to_string(i) + "]";
            const json& t = arr[i];
            BpeAddedToken a;
            const json& id = member(t, "id", where);
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > 16'000'000)
                fail(where + ".id: expected an integer id >= 0");
            a.id = id.get<int>();
            a.content = str(member(t, "content", where), where + ".content");
            if (a.content.empty()) fail(where + ".content is empty");
            a.special = flag(t, "special", false, where);
            a.lstrip = flag(t, "lstrip", false, where);
            a.rstrip = flag(t, "rstrip", false, where);
            a.normalized = flag(t, "normalized", !a.special, where);
            if (flag(t, "single_word", false, where))
                fail(where + ".single_word: true is not supported (expected false)");
            d.added.push_back(std::move(a));
        }
    }

    void normalizer(const json& n, BpeData& d) const {
        if (n.is_null()) return;
        const std::string type = type_of(n, "normalizer");
        if (type == "Sequence") {
            const json& list = member(n, "normalizers", "normalizer");
            if (!list.is_array()) fail("normalizer.normalizers: expected an array");
            for (const auto& e : list) normalizer(e, d);
            return;
        }
        if (type == "NFC") {
            d.nfc = true;
            return;
        }
        fail("normalizer type \"" + type + "\" is not supported (expected null, NFC or a Sequence of NFC)");
    }

    SplitBehavior behavior(const json& v, const std::string& where) const {
        const std::string b = str(v, where);
        if (b == "Removed") return SplitBehavior::Removed;
        if (b == "Isolated") return SplitBehavior::Isolated;
        if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
        if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
        if (b == "Contiguous") return SplitBehavior::Contiguous;
        fail(where + " is \"" + b + "\", expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
    }

    void pre_tokenizer(const json& p, BpeData& d, const std::string& where) const {
        if (p.is_null()) return;
        const std::string type = type_of(p, where);
        BpePreStep step;
        if (type == "Sequence") {
            sequence(p, "pretokenizers", where, [&](const json& e, const std::string& w) { pre_tokenizer(e, d, w); });
            return;
        } else if (type == "ByteLevel") {
            step.kind = BpePreStep::Kind::ByteLevel;
            step.add_prefix_space = flag(p, "add_prefix_space", true, where);
            step.use_regex = flag(p, "use_regex", true, where);
        } else if (type == "Split") {
            step.kind = BpePreStep::Kind::Split;
            const json& pat = member(p, "pattern", where);
            if (pat.is_object() && pat.contains("Regex")) {
                step.regex = std::make_shared<BpeRegex>(str(pat["Regex"], where + ".pattern.Regex"),
                                                        name + ": " + where + ".pattern.Regex");
            } else if (pat.is_object() && pat.contains("String")) {
                step.literal = str(pat["String"], where + ".pattern.String");
            } else {
                fail(where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
            }
            step.behavior = behavior(member(p, "behavior", where), where + ".behavior");
            step.invert = flag(p, "invert", false, where);
        } else if (type == "Digits") {
            step.kind = BpePreStep::Kind::Digits;
            step.individual_digits = flag(p, "individual_digits", false, where);
            step.regex = std::make_shared<BpeRegex>(R"(\p{N})", "Digits pattern");
        } else {
            fail(where + " type \"" + type + "\" is not supported (expected ByteLevel, Split, Digits or Sequence)");
        }
        d.pre.push_back(std::move(step));
    }

    // Flattens the decoder into the one decoding mode the tokenizer implements.
    void decoder(const json& dec, std::set<std::string>& kinds, const std::string& where) const {
        const std::string type = type_of(dec, where);
        if (type == "Sequence") {
            sequence(dec, "decoders", where, [&](const json& e, const std::string& w) { decoder(e, kinds, w); });
            return;
        }
        if (type != "ByteLevel" && type != "ByteFallback" && type != "Fuse")
            fail(where + " type \"" + type +
                 "\" is not supported (expected ByteLevel, ByteFallback, Fuse or a Sequence of them)");
        kinds.insert(type);
    }

    int special_id(const BpeData& d, const std::string& content, const std::string& where) const {
        for (const auto& a : d.added)
            if (a.content == content) return a.id;
        for (size_t id = 0; id < d.vocab.size(); ++id)
            if (d.vocab[id] == content) return static_cast<int>(id);
        fail(where + " names \"" + content + "\", which is not in the vocabulary");
    }

    // Ids the post-processor adds around a single text.
    void post_processor(const json& p, BpeData& d, const std::string& where) const {
        if (p.is_null()) return;
        const std::string type = type_of(p, where);
        if (type == "ByteLevel") return;  // offsets only
        if (type == "Sequence") {
            sequence(p, "processors", where, [&](const json& e, const std::string& w) { post_processor(e, d, w); });
            return;
        }
        if (type == "TemplateProcessing") {
            const json& single = member(p, "single", where);
            if (!single.is_array()) fail(where + ".single: expected an array");
            const json& specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
            bool after = false;
            std::vector<int> prefix, suffix;
            for (size_t i = 0; i < single.size(); ++i) {
                const json& e = single[i];
                const std::string w = where + ".single[" + std::to_string(i) + "]";
                if (e.is_object() && e.contains("Sequence")) {
                    after = true;
                } else if (e.is_object() && e.contains("SpecialToken")) {
                    const std::string key = str(member(e["SpecialToken"], "id", w + ".SpecialToken"), w);
                    if (!specials.is_object() || !specials.contains(key))
                        fail(w + " names special token \"" + key + "\", which " + where + ".special_tokens lacks");
                    const json& ids = member(specials[key], "ids", where + ".special_tokens[\"" + key + "\"]");
                    if (!ids.is_array()) fail(where + ".special_tokens[\"" + key + "\"].ids: expected an array");
                    for (const auto& id : ids) {
                        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
                            id.get<int64_t>() >= static_cast<int64_t>(d.vocab.size()))
                            fail(where + ".special_tokens[\"" + key + "\"].ids: expected ids in the vocabulary");
                        (after ? suffix : prefix).push_back(id.get<int>());
                    }
                } else {
                    fail(w + ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
                }
            }
            d.prefix_ids.insert(d.prefix_ids.end(), prefix.begin(), prefix.end());
            d.suffix_ids.insert(d.suffix_ids.begin(), suffix.begin(), suffix.end());
            return;
        }
        if (type == "RobertaProcessing" || type == "BertProcessing") {
            auto token = [&](const char* key) {
                const json& v = member(p, key, where);
                if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
                    fail(where + "." + key + ": expected [\"token\", id]");
                return v[1].get<int>();
            };
            d.prefix_ids.push_back(token("cls"));
            d.suffix_ids.push_back(token("sep"));
            return;
        }
        fail(where + " type \"" + type + "\" is not supported (expected TemplateProcessing, ByteLevel, "
             "RobertaProcessing or a Sequence of them)");
    }
};

// bos_token / eos_token of tokenizer_config.json: a string, an AddedToken object ({"content": ...}) or null.
std::string config_token(const json& cfg, const char* key, const std::string& name) {
    if (!cfg.contains(key) || cfg[key].is_null()) return {};
    const json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    throw InputError(name + ": \"" + key + "\" expected a string or an object with \"content\"");
}

}  // namespace

BpeData parse_tokenizer_json(std::string_view text, const std::filesystem::path& file,
                             std::string_view tokenizer_config_json) {
    Parser p{"tokenizer file " + file.string()};
    json root;
    try {
        root = json::parse(text);
    } catch (const json::exception& e) {
        p.fail(std::string("not valid JSON (") + e.what() + ")");
    }
    if (!root.is_object()) p.fail("expected a JSON object (a Hugging Face tokenizer.json)");
    if (!root.contains("model") || root["model"].is_null())
        p.fail("no \"model\" section (expected a Hugging Face tokenizer.json with a BPE model)");

    BpeData d;
    d.file = file;
    std::vector<int> owner;  // [n] 1 where the model vocab has the id
    p.model(root["model"], d, owner);
    p.added_tokens(root, d);
    for (const auto& a : d.added)
        if (static_cast<size_t>(a.id) >= d.vocab.size()) d.vocab.resize(a.id + 1), owner.resize(a.id + 1, 0);
    for (const auto& a : d.added) owner[a.id] = 1;
    for (size_t id = 0; id < owner.size(); ++id)
        if (!owner[id])
            p.fail("vocabulary ids are not dense: id " + std::to_string(id) + " is neither in model.vocab nor in "
                   "added_tokens (expected every id from 0 to " + std::to_string(owner.size() - 1) + ")");
    if (d.vocab.empty()) p.fail("model.vocab is empty");

    p.normalizer(root.value("normalizer", json()), d);
    p.pre_tokenizer(root.value("pre_tokenizer", json()), d, "pre_tokenizer");
    if (!root.contains("decoder") || root["decoder"].is_null())
        p.fail("no \"decoder\" (expected ByteLevel, ByteFallback, Fuse or a Sequence of them)");
    std::set<std::string> kinds;
    p.decoder(root["decoder"], kinds, "decoder");
    if (kinds.count("ByteLevel") && kinds.count("ByteFallback"))
        p.fail("decoder: ByteLevel together with ByteFallback is not supported (expected one of them)");
    d.decoder = kinds.count("ByteFallback") ? BpeData::Decoder::ByteFallback : BpeData::Decoder::ByteLevel;
    if (!kinds.count("ByteLevel") && !kinds.count("ByteFallback"))
        p.fail("decoder: expected a ByteLevel or ByteFallback decoder (Fuse alone keeps the pieces as they are)");
    p.post_processor(root.value("post_processor", json()), d, "post_processor");

    if (!d.prefix_ids.empty()) d.bos = d.prefix_ids.front();
    std::string eos_name;
    if (!tokenizer_config_json.empty()) {
        const std::string cname = "tokenizer config " + (file.parent_path() / "tokenizer_config.json").string();
        json cfg;
        try {
            cfg = json::parse(tokenizer_config_json);
        } catch (const json::exception& e) {
            throw InputError(cname + ": not valid JSON (" + e.what() + ")");
        }
        if (!cfg.is_object()) throw InputError(cname + ": expected a JSON object");
        Parser cp{cname};
        const std::string bos = config_token(cfg, "bos_token", cname);
        eos_name = config_token(cfg, "eos_token", cname);
        if (!bos.empty()) d.bos = cp.special_id(d, bos, "bos_token");
        if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
            const bool add = cfg["add_bos_token"].get<bool>();
            const bool has = !d.prefix_ids.empty() && d.prefix_ids.front() == d.bos;
            if (add && d.bos >= 0 && !has) d.prefix_ids.insert(d.prefix_ids.begin(), d.bos);
            if (!add && has) d.prefix_ids.erase(d.prefix_ids.begin());
        }
        if (!eos_name.empty()) d.eos = cp.special_id(d, eos_name, "eos_token");
    }
    auto find = [&](std::string_view content) {
        for (const auto& a : d.added)
            if (a.content == content) return a.id;
        return -1;
    };
    if (d.eos < 0)
        for (const char* n : kEosNames)
            if ((d.eos = find(n)) >= 0) break;
    if (d.eos >= 0) d.end_of_turn.push_back(d.eos);
    for (const char* n : kEndOfTurnNames) {
        const int id = find(n);
        if (id >= 0 && std::find(d.end_of_turn.begin(), d.end_of_turn.end(), id) == d.end_of_turn.end())
            d.end_of_turn.push_back(id);
    }
    return d;
}

}  // namespace quest

// ---------------------------------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------------------------------

namespace quest {

namespace {

const char* behavior_name(SplitBehavior b) {
    switch (b) {
        case SplitBehavior::Removed: return "Removed";
        case SplitBehavior::Isolated: return "Isolated";
        case SplitBehavior::MergedWithPrevious: return "MergedWithPrevious";
        case SplitBehavior::MergedWithNext: return "MergedWithNext";
        case SplitBehavior::Contiguous: return "Contiguous";
    }
    return "Isolated";
}

nlohmann::ordered_json null_or(const std::string& s) { return s.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(s); }

}  // namespace

TokenizerJsonFiles write_tokenizer_json(const BpeData& d, const std::string& chat_template, int model_max_length) {
    using ojson = nlohmann::ordered_json;
    const std::string name = d.file.string();
    // The text of each id: an added token's content, else the model piece.
    std::vector<std::string> text(d.vocab);
    for (const auto& a : d.added)
        if (a.id >= 0 && static_cast<size_t>(a.id) < text.size()) text[a.id] = a.content;

    ojson vocab = ojson::object();
    {
        std::unordered_map<std::string_view, int> seen;
        for (size_t id = 0; id < d.vocab.size(); ++id) {
            if (d.vocab[id].empty()) continue;  // an id held only by an added token
            const auto [it, fresh] = seen.emplace(d.vocab[id], static_cast<int>(id));
            if (!fresh)
                throw InputError(name + ": piece \"" + d.vocab[id] + "\" has ids " + std::to_string(it->second) +
                                 " and " + std::to_string(id) +
                                 " (a tokenizer.json vocabulary maps each piece to one id)");
        }
        // In id order, as Hugging Face writes it.
        for (size_t id = 0; id < d.vocab.size(); ++id)
            if (!d.vocab[id].empty()) vocab[d.vocab[id]] = id;
    }
    ojson merges = ojson::array();
    for (const auto& [a, b] : d.merges) merges.push_back(ojson::array({a, b}));

    ojson added = ojson::array();
    for (const auto& a : d.added)
        added.push_back({{"id", a.id},
                         {"content", a.content},
                         {"single_word", false},
                         {"lstrip", a.lstrip},
                         {"rstrip", a.rstrip},
                         {"normalized", a.normalized},
                         {"special", a.special}});

    ojson pre = ojson::array();
    for (const auto& s : d.pre) {
        switch (s.kind) {
            case BpePreStep::Kind::Split: {
                ojson pattern = s.regex ? ojson{{"Regex", s.regex->pattern()}} : ojson{{"String", s.literal}};
                pre.push_back({{"type", "Split"},
                               {"pattern", pattern},
                               {"behavior", behavior_name(s.behavior)},
                               {"invert", s.invert}});
                break;
            }
            case BpePreStep::Kind::ByteLevel:
                pre.push_back({{"type", "ByteLevel"},
                               {"add_prefix_space", s.add_prefix_space},
                               {"trim_offsets", true},
                               {"use_regex", s.use_regex}});
                break;
            case BpePreStep::Kind::Digits:
                pre.push_back({{"type", "Digits"}, {"individual_digits", s.individual_digits}});
                break;
        }
    }

    ojson post;  // null: nothing added around a text
    if (!d.prefix_ids.empty() || !d.suffix_ids.empty()) {
        ojson single = ojson::array(), pair = ojson::array(), specials = ojson::object();
        auto special = [&](int id) {
            if (id < 0 || static_cast<size_t>(id) >= text.size())
                throw InputError(name + ": post-processor id " + std::to_string(id) + " outside the vocabulary");
            specials[text[id]] = {{"id", text[id]}, {"ids", {id}}, {"tokens", {text[id]}}};
            return ojson{{"SpecialToken", {{"id", text[id]}, {"type_id", 0}}}};
        };
        for (int id : d.prefix_ids) single.push_back(special(id));
        single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
        for (int id : d.suffix_ids) single.push_back(special(id));
        for (const auto& e : single) pair.push_back(e);
        for (int id : d.prefix_ids) pair.push_back(special(id));
        pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
        for (int id : d.suffix_ids) pair.push_back(special(id));
        post = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
    }

    ojson decoder = d.decoder == BpeData::Decoder::ByteLevel
                        ? ojson{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                {"use_regex", true}}
                        : ojson{{"type", "Sequence"},
                                {"decoders", ojson::array({ojson{{"type", "ByteFallback"}}, ojson{{"type", "Fuse"}}})}};

    ojson root;
    root["version"] = "1.0";
    root["truncation"] = nullptr;
    root["padding"] = nullptr;
    root["added_tokens"] = added;
    root["normalizer"] = d.nfc ? ojson{{"type", "NFC"}} : ojson();
    root["pre_tokenizer"] = pre.empty() ? ojson() : ojson{{"type", "Sequence"}, {"pretokenizers", pre}};
    root["post_processor"] = post;
    root["decoder"] = decoder;
    root["model"] = {{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", null_or(d.unk_token)},
                     {"continuing_subword_prefix", null_or(d.continuing_subword_prefix)},
                     {"end_of_word_suffix", null_or(d.end_of_word_suffix)},
                     {"fuse_unk", d.fuse_unk},
                     {"byte_fallback", d.byte_fallback},
                     {"ignore_merges", d.ignore_merges},
                     {"vocab", vocab},
                     {"merges", merges}};

    auto token_text = [&](int id) { return id >= 0 && static_cast<size_t>(id) < text.size() ? ojson(text[id]) : ojson(); };
    ojson cfg;
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
    cfg["bos_token"] = token_text(d.bos);
    cfg["eos_token"] = token_text(d.eos);
    cfg["clean_up_tokenization_spaces"] = false;
    if (model_max_length > 0) cfg["model_max_length"] = model_max_length;
    if (!chat_template.empty()) cfg["chat_template"] = chat_template;
    try {
        return {root.dump(1) + "\n", cfg.dump(2) + "\n"};
    } catch (const nlohmann::json::exception& e) {
        throw InputError(name + ": a piece or the chat template is not valid UTF-8 (" + e.what() + ")");
    }
}

}  // namespace quest
