#include "engine/eval.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "engine/sampler.h"
#include "model/io/atomic_file.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"

namespace quest {

namespace {

const char* kTask =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about "
    "the important information there.";
const char* kFiller = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const char* kQuestion = " What is the pass key? The pass key is";

void enable_diagnostics(Backend& b, bool on) {
    if (!on) return;
    if (!b.set_selection_diagnostics(true))
        throw InputError("--diagnostics: the " + b.name() + " backend computes no selection diagnostics (--backend cpu does)");
}

// Adds the backend's diagnostics (if on) into `acc` as sums over steps.
void collect(const Backend& b, SelectionSummary& acc) {
    const SelectionDiagnostics* diag = b.selection_diagnostics();
    if (!diag || diag->steps.empty()) return;
    const SelectionDiagnostics& d = *diag;
    if (acc.per_layer_head_selected.empty()) {
        acc.per_layer_head_selected.assign(d.selected_mass.size(), std::vector<double>(d.selected_mass[0].size(), 0.0));
        acc.per_layer_head_oracle = acc.per_layer_head_selected;
    }
    for (size_t l = 0; l < d.steps.size(); ++l)
        for (size_t h = 0; h < d.selected_mass[l].size(); ++h) {
            acc.per_layer_head_selected[l][h] += d.selected_mass[l][h];
            acc.per_layer_head_oracle[l][h] += d.oracle_mass[l][h];
        }
    for (size_t l = 0; l < d.steps.size(); ++l) acc.steps += d.steps[l];
    acc.valid = true;
}

// Sums -> means (over the steps of each layer and over every layer/head for the headline figures).
void finish(SelectionSummary& s, const std::vector<int>& steps_per_layer) {
    if (!s.valid) return;
    double sel = 0, ora = 0;
    int n = 0;
    for (size_t l = 0; l < s.per_layer_head_selected.size(); ++l) {
        const int st = steps_per_layer[l];
        for (size_t h = 0; h < s.per_layer_head_selected[l].size(); ++h) {
            if (st > 0) {
                s.per_layer_head_selected[l][h] /= st;
                s.per_layer_head_oracle[l][h] /= st;
                sel += s.per_layer_head_selected[l][h];
                ora += s.per_layer_head_oracle[l][h];
                ++n;
            }
        }
    }
    if (n) {
        s.selected_mass = sel / n;
        s.oracle_mass = ora / n;
    } else {
        s.valid = false;  // nothing was selected (full attention, or every step dense)
    }
}

std::vector<int> steps_of(const Backend& b) {
    const SelectionDiagnostics* d = b.selection_diagnostics();
    return d ? d->steps : std::vector<int>{};
}

void add_steps(std::vector<int>& total, const std::vector<int>& s) {
    if (total.empty()) total.assign(s.size(), 0);
    for (size_t i = 0; i < s.size(); ++i) total[i] += s[i];
}

// Adds the backend's read counters into `acc` (sums; bytes_finish turns them into means).
void bytes_collect(const Backend& b, ReadStats& acc) {
    const ReadStats* counted = b.read_stats();
    if (!counted) return;
    const ReadStats& r = *counted;
    acc.steps += r.steps;
    acc.quest_layer_bytes += r.quest_layer_bytes;
    acc.metadata_bytes += r.metadata_bytes;
    acc.dense_layer_bytes += r.dense_layer_bytes;
    acc.selecting_steps += r.selecting_steps;
    acc.selecting_rows += r.selecting_rows;
    acc.selected_tokens += r.selected_tokens;
    acc.reused_steps += r.reused_steps;
}

BytesSummary bytes_finish(const ReadStats& r) {
    BytesSummary b;
    b.valid = r.steps > 0;
    b.bytes_per_step = r.bytes_per_step();
    b.quest_bytes_per_step = r.quest_bytes_per_step();
    b.metadata_bytes_per_step = r.metadata_bytes_per_step();
    b.tokens_per_row = r.tokens_per_row();
    b.reused_fraction = r.selecting_steps ? double(r.reused_steps) / r.selecting_steps : 0.0;
    b.steps = r.steps;
    return b;
}

void reset_reads(Backend& b) {
    b.reset_read_stats();
}

nlohmann::json bytes_json(const BytesSummary& b) {
    if (!b.valid) return nullptr;
    return {{"bytes_per_step", b.bytes_per_step},
            {"quest_layer_bytes_per_step", b.quest_bytes_per_step},
            {"metadata_bytes_per_step", b.metadata_bytes_per_step},
            {"kv_tokens_per_row", b.tokens_per_row},
            {"reused_fraction", b.reused_fraction},
            {"steps", b.steps}};
}

// A row's budget in the tables ("full": no Quest), in the progress lines ("B=<budget>") and in the JSON.
std::string budget_label(int budget) { return budget ? std::to_string(budget) : "full"; }
std::string budget_tag(int budget) { return budget ? "B=" + std::to_string(budget) : "full"; }
nlohmann::json budget_json(int budget) { return budget ? nlohmann::json(budget) : nlohmann::json("full"); }

// An attention-mass column of the tables: its first six characters, "-" without a selection summary.
std::string mass_text(const SelectionSummary& s, double mass) {
    return s.valid ? std::to_string(mass).substr(0, 6) : "-";
}

std::string kib(const BytesSummary& b, double v) {
    if (!b.valid) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v / 1024.0);
    return buf;
}

QuestSettings settings_for(const QuestSettings& base, int budget) {
    QuestSettings q = base;
    q.full_attention = budget == 0;
    if (budget) q.budget = budget;
    q.validate();
    return q;
}

nlohmann::json selection_json(const SelectionSummary& s) {
    if (!s.valid) return nullptr;
    return {{"selected_mass", s.selected_mass},
            {"oracle_mass", s.oracle_mass},
            {"steps", s.steps},
            {"per_layer_head_selected", s.per_layer_head_selected},
            {"per_layer_head_oracle", s.per_layer_head_oracle}};
}

}  // namespace

