// A small fixed-size thread pool for the CPU backend: parallel_for(n, fn) runs fn(i) for i in
// [0, n) split into one contiguous range per thread (a fixed partition: which thread computes an
// item never changes the item's result, so kernels stay deterministic). Threads: MOEKIT_NUM_THREADS
// or all hardware threads. Calls from inside a task run serially (no nested parallelism).
#pragma once

#include <cstdint>
#include <functional>

namespace moekit::cpu {

int num_threads();
void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace moekit::cpu
