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

// parallel_for(n, fn) when `parallel`, else fn(0, n) on the calling thread: for calls too small to
// pay for waking the pool (each kernel states its threshold).
inline void parallel_for_if(bool parallel, int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn) {
  if (parallel) {
    parallel_for(n, fn);
  } else {
    fn(0, n);
  }
}

}  // namespace moekit::cpu