PasskeyPrompt make_passkey_prompt(const Tokenizer& tok, int context, double depth, int key) {
    const std::vector<int> task = tok.encode(kTask, /*add_bos=*/true);
    const std::vector<int> filler = tok.encode(kFiller, false);
    const std::string k = std::to_string(key);
    const std::vector<int> needle = tok.encode(" The pass key is " + k + ". Remember it. " + k + " is the pass key.", false);
    const std::vector<int> question = tok.encode(kQuestion, false);
    const int fixed = static_cast<int>(task.size() + needle.size() + question.size());
    const int n_fill = std::max(0, (context - fixed) / static_cast<int>(filler.size()));
    const int before = static_cast<int>(std::lround(depth * n_fill));
    PasskeyPrompt p;
    p.key = key;
    p.prefill = task;
    for (int i = 0; i < before; ++i) p.prefill.insert(p.prefill.end(), filler.begin(), filler.end());
    p.prefill.insert(p.prefill.end(), needle.begin(), needle.end());
    for (int i = before; i < n_fill; ++i) p.prefill.insert(p.prefill.end(), filler.begin(), filler.end());
    p.question = question;
    return p;
}

std::vector<PasskeyRow> run_passkey(const BackendMaker& make, const Tokenizer& tok, const PasskeyRequest& r,
                                    const std::function<void(const std::string&)>& progress) {
    if (r.contexts.empty() || r.budgets.empty() || r.samples < 1)
        throw InputError("eval passkey: --contexts, --budgets and --samples must be non-empty / >= 1");
    constexpr int kAnswerTokens = 8;
    std::vector<PasskeyRow> rows;
    for (int ctx : r.contexts) {
        // The same keys and depths for every budget.
        std::mt19937 rng(static_cast<uint32_t>(r.seed + ctx));
        std::uniform_int_distribution<int> key_dist(10000, 99999);
        std::vector<PasskeyPrompt> prompts;
        std::vector<int> depths;
        for (int i = 0; i < r.samples; ++i) {
            const double depth = r.samples == 1 ? 0.5 : static_cast<double>(i) / (r.samples - 1);
            prompts.push_back(make_passkey_prompt(tok, ctx, depth, key_dist(rng)));
            depths.push_back(static_cast<int>(std::lround(depth * 100)));
        }
        int capacity = 0;
        for (const auto& p : prompts)
            capacity = std::max<int>(capacity, static_cast<int>(p.prefill.size() + p.question.size()) + kAnswerTokens);
        for (int budget : r.budgets) {
            const QuestSettings q = settings_for(r.base, budget);
            auto backend = make(q, capacity);
            enable_diagnostics(*backend, r.diagnostics);
            PasskeyRow row;
            row.context = ctx;
            row.budget = budget;
            std::vector<int> steps_total;
            ReadStats reads;
            Sampler greedy({0.0f, 0, 1.0f, 0});
            for (size_t i = 0; i < prompts.size(); ++i) {
                const PasskeyPrompt& p = prompts[i];
                backend->reset();
                reset_reads(*backend);
                if (r.diagnostics) backend->set_selection_diagnostics(true);
                std::span<const float> logits = backend->prefill(p.prefill);
                for (int t : p.question) logits = backend->decode(t);  // one by one: Quest selects for each
                std::string answer;
                for (int s = 0; s < kAnswerTokens; ++s) {
                    const int t = greedy.sample(logits);
                    if (backend->config().is_eos(t)) break;
                    const std::vector<int> one = {t};
                    answer += tok.decode(one);
                    if (answer.find_first_of("\n.") != std::string::npos) break;
                    if (s + 1 < kAnswerTokens) logits = backend->decode(t);
                }
                std::string digits;
                for (char ch : answer)
                    if (std::isdigit(static_cast<unsigned char>(ch))) digits += ch;
                    else if (!digits.empty()) break;
                const bool ok = !digits.empty() && digits.size() < 10 && std::stoi(digits) == p.key;
                row.samples++;
                row.correct += ok;
                std::string shown = answer.substr(0, answer.find_first_of("\n"));
                char sample_line[240];
                std::snprintf(sample_line, sizeof sample_line, "  context %d %s, key at depth %d%%: %d -> \"%s\" %s",
                              ctx, budget_tag(budget).c_str(), depths[i], p.key,
                              shown.c_str(), ok ? "ok" : "WRONG");
                progress(sample_line);
                row.depths_percent.push_back(depths[i]);
                row.ok.push_back(ok);
                collect(*backend, row.selection);
                add_steps(steps_total, steps_of(*backend));
                bytes_collect(*backend, reads);
            }
            finish(row.selection, steps_total);
            row.bytes = bytes_finish(reads);
            char line[200];
            std::snprintf(line, sizeof line, "passkey context %d %s: %d/%d", ctx,
                          budget_tag(budget).c_str(), row.correct, row.samples);
            progress(line);
            rows.push_back(std::move(row));
        }
    }
    return rows;
}

