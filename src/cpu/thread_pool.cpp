// The CPU backend's thread pool (src/cpu/thread_pool.h).
#include "cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

#include "moekit/core/config.h"
#include "moekit/threads.h"

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

// Spins until pred() holds or `budget` has passed; returns pred()'s last value.
template <class Pred>
bool spin_until(std::chrono::microseconds budget, Pred pred) {
  if (budget.count() == 0) return pred();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > budget) return pred();
  }
}

int hardware_threads() {
  const int hw = int(std::thread::hardware_concurrency());
  return hw > 0 ? hw : 1;
}

}  // namespace

// One caller at a time hands out a job (fn, items) by bumping generation; every worker runs its
// range and decrements pending. Waiting is spin-then-block on both sides. The sleep handshakes are
// the classic store / load pairs on seq_cst atomics under mu: a sleeper registers (sleepers or
// caller_waiting) and re-checks its condition under mu, the waker changes the condition and then
// reads the registration, so one of the two always sees the other (no lost wake-up).
// A task that throws: the caller still waits for every range to finish (the job refers to the
// caller's frame), then rethrows the first exception, its own or a worker's.
struct ThreadPool::State {
  explicit State(int threads)
      : n(threads),
        // No spinning when the pool has more threads than the machine: spinners would take the
        // cores from the threads that have work (0.3 s per small call at 1024 threads on 2 cores).
        spin(threads <= hardware_threads() ? kSpin : std::chrono::microseconds(0)) {}

  // Range t of the current job; an exception is kept (the first one wins) instead of escaping a
  // worker (std::terminate) or skipping the caller's wait.
  void run_range(int t) {
    if (t >= parts) return;
    const int64_t b = items * t / parts, e = items * (t + 1) / parts;
    if (b >= e) return;
    t_inside = true;
    try {
      (*fn)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> l(error_mu);
      if (!error) error = std::current_exception();
    }
    t_inside = false;
  }

  void loop(int t) {
    uint64_t seen = 0;
    for (;;) {
      if (!spin_until(spin, [&] { return generation.load(std::memory_order_acquire) != seen; })) {
        std::unique_lock<std::mutex> l(mu);
        sleepers.fetch_add(1);
        cv.wait(l, [&] { return generation.load() != seen; });
        sleepers.fetch_sub(1);
      }
      seen = generation.load(std::memory_order_acquire);
      if (stop.load()) return;
      run_range(t);
      if (pending.fetch_sub(1) == 1 && caller_waiting.load()) {
        std::lock_guard<std::mutex> l(mu);
        done.notify_one();
      }
    }
  }

  const int n;
  const std::chrono::microseconds spin;
  std::vector<std::thread> workers;
  std::mutex call_mu, mu, error_mu;
  std::condition_variable cv, done;
  const RangeFn* fn = nullptr;  // the job: written before generation is bumped, read after it is seen
  int64_t items = 0;
  int parts = 1;                // ranges of the job: the active count when it started
  std::atomic<int> active{1};
  std::exception_ptr error;     // the first exception a range of the current job threw
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};  // workers still running the current job
  std::atomic<int> sleepers{0};  // workers blocked on cv
  std::atomic<bool> caller_waiting{false};
  std::atomic<bool> stop{false};
};

ThreadPool::ThreadPool(int threads) : s_(std::make_unique<State>(threads < 1 ? 1 : threads)) {
  s_->active.store(s_->n);
  for (int t = 1; t < s_->n; ++t) s_->workers.emplace_back([st = s_.get(), t] { st->loop(t); });
}

ThreadPool::~ThreadPool() {
  s_->stop.store(true);
  s_->generation.fetch_add(1);
  {
    std::lock_guard<std::mutex> l(s_->mu);  // a worker between its check and its wait holds mu
  }
  s_->cv.notify_all();
  for (std::thread& w : s_->workers) w.join();
}

int ThreadPool::size() const { return s_->n; }
int ThreadPool::active() const { return s_->active.load(); }
void ThreadPool::set_active(int threads) { s_->active.store(threads < 1 ? 1 : (threads > s_->n ? s_->n : threads)); }
bool ThreadPool::spins() const { return s_->spin.count() > 0; }
std::mutex& ThreadPool::call_mutex() { return s_->call_mu; }

void ThreadPool::run(int64_t n, const RangeFn& fn) {
  State& s = *s_;
  const int parts = s.active.load();
  if (parts == 1 || n <= 1 || t_inside) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(s.call_mu);  // one parallel_for at a time
  s.fn = &fn;
  s.items = n;
  s.parts = parts;
  s.error = nullptr;
  s.pending.store(s.n - 1);
  s.generation.fetch_add(1);  // publishes fn and items to the workers that see the new value
  if (s.sleepers.load() > 0) {
    std::lock_guard<std::mutex> l(s.mu);
    s.cv.notify_all();
  }
  s.run_range(0);
  if (!spin_until(s.spin, [&s] { return s.pending.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> l(s.mu);
    s.caller_waiting.store(true);
    s.done.wait(l, [&s] { return s.pending.load() == 0; });
    s.caller_waiting.store(false);
  }
  s.fn = nullptr;
  if (s.error) std::rethrow_exception(std::exchange(s.error, nullptr));
}

namespace {

// The process's pool, made on first use. fork() copies only the forking thread, so a child
// that inherited a pool would wait forever on workers that do not exist: the atfork handlers
// hold the pool's locks across fork() (no job or creation is half done in the copy) and the
// child drops its copy (leaked: its threads cannot be joined) and makes a new one on first use.
std::mutex g_pool_mu;                 // guards g_pool's creation
std::atomic<ThreadPool*> g_pool{nullptr};
bool g_fork_locked = false;           // the prepare handler took the pool's call lock

struct PoolOwner {                    // joins the pool's threads at exit
  ~PoolOwner() { delete g_pool.exchange(nullptr); }
} g_pool_owner;

void before_fork() {
  g_pool_mu.lock();
  ThreadPool* p = g_pool.load();
  g_fork_locked = p != nullptr && !t_inside;  // inside a task the caller already holds it
  if (g_fork_locked) p->call_mutex().lock();
}
void after_fork_parent() {
  if (g_fork_locked) g_pool.load()->call_mutex().unlock();
  g_pool_mu.unlock();
}
void after_fork_child() {
  g_pool.store(nullptr);  // the copy's workers do not exist in the child: leave it
  t_inside = false;
  g_pool_mu.unlock();
}

ThreadPool& pool() {
  if (ThreadPool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> l(g_pool_mu);
  if (ThreadPool* p = g_pool.load()) return *p;
  static const bool registered = pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
  (void)registered;
  const int cfg = config().num_threads;
  const int hw = hardware_threads();
  ThreadPool* p = new ThreadPool(cfg > 0 ? cfg : hw);
  g_pool.store(p, std::memory_order_release);
  return *p;
}

}  // namespace

int num_threads() { return pool().active(); }

void parallel_for(int64_t n, const RangeFn& fn) { pool().run(n, fn); }

}  // namespace moekit::cpu

namespace moekit {

Status set_num_threads(int n) {
  if (n < 1) return InvalidArgument("set_num_threads: n must be >= 1, got ", n);
  cpu::pool().set_active(n);
  return Status::Ok();
}

int num_threads() { return cpu::num_threads(); }

int max_num_threads() { return cpu::pool().size(); }

}  // namespace moekit
