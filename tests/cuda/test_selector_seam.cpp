// The page-selector seam on the CUDA backend: a selector registered by the test (tests/selectors/recent.h, its
// CUDA definition in recent_cuda.cu) runs inside the decode graph and follows the CPU backend (SelectorParity in
// test_seam_parity.cpp, with every registered selector); a selector without a
// CUDA definition is refused by asking the registry, never replaced by another.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "kernels/common/error.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/model_folder.h"
#include "tests/selectors/recent_cuda.h"

using namespace quest;

TEST(SelectorSeamCuda, SelectorWithoutCudaDefinitionIsRefused) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    for (PageSelector s : {test::cpu_only_selector(), PageSelector::TwoLevel}) {
        QuestSettings q;
        q.selector = s;
        try {
            CudaLlama::from_folder(m, q, 256);
            FAIL() << "expected an InputError for " << page_selector_name(s);
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(std::string(page_selector_name(s))), std::string::npos) << e.what();
        }
    }
}