double PplRow::ppl() const { return std::exp(nll); }

namespace {

std::string rows_label(const PplRequest& r) { return r.label.empty() ? std::string("main") : r.label; }

// log softmax of `logits` in double.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (float l : logits) z += std::exp(static_cast<double>(l) - mx);
    const double lz = std::log(z);
    out.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - mx - lz;
}

}  // namespace

std::vector<PplRow> run_ppl(const BackendMaker& make, const Tokenizer& tok, const PplRequest& r,
                            const std::function<void(const std::string&)>& progress) {
    std::ifstream in(r.text_file, std::ios::binary);
    if (!in) throw InputError(r.text_file + ": cannot open (--text)");
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    std::vector<int> ids = tok.encode(text, /*add_bos=*/true);
    if (r.max_tokens > 0 && static_cast<int>(ids.size()) > r.max_tokens) ids.resize(r.max_tokens);
    const int window = r.window > 0 ? r.window : std::min<int>(1024, static_cast<int>(ids.size()) / 2);
    if (window < 1 || window + 1 >= static_cast<int>(ids.size()))
        throw InputError(r.text_file + ": the text has " + std::to_string(ids.size()) +
                         " tokens, too few for a window of " + std::to_string(window) + " plus scored tokens");
    const size_t n_models = 1 + r.compare.size();
    std::vector<PplRow> rows;
    for (int budget : r.budgets) {
        const QuestSettings q = settings_for(r.base, budget);
        std::vector<std::unique_ptr<Backend>> backends;
        backends.push_back(make(q, static_cast<int>(ids.size())));
        for (const PplModel& m : r.compare) backends.push_back(m.make(q, static_cast<int>(ids.size())));
        std::vector<std::span<const float>> logits;
        for (auto& b : backends) {
            enable_diagnostics(*b, r.diagnostics);
            logits.push_back(b->prefill(std::span<const int>(ids.data(), window)));
            if (logits.back().size() != logits.front().size())
                throw InputError("eval ppl: the models' vocabularies differ (" + std::to_string(logits.front().size()) +
                                 " and " + std::to_string(logits.back().size()) + " logits)");
        }
        std::vector<double> nll(n_models, 0.0), kl(n_models, 0.0);
        std::vector<double> lp0, lp;
        int scored = 0;
        for (size_t t = window; t < ids.size(); ++t) {
            log_softmax(logits[0], lp0);
            nll[0] -= lp0[ids[t]];
            for (size_t k = 1; k < n_models; ++k) {
                log_softmax(logits[k], lp);
                nll[k] -= lp[ids[t]];
                double d = 0;
                for (size_t i = 0; i < lp.size(); ++i) d += std::exp(lp0[i]) * (lp0[i] - lp[i]);
                kl[k] += d;
            }
            ++scored;
            if (t + 1 < ids.size())
                for (size_t k = 0; k < n_models; ++k) logits[k] = backends[k]->decode(ids[t]);
        }
        for (size_t k = 0; k < n_models; ++k) {
            PplRow row;
            row.budget = budget;
            row.tokens = scored;
            row.nll = nll[k] / scored;
            if (!r.compare.empty()) {
                row.model = k == 0 ? rows_label(r) : r.compare[k - 1].label;
                row.kl = kl[k] / scored;
            }
            ReadStats reads;
            bytes_collect(*backends[k], reads);
            row.bytes = bytes_finish(reads);
            collect(*backends[k], row.selection);
            finish(row.selection, steps_of(*backends[k]));
            char line[400];
            std::snprintf(line, sizeof line, "ppl %s%s%s: %.4f over %d tokens after a %d-token window",
                          budget_tag(budget).c_str(), row.model.empty() ? "" : " ",
                          row.model.c_str(), row.ppl(), row.tokens, window);
            std::string said = line;
            if (row.kl >= 0) said += ", KL from " + rows_label(r) + " " + std::to_string(row.kl);
            progress(said);
            rows.push_back(std::move(row));
        }
    }
    return rows;
}

