#pragma once
// Splitting a CPU loop over threads: the CPU reference's only parallelism. Each range is computed exactly as one
// thread would compute it, so the split changes no result.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace quest {

// f(r0, r1) over [0, rows) in up to `threads` contiguous ranges (0: every core), one thread each; one thread when
// the loop's work (about one unit per multiply-add) is under 2^20. An exception in a range is rethrown after every
// thread has joined.
template <typename F>
void parallel_rows(int rows, int64_t work, int threads, F&& f) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (work < (1 << 20)) threads = 1;
    threads = std::max(1, std::min(threads, rows));
    if (threads == 1) {
        if (rows > 0) f(0, rows);
        return;
    }
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(threads);
    const int chunk = (rows + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
        const int r0 = t * chunk, r1 = std::min(rows, r0 + chunk);
        if (r0 >= r1) break;
        pool.emplace_back([&, t, r0, r1] {
            try {
                f(r0, r1);
            } catch (...) {
                errors[t] = std::current_exception();
            }
        });
    }
    for (auto& th : pool) th.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace quest
