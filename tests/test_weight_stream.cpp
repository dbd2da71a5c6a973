// The weight-stream ceiling of `moekit bench` (src/cuda/weight_stream.h): the read kernel touches
// every 16-byte vector of every range exactly once (its XOR equals the host's over ranges of odd
// lengths, ranges shorter than a warp's chunk, a tail under 16 bytes that is not read), the timer
// returns a positive median, the refusals (no set, an empty set, a misaligned range) name the
// problem, and the bench hook's stream of a fused_moe problem runs. Suite WeightStream; the device
// cases skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "testing/harness.h"

#if MOEKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/weight_stream.h"
#endif

namespace moekit::testing {
namespace {

#if MOEKIT_WITH_CUDA

#define SKIP_WITHOUT_DEVICE()                                                   \
  do {                                                                          \
    const Status av = registry().backend_available(Backend::cuda);              \
    if (!av.ok()) GTEST_SKIP() << "CUDA backend unavailable: " << av.message(); \
  } while (0)

// A device buffer of n pseudo-random bytes (and the host copy), freed with the object.
struct DeviceBuffer {
  std::vector<uint8_t> host;
  void* dev = nullptr;
  explicit DeviceBuffer(size_t n) : host(n) {
    uint32_t s = 12345u;
    for (uint8_t& b : host) b = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
    if (cudaMalloc(&dev, n) == cudaSuccess) cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(dev); }
};

// The XOR of the 32-bit words of the whole 16-byte vectors of [off, off + bytes).
uint32_t host_xor(const DeviceBuffer& b, size_t off, size_t bytes) {
  uint32_t x = 0;
  for (size_t i = 0; i + 16 <= bytes; i += 4 * 4) {
    for (int w = 0; w < 4; ++w) {
      uint32_t v;
      std::memcpy(&v, b.host.data() + off + i + 4 * size_t(w), 4);
      x ^= v;
    }
  }
  return x;
}

TEST(WeightStream, ReadsEveryVectorOnce) {
  SKIP_WITHOUT_DEVICE();
  DeviceBuffer b(size_t(3) << 20);
  ASSERT_NE(b.dev, nullptr);
  const char* d = static_cast<const char*>(b.dev);
  // Ranges: long, shorter than one warp chunk (4 KiB), one vector, a 13-byte tail, odd vector counts.
  const std::vector<std::pair<size_t, size_t>> spans = {
      {0, 1000000}, {1000016, 48}, {1001024, 16}, {1002000, 4096 + 16 * 7 + 13}, {1100000, 2000000 - 64}};
  std::vector<cuda::DeviceBytes> r;
  uint32_t want = 0;
  for (const auto& [off, n] : spans) {
    r.push_back({d + off, n});
    want ^= host_xor(b, off, n);
  }
  uint32_t got = 0;
  const Status st = cuda::weight_stream_checksum(r, &got);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(got, want);
  // One range read twice cancels out: every vector is read exactly once per range.
  r = {{d, 65536}, {d, 65536}};
  ASSERT_TRUE(cuda::weight_stream_checksum(r, &got).ok());
  EXPECT_EQ(got, 0u);
}

TEST(WeightStream, TimesAndRefuses) {
  SKIP_WITHOUT_DEVICE();
  DeviceBuffer b(size_t(8) << 20);
  ASSERT_NE(b.dev, nullptr);
  const char* d = static_cast<const char*>(b.dev);
  double us = 0;
  Status st = cuda::time_weight_stream({{{d, size_t(4) << 20}}, {{d + (size_t(4) << 20), size_t(4) << 20}}}, 1, 5,
                                       L2Flush::write, &us);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(std::isfinite(us) && us > 0) << us;
  st = cuda::time_weight_stream({}, 1, 5, L2Flush::write, &us);
  EXPECT_NE(st.message().find("no input set"), std::string::npos) << st.to_string();
  st = cuda::time_weight_stream({{{d, 8}}}, 1, 5, L2Flush::write, &us);
  EXPECT_NE(st.message().find("no byte to read"), std::string::npos) << st.to_string();
  st = cuda::time_weight_stream({{{d + 4, 4096}}}, 1, 5, L2Flush::write, &us);
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.to_string();
}

TEST(WeightStream, BenchHookStreamsTheTouchedExperts) {
  SKIP_WITHOUT_DEVICE();
  const Kernel* kernel = nullptr;
  for (const Kernel* k : registry().candidates(OpKind::fused_moe, MoeVariant::unquantized)) {
    if (k->backend == Backend::cuda && kernel == nullptr) kernel = k;
  }
  if (kernel == nullptr) GTEST_SKIP() << "no CUDA fused_moe kernel registered";
  BenchRequest req;
  req.shape.model = "mixtral";  // the scaled-down preset
  std::unique_ptr<BenchProblem> p;
  Status st = bench_fused_moe(req, 8, *kernel, &p);
  ASSERT_TRUE(st.ok()) << st.to_string();
  double us = 0;
  st = p->stream(1, 5, L2Flush::write, &us);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(std::isfinite(us) && us > 0) << us;
}

#else

TEST(WeightStream, NeedsCudaBuild) { GTEST_SKIP() << "the weight stream exists only in CUDA builds"; }

#endif

}  // namespace
}  // namespace moekit::testing
