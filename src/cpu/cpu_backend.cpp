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
void register_topk_softmax_avx512(Registry& r);    // src/ops/topk_softmax/topk_softmax_avx512.cpp
void register_grouped_topk_avx512(Registry& r);    // src/ops/grouped_topk/grouped_topk_avx512.cpp
void register_sigmoid_topk_avx512(Registry& r);    // src/ops/sigmoid_topk/sigmoid_topk_avx512.cpp
void register_sort_tokens_avx512(Registry& r);     // src/ops/sort_tokens/sort_tokens_avx512.cpp
void register_quantize_fp8_avx512(Registry& r);    // src/ops/quantize_fp8/quantize_fp8_avx512.cpp
void register_convert_fp8_avx512(Registry& r);     // src/ops/convert_fp8/convert_fp8_avx512.cpp
void register_shuffle_weight_avx512(Registry& r);  // src/ops/shuffle_weight/shuffle_weight_avx512.cpp

void register_kernels(Registry& r) {
  r.set_backend_probe(Backend::cpu, probe);
  register_fused_moe_avx512(r);
  register_fused_moe_avx512_fp8(r);
  register_topk_softmax_avx512(r);
  register_grouped_topk_avx512(r);
  register_sigmoid_topk_avx512(r);
  register_sort_tokens_avx512(r);
  register_quantize_fp8_avx512(r);
  register_convert_fp8_avx512(r);
  register_shuffle_weight_avx512(r);  // shuffle_weight_avx512 and unshuffle_weight_avx512
}

}  // namespace moekit::cpu
