// libFuzzer target: the whole model-folder loader on a folder built from a bundle (see fuzz_util.h): config.json
// and model.safetensors (or an index with shards), as `quest generate` opens them (open_model_folder, then the CPU
// backend with a small KV cache and a host-memory limit), then a short prefill and two decode steps.
//
// Any folder must either be refused with InputError / ResourceError before anything large is allocated (libFuzzer's
// -malloc_limit_mb turns a huge allocation into a finding), or load and run.
#include <cstdint>
#include <vector>

#include "model/core/backend.h"
#include "model/cpu/llama_cpu.h"
#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"

using namespace quest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto dir = fuzz::write_bundle("model_folder", data, size);
    try {
        const ModelFolder model = open_model_folder(dir);
        QuestSettings q;
        q.page_size = 4;
        q.budget = 8;
        q.dense_layers = 1;
        auto backend = make_cpu_backend(model, q, /*capacity=*/12, /*memory_limit=*/size_t(256) << 20);
        const int v = model.config.vocab_size;
        const std::vector<int> prompt = {model.config.bos_token_id, 0 % v, (v - 1) % v};
        backend->prefill(prompt);
        for (int i = 0; i < 10 && backend->position() < backend->capacity(); ++i) backend->decode(i % v);
    } catch (const InputError&) {
    } catch (const ResourceError&) {
    }
    return 0;
}