// The last columns of the passkey and ppl tables: bytes read per step (all layers, Quest layers) and the attention
// mass the selection kept; then the end of the line.
std::string reads_header() {
    char buf[100];
    std::snprintf(buf, sizeof buf, "%10s %10s %14s %12s\n", "KiB/step", "quest_KiB", "selected_mass", "oracle_mass");
    return buf;
}
std::string reads_columns(const BytesSummary& b, const SelectionSummary& s) {
    char buf[100];
    std::snprintf(buf, sizeof buf, "%10s %10s %14s %12s\n", kib(b, b.bytes_per_step).c_str(),
                  kib(b, b.quest_bytes_per_step).c_str(), mass_text(s, s.selected_mass).c_str(),
                  mass_text(s, s.oracle_mass).c_str());
    return buf;
}

std::string passkey_table(const std::vector<PasskeyRow>& rows) {
    std::ostringstream o;
    char buf[200];
    std::snprintf(buf, sizeof buf, "%8s %7s %8s %9s ", "context", "budget", "correct", "accuracy");
    o << buf << reads_header();
    for (const auto& r : rows) {
        std::snprintf(buf, sizeof buf, "%8d %7s %4d/%-3d %8.0f%% ", r.context, budget_label(r.budget).c_str(), r.correct,
                      r.samples, 100 * r.accuracy());
        o << buf << reads_columns(r.bytes, r.selection);
    }
    return o.str();
}

