// Machine floors for `moekit bench` (tools/moekit/machine.h; docs/cli.md "How the floors are
// obtained"): host DRAM bandwidth and dot-product peaks measured with std::thread on every hardware
// thread, and the CUDA hook. Exercised by the cli.bench.* entries of tests/cli_tests.cmake (no test
// asserts a number: they depend on the machine).
//
// NOTE: the AVX-512 loops use function-level target attributes and run only after a cpuid check, so
// this file is compiled without -mavx512* and the binary still starts on any x86-64 CPU.
#include "machine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <thread>
#include <vector>

#include "cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MOEKIT_CLI_X86 1
#endif

namespace moekit::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadBytes = size_t(512) << 20;  // >= 512 MiB: far beyond any last-level cache
constexpr int kPasses = 5;                        // best of
constexpr int64_t kDotIters = int64_t(1) << 22;   // per thread: 16 instructions per iteration

std::atomic<uint64_t> g_sink{0};  // results go here so the loops cannot be optimised away

// Runs fn(thread_index) on `n` threads released together; returns the wall time of the slowest.
template <class F>
double timed_parallel(int n, F fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      fn(t);
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& th : threads) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------- streaming read
uint64_t read_scalar(const uint64_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a0 ^= p[i];
    a1 ^= p[i + 1];
    a2 ^= p[i + 2];
    a3 ^= p[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

#if defined(MOEKIT_CLI_X86)
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint64_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {  // 256 bytes per iteration, four independent chains
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 24));
  }
  const __m512i a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, a);
  uint64_t r = 0;
  for (uint64_t v : lanes) r ^= v;
  return r;
}
#endif

Peak measure_bandwidth(int threads, bool avx512) {
  const size_t words = kReadBytes / sizeof(uint64_t);
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(4096, kReadBytes));
  if (buf == nullptr) return {0, "not measured: could not allocate 512 MiB"};
  // Each thread reads a contiguous chunk (a multiple of 32 words so the vector loop covers it).
  const size_t chunk = (words / size_t(threads)) / 32 * 32;
  // First touch by the thread that later reads the chunk (page placement on NUMA machines).
  timed_parallel(threads, [&](int t) {
    uint64_t* p = buf + size_t(t) * chunk;
    for (size_t i = 0; i < chunk; ++i) p[i] = i * 0x9E3779B97F4A7C15ull;
  });
  double best = 1e30;
  for (int pass = 0; pass < kPasses; ++pass) {
    const double s = timed_parallel(threads, [&](int t) {
      const uint64_t* p = buf + size_t(t) * chunk;
#if defined(MOEKIT_CLI_X86)
      g_sink.fetch_xor(avx512 ? read_avx512(p, chunk) : read_scalar(p, chunk), std::memory_order_relaxed);
#else
      g_sink.fetch_xor(read_scalar(p, chunk), std::memory_order_relaxed);
#endif
    });
    best = std::min(best, s);
  }
  std::free(buf);
  const double bytes = double(chunk) * double(threads) * sizeof(uint64_t);
  std::ostringstream how;
  how << "measured: streaming read of " << (kReadBytes >> 20) << " MiB, " << threads << " threads, "
      << (avx512 ? "avx512 loads" : "scalar loads") << ", best of " << kPasses;
  return {bytes / best / 1e9, how.str()};
}

// ---------------------------------------------------------------- dot-product peaks
// Each loop keeps 16 independent accumulators so the instruction latency is hidden by throughput.
#if defined(MOEKIT_CLI_X86)
// NOTE: not _mm512_reduce_add_ps: GCC 12 warns (-Wuninitialized) inside that intrinsic.
__attribute__((target("avx512f"))) float horizontal_sum(const __m512* c) {
  __m512 s = c[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, c[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float r = 0;
  for (float v : lanes) r += v;
  return r;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_loop(int64_t iters, float seed) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(short(0x3F80));  // bf16 1.0
  uint32_t bits;
  std::memcpy(&bits, &seed, sizeof bits);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(short(bits >> 16));  // bf16(seed): small, no overflow
  __m512 c[16];
  for (int i = 0; i < 16; ++i) c[i] = _mm512_setzero_ps();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) c[i] = _mm512_dpbf16_ps(c[i], a, b);
  }
  return horizontal_sum(c);
}

__attribute__((target("avx512f"))) float fp32_fma_loop(int64_t iters, float seed) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(seed);
  __m512 c[16];
  for (int i = 0; i < 16; ++i) c[i] = _mm512_set1_ps(float(i));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) c[i] = _mm512_fmadd_ps(c[i], a, b);
  }
  return horizontal_sum(c);
}
#endif

