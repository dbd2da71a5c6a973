// Runtime CPU feature detection for the CPU backend (x86-64 cpuid + xgetbv).
#pragma once

#include <string>

namespace moekit::cpu {

struct CpuFeatures {
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool avx512vnni = false;
  bool os_saves_zmm = false;  // XCR0 has the opmask/ZMM state bits
  std::string brand;
};

const CpuFeatures& cpu_features();
// "avx512f avx512bw avx512vl avx512_bf16 avx512_vnni" (those present).
std::string describe(const CpuFeatures& f);

}  // namespace moekit::cpu
