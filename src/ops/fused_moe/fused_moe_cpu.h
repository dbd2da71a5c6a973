// Pieces shared by the CPU fused_moe kernels (fused_moe_avx512.cpp: bf16, fused_moe_avx512_fp8.cpp:
// fp8 per-row, fused_moe_avx512_fp8_block.cpp: fp8 block scales, fused_moe_cpu_generic.cpp: the
// portable kernels): the host-tensor check, the AVX-512 CPU-feature check, the workspace carver,
// stage 0 (entries grouped by local expert) and stage 3 (the per-token sum over k in slot order,
// one rounding). Plain C++: no AVX-512 here, so it runs on any x86-64.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/cpu_features.h"
#include "moekit/ops/fused_moe.h"

namespace moekit::cpu::moe {

// Unsupported (naming the tensor) unless every present tensor of p lives on the host.
Status require_host(const FusedMoeParams& p);

constexpr size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

// Hands out 64-byte aligned pieces of a workspace (declare its size with align64 per piece + 64).
class Carver {
 public:
  explicit Carver(void* ws)
      : base_(reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(ws) + 63) & ~uintptr_t(63))) {}
  template <class T>
  T* take(size_t count) {
    T* q = reinterpret_cast<T*>(base_);
    base_ += align64(count * sizeof(T));
    return q;
  }

 private:
  unsigned char* base_;
};

// The (token, slot) entries of a call grouped by local expert (stage 0).
struct ExpertGroups {
  int32_t* local;   // [Eg] global -> local expert (-1 remote)
  int32_t* offset;  // [E + 1] start of each expert's entries in `entry`
  int32_t* entry;   // [T*k] slot ids t*k + j grouped by expert, (t, j) ascending inside
  int32_t* active;  // [E] local experts with entries, ascending; count in n_active
  uint8_t* valid;   // [T*k] the slot has a local expert
  int64_t n_active = 0;
};

// Workspace bytes of the ExpertGroups arrays (aligned pieces, no slack).
size_t expert_groups_bytes(const MoeDims& d);
// Carves the ExpertGroups arrays from c.
void carve_expert_groups(const MoeDims& d, Carver& c, ExpertGroups* g);
// Stage 0: fills g (counting sort, stable in slot order; -1 ids and remote experts skipped).
void group_entries(const FusedMoeParams& p, const MoeDims& d, ExpertGroups* g);
// Stage 3: out[t] = sum_j w_tj * y[t*k + j] over the valid slots in slot order (w = 1 with the
// router weight on the input), one rounding to out's dtype; threads over tokens.
void combine_slots(const FusedMoeParams& p, const MoeDims& d, const ExpertGroups& g, const float* y);

// Ok when the CPU described by f can run an AVX-512 kernel: F/BW/VL with the OS saving zmm state,
// plus BF16 when need_bf16. Otherwise Unsupported naming `kernel` and the missing feature ("CPU
// lacks AVX-512 BF16 (has: ...)"). Each AVX-512 kernel's supports() calls it with cpu_features()
// (the backend probe accepts any x86-64 so the portable kernels run everywhere); taking f as an
// argument lets the tests pass a CPU without the feature.
Status require_avx512(const char* kernel, const CpuFeatures& f, bool need_bf16);

}  // namespace moekit::cpu::moe
