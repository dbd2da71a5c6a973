// The CPU backend's thread pool (src/cpu/thread_pool.h).
#include "cpu/thread_pool.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "moekit/core/config.h"

namespace moekit::cpu {

namespace {

// True on a thread that is running a parallel_for task: nested calls run serially there.
thread_local bool t_inside = false;

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int t = 1; t < n_; ++t) workers_.emplace_back([this, t] { loop(t); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      ++generation_;
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
    std::unique_lock<std::mutex> call(call_mu_);  // one parallel_for at a time
    {
      std::lock_guard<std::mutex> l(mu_);
      fn_ = &fn;
      items_ = n;
      pending_ = n_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    t_inside = true;
    range(0, fn);
    t_inside = false;
    std::unique_lock<std::mutex> l(mu_);
    done_.wait(l, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void range(int t, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t b = items_ * t / n_, e = items_ * (t + 1) / n_;
    if (b < e) fn(b, e);
  }
  void loop(int t) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        fn = fn_;
      }
      t_inside = true;
      range(t, *fn);
      t_inside = false;
      {
        std::lock_guard<std::mutex> l(mu_);
        --pending_;
      }
      done_.notify_one();
    }
  }

  const int n_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_, mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t items_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
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
