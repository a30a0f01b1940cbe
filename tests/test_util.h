#pragma once
// Helpers shared by the tests: where the optional shared models are, and a visible skip when they are absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace quest::test {

// ../shared next to the checkout (override with QUEST_SHARED_DIR). Tests that need it skip when it is absent.
inline std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("QUEST_SHARED_DIR")) return env;
    return std::filesystem::path(QUEST_SOURCE_DIR) / ".." / "shared";
}

inline std::filesystem::path source_dir() { return QUEST_SOURCE_DIR; }

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
