// CPU backend registration: the backend probe (any x86-64) and the CPU kernel table. The probe no
// longer asks for AVX-512: each AVX-512 kernel's supports() checks the CPU itself
// (moe::require_avx512, naming the missing feature), so the portable kernels (fused_moe_cpu_generic*)
// serve CPUs without AVX-512 BF16.
#include "cpu/cpu_backend.h"

#include "cpu/cpu_features.h"
#include "ops/fused_moe/fused_moe_cpu.h"

namespace moekit::cpu {

namespace {
Status probe() {
#if defined(__x86_64__) || defined(_M_X64)
  return Status::Ok();
#else
  return Unsupported("the CPU backend needs an x86-64 CPU");
#endif
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
void register_fused_moe_avx512_fp8_block(Registry& r);  // src/ops/fused_moe/fused_moe_avx512_fp8_block.cpp
void register_fused_moe_cpu_generic(Registry& r);  // src/ops/fused_moe/fused_moe_cpu_generic.cpp
void register_pack_weight_cpu(Registry& r);        // src/ops/pack_weight/pack_weight_cpu.cpp

void register_kernels(Registry& r) {
  r.set_backend_probe(Backend::cpu, probe);
  // NOTE: fused_moe_avx512_bf16's supports() does not check the CPU yet (its file is being
  // rewritten elsewhere): it is registered only where it can run. Once its supports() calls
  // moe::require_avx512(..., cpu_features(), true), register it unconditionally.
  if (moe::require_avx512("fused_moe_avx512_bf16", cpu_features(), true).ok()) register_fused_moe_avx512(r);
  register_fused_moe_avx512_fp8(r);
  // The routing / sorting / quantizer / shuffle kernels (cpu_simd.h: AVX-512 F/BW/VL) do not check
  // the CPU in supports(): registered only where they can run; elsewhere the ref kernels serve.
  if (moe::require_avx512("cpu avx512 op kernels", cpu_features(), false).ok()) {
    register_topk_softmax_avx512(r);
    register_grouped_topk_avx512(r);
    register_sigmoid_topk_avx512(r);
    register_sort_tokens_avx512(r);
    register_quantize_fp8_avx512(r);
    register_convert_fp8_avx512(r);
    register_shuffle_weight_avx512(r);  // shuffle_weight_avx512 and unshuffle_weight_avx512
  }
  register_fused_moe_avx512_fp8_block(r);
  register_fused_moe_cpu_generic(r);
  register_pack_weight_cpu(r);  // pack_weight_cpu and unpack_weight_cpu (portable)
}

}  // namespace moekit::cpu
