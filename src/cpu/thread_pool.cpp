// The CPU backend's thread pool (src/cpu/thread_pool.h).
#include "cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "moekit/core/config.h"

namespace moekit::cpu {

namespace {

// True on a thread that is running a parallel_for task: nested calls run serially there.
thread_local bool t_inside = false;

// How long a waiting thread spins before it blocks on a condition variable. Calls follow each
// other within microseconds in a decode loop (the model runner makes several per layer and
// token); a futex wake-up per call and thread cost more than the work there (a third of the
// runner's profile before the spin). Bounded, so an idle pool sleeps.
constexpr std::chrono::microseconds kSpin(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until pred() holds or kSpin has passed; returns pred()'s last value.
template <class Pred>
bool spin_until(Pred pred) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > kSpin) return pred();
  }
}

// One caller at a time hands out a job (fn_, items_) by bumping generation_; every worker runs its
// range and decrements pending_. Waiting is spin-then-block on both sides. The sleep handshakes are
// the classic store / load pairs on seq_cst atomics under mu_: a sleeper registers (sleepers_ or
// caller_waiting_) and re-checks its condition under mu_, the waker changes the condition and
// then reads the registration, so one of the two always sees the other (no lost wake-up).
class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int t = 1; t < n_; ++t) workers_.emplace_back([this, t] { loop(t); });
  }
  ~Pool() {
    stop_.store(true);
    generation_.fetch_add(1);
    {
      std::lock_guard<std::mutex> l(mu_);  // a worker between its check and its wait holds mu_
    }
    cv_.notify_all();
    for (std::thread& w : workers_) w.join();
  }
  int size() const { return n_; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n_ == 1 || n <= 1 || t_inside) {
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> call(call_mu_);  // one parallel_for at a time
    fn_ = &fn;
    items_ = n;
    pending_.store(n_ - 1);
    generation_.fetch_add(1);  // publishes fn_ and items_ to the workers that see the new value
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> l(mu_);
      cv_.notify_all();
    }
    t_inside = true;
    range(0, fn);
    t_inside = false;
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> l(mu_);
      caller_waiting_.store(true);
      done_.wait(l, [this] { return pending_.load() == 0; });
      caller_waiting_.store(false);
    }
    fn_ = nullptr;
  }

 private:
  void range(int t, const std::function<void(int64_t, int64_t)>& fn) const {
    const int64_t b = items_ * t / n_, e = items_ * (t + 1) / n_;
    if (b < e) fn(b, e);
  }
  void loop(int t) {
    uint64_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> l(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(l, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      t_inside = true;
      range(t, *fn_);
      t_inside = false;
      if (pending_.fetch_sub(1) == 1 && caller_waiting_.load()) {
        std::lock_guard<std::mutex> l(mu_);
        done_.notify_one();
      }
    }
  }

  const int n_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_, mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // the job: written before generation_
  int64_t items_ = 0;                                           // is bumped, read after it is seen
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<int> sleepers_{0};         // workers blocked on cv_
  std::atomic<bool> caller_waiting_{false};
  std::atomic<bool> stop_{false};
};

Pool& pool() {
  static Pool p([] {
    const int cfg = config().num_threads;
    const int hw = int(std::thread::hardware_concurrency());
    return cfg > 0 ? cfg : (hw > 0 ? hw : 1);
  }());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) { pool().run(n, fn); }

}  // namespace moekit::cpu