std::string passkey_json(const std::vector<PasskeyRow>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rows)
        a.push_back({{"context", r.context},
                     {"budget", budget_json(r.budget)},
                     {"samples", r.samples},
                     {"correct", r.correct},
                     {"accuracy", r.accuracy()},
                     {"depths_percent", r.depths_percent},
                     {"ok", r.ok},
                     {"bytes", bytes_json(r.bytes)},
                     {"selection", selection_json(r.selection)}});
    return a.dump(2) + "\n";
}

std::string ppl_table(const std::vector<PplRow>& rows) {
    std::ostringstream o;
    char buf[400];
    const bool models = !rows.empty() && !rows.front().model.empty();
    if (models) std::snprintf(buf, sizeof buf, "%-24s %10s ", "model", "kl");
    if (models) o << buf;
    std::snprintf(buf, sizeof buf, "%7s %8s %10s %12s ", "budget", "tokens", "nll", "perplexity");
    o << buf << reads_header();
    for (const auto& r : rows) {
        if (models) std::snprintf(buf, sizeof buf, "%-24s %10.6f ", r.model.c_str(), r.kl);
        if (models) o << buf;
        std::snprintf(buf, sizeof buf, "%7s %8d %10.5f %12.4f ", budget_label(r.budget).c_str(), r.tokens, r.nll,
                      r.ppl());
        o << buf << reads_columns(r.bytes, r.selection);
    }
    return o.str();
}

std::string ppl_json(const std::vector<PplRow>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rows)
        a.push_back({{"budget", budget_json(r.budget)},
                     {"tokens", r.tokens},
                     {"nll", r.nll},
                     {"perplexity", r.ppl()},
                     {"model", r.model.empty() ? nlohmann::json() : nlohmann::json(r.model)},
                     {"kl", r.kl >= 0 ? nlohmann::json(r.kl) : nlohmann::json()},
                     {"bytes", bytes_json(r.bytes)},
                     {"selection", selection_json(r.selection)}});
    return a.dump(2) + "\n";
}

// ---------------------------------------------------------------- JSONL retrieval sets

std::vector<JsonlPrompt> load_jsonl_set(const std::string& path, int max_samples) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(path + ": cannot open (--set)");
    std::vector<JsonlPrompt> out;
    std::string line;
    int n = 0;
    auto ids = [&](const nlohmann::json& j, const char* key) {
        if (!j.contains(key) || !j[key].is_array()) throw InputError(path + ":" + std::to_string(n) + ": no '" + key + "' array");
        std::vector<int> v;
        for (const auto& x : j[key]) {
            if (!x.is_number_integer()) throw InputError(path + ":" + std::to_string(n) + ": '" + key + "' holds a non-integer");
            v.push_back(x.get<int>());
        }
        return v;
    };
    while (std::getline(in, line)) {
        ++n;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        if (max_samples > 0 && static_cast<int>(out.size()) >= max_samples) break;
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            throw InputError(path + ":" + std::to_string(n) + ": not valid JSON: " + e.what());
        }
        JsonlPrompt p;
        p.id = j.value("id", std::to_string(n));
        p.context = j.value("context", 0);
        p.prefill = ids(j, "prefill_ids");
        p.question = ids(j, "question_ids");
        if (!j.contains("answer") || !j["answer"].is_string()) throw InputError(path + ":" + std::to_string(n) + ": no 'answer' string");
        p.answer = j["answer"].get<std::string>();
        if (p.prefill.empty() || p.question.empty() || p.answer.empty() ||
            p.answer.find_first_not_of("0123456789") != std::string::npos || p.answer.size() > 18)
            throw InputError(path + ":" + std::to_string(n) + ": empty prefill/question or an answer that is not digits");
        out.push_back(std::move(p));
    }
    if (out.empty()) throw InputError(path + ": no prompts");
    return out;
}

