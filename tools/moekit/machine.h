// Machine floors for `moekit bench` (docs/cli.md, "How the floors are obtained"): the memory
// bandwidth and arithmetic rate a kernel's time is compared with.
//
// Host backends (ref, cpu): MEASURED in the same process, before any kernel runs: a multi-threaded
// streaming read of >= 512 MiB (best of a few passes) and the dot-product peak (vdpbf16ps with 16
// independent zmm accumulators per thread when the CPU has AVX-512 BF16, plus an fp32 FMA peak).
// CUDA: no measurement; device_floors() returns the H200 ceilings of ANCHORS.md (the hook to replace
// with a measured or queried value).
#pragma once

#include <string>

#include "testing/harness.h"

namespace moekit::cli {

// One peak, with where it came from ("measured: ...", "--peak-gbps", "H200 datasheet").
struct Peak {
  double value = 0;  // GB/s or GFLOP/s; 0 = not available
  std::string how;
};

struct HostPeaks {
  std::string cpu;   // brand string
  int threads = 0;   // threads used by the measurements (all hardware threads)
  Peak dram_gbps;    // streaming read bandwidth
  Peak bf16_gflops;  // vdpbf16ps dot-product peak (0 when the CPU lacks AVX-512 BF16)
  Peak fp32_gflops;  // fp32 FMA peak (AVX-512, or a scalar loop without AVX-512)
};

// Measures what is asked for (each takes ~0.1-1 s); the other fields stay 0.
HostPeaks measure_host(bool bandwidth, bool compute);

// The floors used for one bench row.
struct Floors {
  Peak gbps;          // memory floor denominator
  Peak gflops;        // compute floor denominator
  std::string rate;   // which arithmetic rate: "bf16 dot", "fp32 fma", "fp8 tensor core", ...
};

// Host floors for a scheme: bf16 and fp8 schemes use the bf16 dot peak (the CPU kernels compute
// fp8 problems with bf16 dot products), f32 / f16 the fp32 FMA peak; falls back to fp32 when the
// bf16 peak is absent.
Floors host_floors(const HostPeaks& p, testing::Scheme scheme);

// CUDA floors. NOTE: the hook for a measured / queried device peak. It returns the H200 ceilings the
// peer numbers of ANCHORS.md (shared project documents) were judged against, so moekit's frac_floor is comparable
// with the peer's: 4300 GB/s (read stream), 790 TFLOP/s bf16 (cuBLAS 8192^3), 1580 TFLOP/s fp8
// (2x bf16); f32 / f16 schemes use the bf16 rate (the kernels run on bf16/f16 tensor cores).
Floors device_floors(testing::Scheme scheme);

// One-paragraph description of the host peaks for the bench header.
std::string describe(const HostPeaks& p);

}  // namespace moekit::cli
