// libFuzzer target: ModelFiles on a folder built from a bundle (see fuzz_util.h), typically
// model.safetensors.index.json and a few small shards, or a single model.safetensors.
//
// Any folder must either be rejected with InputError or give a tensor map in which every name resolves to a tensor
// of one of the opened files, get() with the tensor's own shape succeeds and with another shape throws InputError,
// and the bytes are readable.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"
#include "model/io/safetensors.h"

using namespace quest;

#define FUZZ_CHECK(cond) QUEST_FUZZ_CHECK("fuzz_model_index", cond)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto dir = fuzz::write_bundle("model_index", data, size);
    try {
        const ModelFiles files(dir);
        FUZZ_CHECK(!files.files().empty());
        for (const std::string& name : files.names()) {
            const auto ref = files.find(name);
            FUZZ_CHECK(ref && ref->info->name == name);
            const TensorRef got = files.get(name, ref->info->shape);
            FUZZ_CHECK(got.info == ref->info);
            volatile uint8_t sink = 0;
            const auto* bytes = reinterpret_cast<const uint8_t*>(got.data());
            for (uint64_t i = 0; i < got.info->nbytes(); i += 4096) sink = sink ^ bytes[i];
            if (got.info->nbytes() > 0) sink = sink ^ bytes[got.info->nbytes() - 1];
            std::vector<int64_t> other = ref->info->shape;
            other.push_back(1);
            try {
                files.get(name, other);
                FUZZ_CHECK(!"get() accepted a wrong shape");
            } catch (const InputError&) {
            }
        }
    } catch (const InputError&) {
    }
    return 0;
}
