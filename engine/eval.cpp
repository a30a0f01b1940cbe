#include "engine/eval.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "engine/sampler.h"
#include "model/error.h"
#include "model/llama_cpu.h"

namespace quest {

namespace {

const char* kTask =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about "
    "the important information there.";
const char* kFiller = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const char* kQuestion = " What is the pass key? The pass key is";

void enable_diagnostics(Backend& b, bool on) {
    if (!on) return;
    auto* cpu = dynamic_cast<CpuLlama*>(&b);
    if (!cpu) throw InputError("--diagnostics: the selection diagnostics need --backend cpu (the reference backend)");
    cpu->set_selection_diagnostics(true);
}

// Adds the backend's diagnostics (if on) into `acc` as sums over steps.
void collect(const Backend& b, SelectionSummary& acc) {
    const auto* cpu = dynamic_cast<const CpuLlama*>(&b);
    if (!cpu) return;
    const SelectionDiagnostics& d = cpu->selection_diagnostics();
    if (d.steps.empty()) return;
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
    const auto* cpu = dynamic_cast<const CpuLlama*>(&b);
    return cpu ? cpu->selection_diagnostics().steps : std::vector<int>{};
}

void add_steps(std::vector<int>& total, const std::vector<int>& s) {
    if (total.empty()) total.assign(s.size(), 0);
    for (size_t i = 0; i < s.size(); ++i) total[i] += s[i];
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
            Sampler greedy({0.0f, 0, 1.0f, 0});
            for (size_t i = 0; i < prompts.size(); ++i) {
                const PasskeyPrompt& p = prompts[i];
                backend->reset();
                if (r.diagnostics) dynamic_cast<CpuLlama&>(*backend).set_selection_diagnostics(true);
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
                              ctx, budget ? ("B=" + std::to_string(budget)).c_str() : "full", depths[i], p.key,
                              shown.c_str(), ok ? "ok" : "WRONG");
                progress(sample_line);
                row.depths_percent.push_back(depths[i]);
                row.ok.push_back(ok);
                collect(*backend, row.selection);
                add_steps(steps_total, steps_of(*backend));
            }
            finish(row.selection, steps_total);
            char line[200];
            std::snprintf(line, sizeof line, "passkey context %d %s: %d/%d", ctx,
                          budget ? ("B=" + std::to_string(budget)).c_str() : "full", row.correct, row.samples);
            progress(line);
            rows.push_back(std::move(row));
        }
    }
    return rows;
}

double PplRow::ppl() const { return std::exp(nll); }

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
    std::vector<PplRow> rows;
    for (int budget : r.budgets) {
        auto backend = make(settings_for(r.base, budget), static_cast<int>(ids.size()));
        enable_diagnostics(*backend, r.diagnostics);
        std::span<const float> logits = backend->prefill(std::span<const int>(ids.data(), window));
        PplRow row;
        row.budget = budget;
        double nll = 0;
        for (size_t t = window; t < ids.size(); ++t) {
            // log softmax of the target, in double
            const float mx = *std::max_element(logits.begin(), logits.end());
            double z = 0;
            for (float l : logits) z += std::exp(static_cast<double>(l) - mx);
            nll -= static_cast<double>(logits[ids[t]]) - mx - std::log(z);
            ++row.tokens;
            if (t + 1 < ids.size()) logits = backend->decode(ids[t]);
        }
        row.nll = nll / row.tokens;
        collect(*backend, row.selection);
        finish(row.selection, steps_of(*backend));
        char line[160];
        std::snprintf(line, sizeof line, "ppl %s: %.4f over %d tokens after a %d-token window",
                      budget ? ("B=" + std::to_string(budget)).c_str() : "full", row.ppl(), row.tokens, window);
        progress(line);
        rows.push_back(std::move(row));
    }
    return rows;
}

std::string passkey_table(const std::vector<PasskeyRow>& rows) {
    std::ostringstream o;
    char buf[200];
    std::snprintf(buf, sizeof buf, "%8s %7s %8s %9s %14s %12s\n", "context", "budget", "correct", "accuracy",
                  "selected_mass", "oracle_mass");
    o << buf;
    for (const auto& r : rows) {
        std::snprintf(buf, sizeof buf, "%8d %7s %4d/%-3d %8.0f%% %14s %12s\n", r.context,
                      r.budget ? std::to_string(r.budget).c_str() : "full", r.correct, r.samples, 100 * r.accuracy(),
                      r.selection.valid ? std::to_string(r.selection.selected_mass).substr(0, 6).c_str() : "-",
                      r.selection.valid ? std::to_string(r.selection.oracle_mass).substr(0, 6).c_str() : "-");
        o << buf;
    }
    return o.str();
}

std::string passkey_json(const std::vector<PasskeyRow>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rows)
        a.push_back({{"context", r.context},
                     {"budget", r.budget ? nlohmann::json(r.budget) : nlohmann::json("full")},
                     {"samples", r.samples},
                     {"correct", r.correct},
                     {"accuracy", r.accuracy()},
                     {"depths_percent", r.depths_percent},
                     {"ok", r.ok},
                     {"selection", selection_json(r.selection)}});
    return a.dump(2) + "\n";
}

std::string ppl_table(const std::vector<PplRow>& rows) {
    std::ostringstream o;
    char buf[200];
    std::snprintf(buf, sizeof buf, "%7s %8s %10s %12s %14s %12s\n", "budget", "tokens", "nll", "perplexity",
                  "selected_mass", "oracle_mass");
    o << buf;
    for (const auto& r : rows) {
        std::snprintf(buf, sizeof buf, "%7s %8d %10.5f %12.4f %14s %12s\n",
                      r.budget ? std::to_string(r.budget).c_str() : "full", r.tokens, r.nll, r.ppl(),
                      r.selection.valid ? std::to_string(r.selection.selected_mass).substr(0, 6).c_str() : "-",
                      r.selection.valid ? std::to_string(r.selection.oracle_mass).substr(0, 6).c_str() : "-");
        o << buf;
    }
    return o.str();
}

std::string ppl_json(const std::vector<PplRow>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rows)
        a.push_back({{"budget", r.budget ? nlohmann::json(r.budget) : nlohmann::json("full")},
                     {"tokens", r.tokens},
                     {"nll", r.nll},
                     {"perplexity", r.ppl()},
                     {"selection", selection_json(r.selection)}});
    return a.dump(2) + "\n";
}

}  // namespace quest
