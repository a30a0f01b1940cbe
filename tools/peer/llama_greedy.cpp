// llama.cpp's greedy decoding with the token ids and logits shown: llama-simple's loop (examples/simple/simple.cpp
// of the same llama.cpp: the prompt tokenized with special tokens parsed and the model's own BOS rule, one batch,
// then one token at a time, llama_sampler_init_greedy) with, per generated token, its id and the two largest logits,
// and optionally every step's logits written to a file. Built inside llama.cpp's tree by tools/peer/llama_cpp_greedy.sh
// (not part of quest's build).
//
//   llama-quest-greedy -m MODEL.gguf -n N [-t THREADS] [--logits FILE] PROMPT
//
// stdout, one JSON object per line: {"prompt_ids": [...]}, then per step {"step": i, "id": t, "top": [[id, logit],
// [id, logit]], "eog": bool} (generation ends after an end-of-generation token, which is listed). FILE: float32
// [steps, n_vocab], the logits each step's token was chosen from.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

static void batch_set_tokens(llama_batch_ext* batch, const llama_token* tokens, int32_t n_tokens, llama_pos pos_0) {
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n_tokens; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
        const llama_pos pos = pos_0 + i;
        llama_batch_ext_set_pos(batch, idx, &pos);
    }
    llama_batch_ext_set_output_logits(batch, n_tokens - 1, true);
}

int main(int argc, char** argv) {
    std::string model_path, prompt, logits_path;
    int n_predict = 64, threads = 2;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-m" && i + 1 < argc) model_path = argv[++i];
        else if (a == "-n" && i + 1 < argc) n_predict = std::stoi(argv[++i]);
        else if (a == "-t" && i + 1 < argc) threads = std::stoi(argv[++i]);
        else if (a == "--logits" && i + 1 < argc) logits_path = argv[++i];
        else prompt = a;
    }
    if (model_path.empty() || prompt.empty()) {
        fprintf(stderr, "usage: %s -m MODEL.gguf -n N [-t THREADS] [--logits FILE] PROMPT\n", argv[0]);
        return 2;
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) return fprintf(stderr, "error: %s: unable to load\n", model_path.c_str()), 1;
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_prompt = -llama_tokenize(vocab, prompt.c_str(), int(prompt.size()), nullptr, 0, true, true);
    std::vector<llama_token> ids(n_prompt);
    if (llama_tokenize(vocab, prompt.c_str(), int(prompt.size()), ids.data(), n_prompt, true, true) < 0)
        return fprintf(stderr, "error: failed to tokenize the prompt\n"), 1;

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_prompt + n_predict;
    cp.n_batch = n_prompt;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) return fprintf(stderr, "error: failed to create the context\n"), 1;
    llama_sampler* smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(smpl, llama_sampler_init_greedy());

    printf("{\"prompt_ids\": [");
    for (int i = 0; i < n_prompt; ++i) printf("%s%d", i ? ", " : "", ids[i]);
    printf("]}\n");
    FILE* lf = logits_path.empty() ? nullptr : fopen(logits_path.c_str(), "wb");
    if (!logits_path.empty() && !lf) return fprintf(stderr, "error: %s: cannot write\n", logits_path.c_str()), 1;

    llama_batch_ext* batch = llama_batch_ext_init(ctx);
    batch_set_tokens(batch, ids.data(), n_prompt, 0);
    int n_pos = 0, n_tokens = n_prompt;
    for (int step = 0; step < n_predict; ++step) {
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) return fprintf(stderr, "error: eval failed\n"), 1;
        n_pos += n_tokens;
        const float* logits = llama_get_logits_ith(ctx, -1);
        if (lf) fwrite(logits, sizeof(float), size_t(n_vocab), lf);
        std::vector<int> order(n_vocab);
        for (int v = 0; v < n_vocab; ++v) order[v] = v;
        std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                          [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
        llama_token t = llama_sampler_sample(smpl, ctx, -1);
        const bool eog = llama_vocab_is_eog(vocab, t);
        printf("{\"step\": %d, \"id\": %d, \"top\": [[%d, %.9g], [%d, %.9g]], \"eog\": %s}\n", step, t, order[0],
               logits[order[0]], order[1], logits[order[1]], eog ? "true" : "false");
        if (eog) break;
        batch_set_tokens(batch, &t, 1, n_pos);
        n_tokens = 1;
    }
    if (lf) fclose(lf);
    llama_batch_ext_free(batch);
    llama_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