float scalar_fma_loop(int64_t iters, float seed) {
  float c[8];
  for (int i = 0; i < 8; ++i) c[i] = float(i);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 8; ++i) c[i] = c[i] * 0.999f + seed;
  }
  float s = 0;
  for (float v : c) s += v;
  return s;
}

// flops_per_iter: flops of one loop iteration on one thread.
Peak measure_rate(int threads, float (*loop)(int64_t, float), double flops_per_iter, const char* what) {
  double best = 1e30;
  for (int pass = 0; pass < kPasses; ++pass) {
    const double s = timed_parallel(threads, [&](int t) {
      const float r = loop(kDotIters, 1e-6f * float(t + 1));
      uint32_t bits;
      std::memcpy(&bits, &r, sizeof bits);
      g_sink.fetch_xor(bits, std::memory_order_relaxed);
    });
    best = std::min(best, s);
  }
  std::ostringstream how;
  how << "measured: " << what << ", " << threads << " threads, best of " << kPasses;
  return {flops_per_iter * double(kDotIters) * threads / best / 1e9, how.str()};
}

}  // namespace

HostPeaks measure_host(bool bandwidth, bool compute) {
  HostPeaks p;
  const cpu::CpuFeatures& f = cpu::cpu_features();
  p.cpu = f.brand.empty() ? "unknown CPU" : f.brand;
  p.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const bool avx512 = f.avx512f && f.os_saves_zmm;
  if (bandwidth) p.dram_gbps = measure_bandwidth(p.threads, avx512);
#if defined(MOEKIT_CLI_X86)
  if (compute && avx512 && f.avx512bf16) {
    // vdpbf16ps zmm: 16 lanes x 2 bf16 products, each a multiply and an add = 64 flops.
    p.bf16_gflops = measure_rate(p.threads, bf16_dot_loop, 16 * 64.0, "vdpbf16ps zmm, 16 accumulators");
  }
  if (compute && avx512) {
    p.fp32_gflops = measure_rate(p.threads, fp32_fma_loop, 16 * 32.0, "vfmadd zmm fp32, 16 accumulators");
  }
#endif
  if (compute && p.bf16_gflops.value == 0) p.bf16_gflops.how = "not available: the CPU lacks AVX-512 BF16";
  if (compute && p.fp32_gflops.value == 0) {
    p.fp32_gflops = measure_rate(p.threads, scalar_fma_loop, 8 * 2.0, "portable fp32 multiply-add loop (no AVX-512)");
  }
  return p;
}

Floors host_floors(const HostPeaks& p, testing::Scheme scheme) {
  Floors f;
  f.gbps = p.dram_gbps;
  const bool bf16_like = scheme != testing::Scheme::f32 && scheme != testing::Scheme::f16;
  if (bf16_like && p.bf16_gflops.value > 0) {
    f.gflops = p.bf16_gflops;
    f.rate = "bf16 dot";
  } else {
    f.gflops = p.fp32_gflops;
    f.rate = "fp32 fma";
  }
  return f;
}

Floors device_floors(testing::Scheme scheme) {
  const bool fp8 = scheme == testing::Scheme::fp8_tensor || scheme == testing::Scheme::fp8_channel ||
                   scheme == testing::Scheme::fp8_block;
  Floors f;
  f.gbps = {4300, "H200 read-stream ceiling of ANCHORS.md (not measured in this run)"};
  f.gflops = fp8 ? Peak{1580e3, "H200 fp8 ceiling of ANCHORS.md, 2x bf16 (not measured in this run)"}
                 : Peak{790e3, "H200 bf16 cuBLAS 8192^3 ceiling of ANCHORS.md (not measured in this run)"};
  f.rate = fp8 ? "fp8 tensor core" : "bf16 tensor core";
  return f;
}

std::string describe(const HostPeaks& p) {
  std::ostringstream os;
  os << "host: " << p.cpu << ", " << p.threads << " hardware threads\n";
  auto line = [&](const char* name, const Peak& k, const char* unit) {
    os << "  " << name << ": ";
    if (k.value > 0) {
      os << std::fixed << std::setprecision(1) << k.value << ' ' << unit << " (" << k.how << ")\n";
    } else {
      os << (k.how.empty() ? "not measured" : k.how) << '\n';
    }
  };
  line("DRAM read bandwidth", p.dram_gbps, "GB/s");
  line("bf16 dot peak      ", p.bf16_gflops, "GFLOP/s");
  line("fp32 FMA peak      ", p.fp32_gflops, "GFLOP/s");
  os << "  compute floor: bf16 dot peak for bf16/fp8 schemes (fp32 FMA peak when the CPU has no\n"
        "  AVX-512 BF16), fp32 FMA peak for f32/f16 schemes";
  return os.str();
}

}  // namespace moekit::cli
