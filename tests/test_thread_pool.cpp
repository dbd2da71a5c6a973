// The CPU backend's thread pool (src/cpu/thread_pool.h): partition, exceptions from tasks, pools
// larger than the machine, and fork() of a process whose pool already runs.
// Run: ./build/tests/moekit_tests --gtest_filter='ThreadPool.*'
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "fused_moe_test_util.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/threads.h"

namespace moekit::cpu {
namespace {

// Runs one job of n items on `pool` and returns how many distinct threads ran a range; every item
// must be covered exactly once.
int threads_used(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.run(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
    std::lock_guard<std::mutex> l(mu);
    ids.insert(std::this_thread::get_id());
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "item " << i;
  return int(ids.size());
}

TEST(ThreadPool, EveryItemOnceOnEveryThread) {
  ThreadPool pool(4);
  EXPECT_EQ(threads_used(pool, 4), 4);
  EXPECT_EQ(threads_used(pool, 1000), 4);
  EXPECT_EQ(threads_used(pool, 3), 3);  // fewer items than threads: the idle ranges are empty
}

// A task that throws on the calling thread used to leave the thread marked as inside a task, so
// every later job ran serially there; one that threw on a worker ended the process.
TEST(ThreadPool, ExceptionFromTheCallersRangeReachesTheCallerAndThePoolStaysParallel) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.run(8, [](int64_t b, int64_t) {
                 if (b == 0) throw std::runtime_error("caller's range");
               }),
               std::runtime_error);
  EXPECT_EQ(threads_used(pool, 8), 4);
}

TEST(ThreadPool, ExceptionFromAWorkerReachesTheCallerAfterEveryRangeFinished) {
  ThreadPool pool(4);
  std::atomic<int> finished{0};
  try {
    pool.run(4, [&](int64_t b, int64_t) {
      if (b == 3) throw std::length_error("worker's range");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      finished.fetch_add(1);
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::length_error& e) {
    EXPECT_STREQ(e.what(), "worker's range");
  }
  EXPECT_EQ(finished.load(), 3);  // the others ran to the end before run() returned
  EXPECT_EQ(threads_used(pool, 8), 4);
}

// set_active / moekit::set_num_threads: later jobs split over that many threads (clamped to the
// pool's size), which the Python package uses to follow torch.get_num_threads().
TEST(ThreadPool, ActiveThreadsSplitLaterJobs) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.active(), 4);
  pool.set_active(2);
  EXPECT_EQ(threads_used(pool, 100), 2);
  pool.set_active(1);
  EXPECT_EQ(threads_used(pool, 100), 1);
  pool.set_active(9);
  EXPECT_EQ(pool.active(), 4);
  EXPECT_EQ(threads_used(pool, 100), 4);
  pool.set_active(0);
  EXPECT_EQ(pool.active(), 1);

  const int max = moekit::max_num_threads();
  ASSERT_TRUE(moekit::set_num_threads(1).ok());
  EXPECT_EQ(moekit::num_threads(), 1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(moekit::set_num_threads(0).code(), StatusCode::invalid_argument);
  ASSERT_TRUE(moekit::set_num_threads(max + 7).ok());
  EXPECT_EQ(moekit::num_threads(), max);
}

// More threads than cores: the pool must not spin (spinners starve the threads with work) and
// still gives every item to exactly one thread, call after call.
TEST(ThreadPool, OversubscribedPoolSleepsInsteadOfSpinning) {
  const int hw = int(std::thread::hardware_concurrency());
  ThreadPool big(4 * (hw > 0 ? hw : 1) + 4);
  EXPECT_FALSE(big.spins());
  for (int call = 0; call < 50; ++call) threads_used(big, 1 + call % 7);
  ThreadPool one(1);
  EXPECT_TRUE(one.spins());
}

// fork() after the process's pool started: the child's first parallel_for (and fused_moe on the
// CPU) must run, not wait forever for workers that exist only in the parent. The child is killed
// by an alarm if it hangs, which the parent reports as a failure.
TEST(ThreadPool, ChildProcessAfterForkRunsParallelFor) {
  std::atomic<int64_t> sum{0};
  parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
  });
  ASSERT_EQ(sum.load(), 999 * 1000 / 2);
  using namespace moekit::testing;
  MoeProblem prob = moe_test::make(moe_test::small_shape(Scheme::bf16, 16, 6, 2, 128, 64));
  const RunOptions cpu;  // the usual choice: the CPU backend's kernel where the machine has one
  prob.out.fill_bytes(0xAB);  // the same poison as the child's run (out may have padding)
  const bool have_cpu = fused_moe(prob.params(), cpu).ok();
  const std::vector<unsigned char> expected = prob.out.bytes;

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);
    std::atomic<int64_t> s{0};
    parallel_for(1000, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) s.fetch_add(i);
    });
    if (s.load() != 999 * 1000 / 2) _exit(3);
    if (have_cpu) {
      prob.out.fill_bytes(0xAB);
      const Status st = fused_moe(prob.params(), cpu);
      if (!st.ok()) std::fprintf(stderr, "child: %s\n", st.to_string().c_str());
      if (!st.ok() || prob.out.bytes != expected) _exit(4);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "child killed by signal " << WTERMSIG(status) << " (SIGALRM = hung)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: parallel_for wrong, 4: fused_moe failed or differs";
  // The parent's pool still works after the fork.
  sum = 0;
  parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

}  // namespace
}  // namespace moekit::cpu
