// Runtime CPU feature detection (src/cpu/cpu_features.h).
#include "cpu/cpu_features.h"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define MOEKIT_X86 1
#endif

namespace moekit::cpu {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(MOEKIT_X86)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1u;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_saves_zmm = (lo & 0xE6u) == 0xE6u;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  }
  __cpuid_count(7, 0, a, b, c, d);
  f.avx512f = (b >> 16) & 1u;
  f.avx512bw = (b >> 30) & 1u;
  f.avx512vl = (b >> 31) & 1u;
  f.avx512vnni = (c >> 11) & 1u;
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512bf16 = (a >> 5) & 1u;
  char brand[49] = {};
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) {
      __cpuid(0x80000002u + i, a, b, c, d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
  }
  f.brand = brand;
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string describe(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  };
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512bf16, "avx512_bf16");
  add(f.avx512vnni, "avx512_vnni");
  if (!f.os_saves_zmm) s += (s.empty() ? "" : " ") + std::string("(OS does not enable zmm state)");
  return s;
}

}  // namespace moekit::cpu
