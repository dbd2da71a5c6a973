// CPU backend registration: the AVX-512 BF16 probe and the CPU kernel table.
#include "cpu/cpu_backend.h"

#include "cpu/cpu_features.h"

namespace moekit::cpu {

namespace {
Status probe() {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.os_saves_zmm)) {
    return Unsupported("CPU lacks AVX-512 F/BW/VL (has: ", describe(f), ")");
  }
  if (!f.avx512bf16) return Unsupported("CPU lacks AVX-512 BF16 (has: ", describe(f), ")");
  return Status::Ok();
}
}  // namespace

void register_fused_moe_avx512(Registry& r);  // src/ops/fused_moe/fused_moe_avx512.cpp
void register_fused_moe_avx512_fp8(Registry& r);  // src/ops/fused_moe/fused_moe_avx512_fp8.cpp

void register_kernels(Registry& r) {
  r.set_backend_probe(Backend::cpu, probe);
  register_fused_moe_avx512(r);
  register_fused_moe_avx512_fp8(r);
}

}  // namespace moekit::cpu
