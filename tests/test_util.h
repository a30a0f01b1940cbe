#pragma once
// Helpers shared by the tests: where the optional shared models are, and a visible skip when they are absent.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

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

// Two tokenizers have the same vocabulary size and BOS / EOS ids (gtest expectations).
template <class A, class B>
void expect_same_specials(const A& a, const B& b) {
    EXPECT_EQ(a.vocab_size(), b.vocab_size());
    EXPECT_EQ(a.bos_id(), b.bos_id());
    EXPECT_EQ(a.eos_id(), b.eos_id());
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

// Strict UTF-8 check (no overlongs, surrogates or code points above U+10FFFF; no truncated sequence), written
// apart from tokenizer/utf8.h so that the tokenizers' output is checked by an independent rule.
inline bool is_valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const auto b = static_cast<uint8_t>(s[i]);
        int n = 0;
        uint8_t lo = 0x80, hi = 0xbf;
        if (b < 0x80) n = 1;
        else if (b >= 0xc2 && b <= 0xdf) n = 2;
        else if (b >= 0xe0 && b <= 0xef) n = 3, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
        else if (b >= 0xf0 && b <= 0xf4) n = 4, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
        else return false;
        if (i + n > s.size()) return false;
        for (int k = 1; k < n; ++k) {
            const auto c = static_cast<uint8_t>(s[i + k]);
            if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return false;
        }
        i += n;
    }
    return true;
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
