// A small fixed-size thread pool for the CPU backend: parallel_for(n, fn) runs fn(i) for i in
// [0, n) split into one contiguous range per thread (a fixed partition: which thread computes an
// item never changes the item's result, so kernels stay deterministic). Threads: MOEKIT_NUM_THREADS
// or all hardware threads. Calls from inside a task run serially (no nested parallelism). An
// exception from a task reaches parallel_for's caller once every range has finished. The process's
// pool is fork-safe: a child process makes its own on first use. With more threads than the
// machine has, idle threads sleep instead of spinning.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace moekit::cpu {

using RangeFn = std::function<void(int64_t begin, int64_t end)>;

int num_threads();  // the process pool's active threads (moekit/threads.h)
void parallel_for(int64_t n, const RangeFn& fn);

// parallel_for(n, fn) when `parallel`, else fn(0, n) on the calling thread: for calls too small to
// pay for waking the pool (each kernel states its threshold).
inline void parallel_for_if(bool parallel, int64_t n, const RangeFn& fn) {
  if (parallel) {
    parallel_for(n, fn);
  } else {
    fn(0, n);
  }
}

// The pool behind parallel_for; tests make their own (any size, whatever the machine).
class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1, the calling thread included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;
  // Ranges a job is split into (threads that work on it): [1, size()], size() at first.
  int active() const;
  void set_active(int threads);  // clamped to [1, size()]; a job in flight keeps its split
  // Whether waiting threads spin before they sleep (only when the machine has a core for each).
  bool spins() const;
  void run(int64_t n, const RangeFn& fn);
  // Held by run() for the whole job; the fork handlers hold it across fork().
  std::mutex& call_mutex();

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace moekit::cpu
