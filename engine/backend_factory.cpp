#include "engine/backend_factory.h"

#include <unistd.h>

#include "model/core/step_bytes.h"
#include "model/core/memory.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/quantize.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#ifdef QUEST_HAVE_CUDA
#include "model/cuda/llama_cuda.h"
#include "model/cuda/tp_llama.h"
#endif

namespace quest {

namespace {
// The CPU backend over a float checkpoint quantized on load (bench --weights int4): the fp32 reference of the
// round-to-nearest int4 model. A folder already in 4 bits is read as it is.
bool int4_on_load(const ModelFolder& model, const BackendOptions& o) {
    return !o.weights.stored && o.weights.format == LinearFormat::Int4 &&
           (model.is_gguf() || read_quantization_info(model.dir).method == QuantizationInfo::Method::None);
}
std::unique_ptr<Backend> make_cpu_backend_int4(const ModelFolder& model, const BackendOptions& o) {
    auto w = std::make_shared<LlamaWeightsF32>(load_model_weights_f32(model));
    fake_quantize_llama_weights(*w, o.weights.group);
    return std::make_unique<CpuLlama>(std::move(w), o.quest, o.capacity);
}
[[noreturn]] void no_cuda() {
    throw InputError("--backend cuda: this build has no CUDA backend (configure on a machine with nvcc, "
                     "-DQUEST_CUDA=ON)");
}
void check_kind(const BackendOptions& o) {
    if (o.kind != "cpu" && o.kind != "cuda") throw InputError("--backend: expected cpu or cuda, got '" + o.kind + "'");
    if (o.tp != 1 && o.kind != "cuda")
        throw InputError("--tp " + std::to_string(o.tp) + ": tensor parallelism runs on --backend cuda");
}
#ifdef QUEST_HAVE_CUDA
CudaOptions cuda_options(const BackendOptions& o) {
    CudaOptions c;
    c.graph = o.graph;
    c.quest_fused = o.quest_fused;
    c.fused_norms = o.fused_norms;
    c.memory_limit = o.memory_limit;
    c.prefill_chunk = o.prefill_chunk;
    c.profile = o.profile;
    c.weights = o.weights;
    return c;
}
TpSetup tp_setup(const BackendOptions& o) {
    TpSetup s;
    s.ranks = o.tp;
    return s;
}
#endif
}  // namespace

bool cuda_backend_built() {
#ifdef QUEST_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

std::unique_ptr<Backend> create_backend(const ModelFolder& model, const BackendOptions& o) {
    check_kind(o);
    // Before any memory plan: a config claiming more layers than the checkpoint holds names the missing tensor.
    check_model_tensors(model);
    if (o.kind == "cpu" && int4_on_load(model, o)) return make_cpu_backend_int4(model, o);
    if (o.kind == "cpu") return make_cpu_backend(model, o.quest, o.capacity, o.memory_limit);
#ifdef QUEST_HAVE_CUDA
    if (o.tp > 1) return TpCudaLlama::from_folder(model, o.quest, o.capacity, cuda_options(o), tp_setup(o));
    return CudaLlama::from_folder(model, o.quest, o.capacity, cuda_options(o));
#else
    no_cuda();
#endif
}

std::unique_ptr<Backend> create_random_backend(const ModelConfig& config, uint64_t seed, const BackendOptions& o) {
    check_kind(o);
    if (o.kind == "cpu") {
        // Same distributions as `quest make-model`, built in memory (after the memory plan is checked).
        check_cpu_memory(config, o.quest, o.capacity, o.memory_limit);
        const auto dir = std::filesystem::temp_directory_path() / ("quest_random_" + std::to_string(::getpid()));
        write_random_llama(dir, config, {seed, DType::F32});
        if (!o.weights.stored && o.weights.format == LinearFormat::Int4) {
            auto b = make_cpu_backend_int4(ModelFolder{dir, load_model_config(dir / "config.json")}, o);
            std::filesystem::remove_all(dir);
            return b;
        }
        auto b = make_cpu_backend(ModelFolder{dir, load_model_config(dir / "config.json")}, o.quest, o.capacity,
                                  o.memory_limit);
        std::filesystem::remove_all(dir);
        return b;
    }
#ifdef QUEST_HAVE_CUDA
    if (o.tp > 1) return TpCudaLlama::random(config, o.quest, o.capacity, seed, cuda_options(o), tp_setup(o));
    return CudaLlama::random(config, o.quest, o.capacity, seed, cuda_options(o));
#else
    no_cuda();
#endif
}

}  // namespace quest