PolicySpec parse_policy_spec(const std::string& spec, const QuestSettings& base) {
    return PolicySpec{spec, parse_policy(spec, base)};  // the syntax: quest_settings_table()'s tokens
}

namespace {

// Greedy answer of at most 8 tokens from `logits` on, up to the first '.' or newline; true when its first integer
// equals `answer`.
bool answer_matches(Backend& b, const Tokenizer& tok, std::span<const float> logits, const std::string& answer) {
    constexpr int kAnswerTokens = 8;
    Sampler greedy({0.0f, 0, 1.0f, 0});
    std::string text;
    for (int s = 0; s < kAnswerTokens; ++s) {
        const int t = greedy.sample(logits);
        if (b.config().is_eos(t)) break;
        const std::vector<int> one = {t};
        text += tok.decode(one);
        if (text.find_first_of("\n.") != std::string::npos) break;
        if (s + 1 < kAnswerTokens) logits = b.decode(t);
    }
    std::string digits;
    for (char ch : text)
        if (std::isdigit(static_cast<unsigned char>(ch))) digits += ch;
        else if (!digits.empty()) break;
    auto strip = [](const std::string& d) {
        const size_t i = d.find_first_not_of('0');
        return i == std::string::npos ? std::string("0") : d.substr(i);
    };
    return !digits.empty() && strip(digits) == strip(answer);
}

}  // namespace

