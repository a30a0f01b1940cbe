#pragma once
// Helpers shared by the tests: where the optional shared models are, and a visible skip when they are absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/wait.h>
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

// The whole content of a file ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

#ifdef QUEST_BINARY
struct RunResult {
    int exit_code;
    std::string out;  // stdout
    std::string err;  // stderr
};

// Runs the quest binary with `args` (a shell-quoted string), capturing stdout and stderr separately.
inline RunResult run_quest(const std::string& args, const std::string& name = "run") {
    const auto dir = temp_dir(name);
    const std::string cmd = std::string("'") + QUEST_BINARY + "' " + args + " >" + (dir / "out").string() + " 2>" +
                            (dir / "err").string();
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
}
#endif

}  // namespace quest::test

// Skips the current test with a message naming what is missing.
#define QUEST_REQUIRE_PATH(p)                                                                  \
    do {                                                                                       \
        if (!std::filesystem::exists(p)) GTEST_SKIP() << "SKIPPED: " << (p) << " is absent"; \
    } while (0)
