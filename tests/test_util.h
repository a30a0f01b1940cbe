#pragma once
// Helpers shared by the tests: where the optional shared models are, and a visible skip when they are absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace quest::test {

// The checkout (override with QUEST_SOURCE_DIR when the test binary runs on another machine, e.g. the GPU one).
inline std::filesystem::path source_dir() {
    if (const char* env = std::getenv("QUEST_SOURCE_DIR")) return env;
    return QUEST_SOURCE_DIR;
}

#ifdef QUEST_DEMO_MODEL
// The random-weight demo model the build writes (override with QUEST_DEMO_MODEL).
inline std::filesystem::path demo_model_dir() {
    if (const char* env = std::getenv("QUEST_DEMO_MODEL")) return env;
    return QUEST_DEMO_MODEL;
}
#endif

// ../shared next to the checkout (override with QUEST_SHARED_DIR). Tests that need it skip when it is absent.
inline std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("QUEST_SHARED_DIR")) return env;
    return source_dir() / ".." / "shared";
}

// A fresh, empty temporary directory for one test.
inline std::filesystem::path temp_dir(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("quest_test_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

}  // namespace quest::test

// Skips the current test with a message naming what is missing.
#define QUEST_REQUIRE_PATH(p)                                                                  \
    do {                                                                                       \
        if (!std::filesystem::exists(p)) GTEST_SKIP() << "SKIPPED: " << (p) << " is absent"; \
    } while (0)