std::vector<JsonlRow> run_jsonl(const BackendMaker& make, const Tokenizer& tok, const JsonlRequest& r,
                                const std::function<void(const std::string&)>& progress) {
    if (r.budgets.empty()) throw InputError("eval jsonl: --budgets must not be empty");
    const std::vector<JsonlPrompt> prompts = load_jsonl_set(r.set, r.samples);
    constexpr int kAnswerTokens = 8;
    int capacity = 0;
    for (const auto& p : prompts)
        capacity = std::max<int>(capacity, static_cast<int>(p.prefill.size() + p.question.size()) + kAnswerTokens);
    // The configurations: full attention once, then every (policy, budget).
    struct Config {
        JsonlRow row;
        QuestSettings settings;
        std::unique_ptr<Backend> backend;
        std::vector<int> steps_total;
        ReadStats reads;
    };
    std::vector<Config> configs;
    const std::vector<std::string> policies = r.policies.empty() ? std::vector<std::string>{"quest"} : r.policies;
    for (int budget : r.budgets) {
        if (budget == 0) {
            Config c;
            c.row.policy = "full";
            c.settings = settings_for(r.base, 0);
            configs.push_back(std::move(c));
            continue;
        }
        for (const std::string& spec : policies) {
            Config c;
            const PolicySpec ps = parse_policy_spec(spec, r.base);
            c.row.policy = ps.label;
            c.row.budget = budget;
            c.settings = settings_for(ps.settings, budget);
            configs.push_back(std::move(c));
        }
    }
    for (Config& c : configs) {
        c.backend = make(c.settings, capacity);
        enable_diagnostics(*c.backend, r.diagnostics);
        c.row.page_size = c.settings.page_size;
    }
    // The shared prefill: a full-attention CPU backend whose cache every CPU configuration copies.
    std::unique_ptr<Backend> base = make(settings_for(r.base, 0), capacity);
    std::vector<JsonlRow> rows;
    for (size_t i = 0; i < prompts.size(); ++i) {
        const JsonlPrompt& p = prompts[i];
        base->reset();
        std::span<const float> base_logits = base->prefill(p.prefill);
        const std::vector<float> prefill_logits(base_logits.begin(), base_logits.end());
        std::string line = "prompt " + std::to_string(i + 1) + "/" + std::to_string(prompts.size()) + " " + p.id + ":";
        for (Config& c : configs) {
            Backend& b = *c.backend;
            b.reset();
            if (r.diagnostics) b.set_selection_diagnostics(true);
            reset_reads(b);
            std::span<const float> logits;
            if (b.copy_cache_from(*base)) {
                logits = prefill_logits;
            } else {
                logits = b.prefill(p.prefill);
            }
            for (int t : p.question) logits = b.decode(t);
            const bool ok = answer_matches(b, tok, logits, p.answer);
            c.row.context = p.context;
            c.row.samples++;
            c.row.correct += ok;
            c.row.ids.push_back(p.id);
            c.row.ok.push_back(ok);
            collect(b, c.row.selection);
            add_steps(c.steps_total, steps_of(b));
            bytes_collect(b, c.reads);
            line += " " + std::string(ok ? "+" : "-");
        }
        progress(line);
        if (!r.partial_json.empty() || i + 1 == prompts.size()) {
            rows.clear();
            for (const Config& c : configs) {
                JsonlRow row = c.row;
                finish(row.selection, c.steps_total);
                row.bytes = bytes_finish(c.reads);
                rows.push_back(std::move(row));
            }
            if (!r.partial_json.empty()) write_file_atomic(r.partial_json, jsonl_json(rows));
        }
    }
    return rows;
}

std::string jsonl_table(const std::vector<JsonlRow>& rows) {
    std::ostringstream o;
    char buf[300];
    std::snprintf(buf, sizeof buf, "%8s %-24s %7s %8s %9s %10s %10s %10s %11s %14s %12s\n", "context", "policy", "budget",
                  "correct", "accuracy", "KiB/step", "quest_KiB", "meta_KiB", "tokens/row", "selected_mass",
                  "oracle_mass");
    o << buf;
    for (const auto& r : rows) {
        char tok[32] = "-";
        if (r.bytes.valid && r.bytes.tokens_per_row > 0) std::snprintf(tok, sizeof tok, "%.1f", r.bytes.tokens_per_row);
        std::snprintf(buf, sizeof buf, "%8d %-24s %7s %4d/%-3d %8.0f%% %10s %10s %10s %11s %14s %12s\n", r.context,
                      r.policy.c_str(), budget_label(r.budget).c_str(), r.correct, r.samples,
                      100 * r.accuracy(), kib(r.bytes, r.bytes.bytes_per_step).c_str(),
                      kib(r.bytes, r.bytes.quest_bytes_per_step).c_str(),
                      kib(r.bytes, r.bytes.metadata_bytes_per_step).c_str(), tok,
                      mass_text(r.selection, r.selection.selected_mass).c_str(),
                      mass_text(r.selection, r.selection.oracle_mass).c_str());
        o << buf;
    }
    return o.str();
}

std::string jsonl_json(const std::vector<JsonlRow>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rows)
        a.push_back({{"context", r.context},
                     {"policy", r.policy},
                     {"budget", budget_json(r.budget)},
                     {"page_size", r.page_size},
                     {"samples", r.samples},
                     {"correct", r.correct},
                     {"accuracy", r.accuracy()},
                     {"ids", r.ids},
                     {"ok", r.ok},
                     {"bytes", bytes_json(r.bytes)},
                     {"selection", selection_json(r.selection)}});
    return a.dump(2) + "\n";
}

}  // namespace quest
