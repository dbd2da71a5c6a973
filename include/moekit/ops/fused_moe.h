// moekit/ops/fused_moe.h: the fused expert computation (SPEC 3) [ck_moe, asm_moe, asm_moe_tkw1,
// fmoe_fp8_blockscale_g1u1].
//
//   h = w1[e] . x_t (f32)      g = h[0:I], u = h[I:2I]      a = act(g) * u   (g1u0: a = act(h))
//   y_t = sum_j w_tj * (w2[e_tj] . a)      f32 sum over k, one rounding to out's dtype at the end
// The variant is picked from the data, in this order (SPEC 6):
//   fp8 w1/w2 and scale_block_n/k > 0       -> fp8_block      (bn x bk weight blocks, 1 x bk activation
//                                                              groups; DeepSeek-V3: 128 x 128)
//   fp8 w1/w2 and weight_on_input           -> fp8_row_tkw1   (k == 1)
//   fp8 w1/w2 otherwise                     -> fp8_row        (per-row or per-tensor weight scales,
//                                                              dynamic per-token activations)
//   w1/w2 of x's dtype                      -> unquantized
// Gate mode is read from the shapes: w1 rows == 2*I is g1u1, == I is g1u0 (I = w2.shape[2]).
// Expert ids are GLOBAL; with expert_mask / expert_map remote experts are skipped (SPEC 3.5) and a
// token whose experts are all remote gets a zero row; an id of -1 is skipped.
//
// Router weight on the input (weight_on_input, SPEC 3.4): every variant applies w to g and u in f32
// right after the first GEMM (after dequantization for fp8), i.e. y = w2 . (act(w*g) * (w*u)) with
// no weight at the end. Because the first GEMM is linear this equals scaling x by w first (SPEC 6.4)
// up to f32 rounding, without rounding w*x to x's dtype or moving the fp8 activation scale.
//
// Validation (validate_fused_moe) checks every argument before anything is written, including a scan
// of the ids / mask / map values when they live on the host (device tensors are checked by the
// kernel, SPEC 2). Error messages name the argument and show the bad value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

enum class Activation : uint8_t { silu, gelu, gelu_tanh };
// "silu", "gelu", "gelu_tanh".
const char* activation_name(Activation a);
// Parses the names above (also "swiglu" = silu, "gelu_erf" = gelu).
bool parse_activation(const char* s, Activation* out);

struct FusedMoeParams {
  TensorView x;             // [T, H] bf16|f16|f32 (row stride may exceed H; last dim contiguous)
  TensorView w1;            // [E, 2I, H] (g1u1) or [E, I, H] (g1u0), contiguous: x's dtype, or
                            //   fp8_e4m3fn; layout row_major or shuffled_16x16 (N1 % 16, H % 32)
                            //   or cpu_vnni2_n32 (pack_weight; bf16/f16, N1 % 32, H % 2)
  TensorView w2;            // [E, H, I] contiguous: same dtype and layout as w1 (shuffled: H % 16,
                            //   I % 32; cpu_vnni2_n32: H % 32, I % 2)
  TensorView topk_ids;      // [T, k] i32 contiguous, global expert ids in [-1, Eg)
  TensorView topk_weights;  // [T, k] f32 contiguous
  TensorView out;           // [T, H] x's dtype (row stride may exceed H); only written when valid
  TensorView w1_scale;      // fp8 only, f32 contiguous: [E] per-tensor | [E, N1] or [E, N1, 1]
                            //   per-row | [E, ceil(N1/bn), ceil(H/bk)] block      (N1 = w1 rows)
  TensorView w2_scale;      // fp8 only, f32 contiguous: [E] | [E, H] or [E, H, 1] |
                            //   [E, ceil(H/bn), ceil(I/bk)]
  TensorView a1_scale;      // fp8_row / fp8_row_tkw1 only, optional [1] f32: static activation scale
                            //   for x (the intermediate is always quantized dynamically)
  TensorView expert_mask;   // [Eg] i32 0/1, optional; E == sum(mask); local id = cumsum(mask)[g]-1
  TensorView expert_map;    // [Eg] i32 local index in [-1, E), optional (not together with the mask)
  Activation activation = Activation::silu;
  bool weight_on_input = false;   // tkw1: k must be 1; y = w2 . (act(w*g) * (w*u)), no final weight
  int scale_block_n = 0;          // fp8 block scale: block height along N (128 for DeepSeek-V3)
  int scale_block_k = 0;          //   and width along K; both 0 = not block-scaled
  bool round_intermediate = true; // unquantized: round a to x's dtype before the down projection
                                  //   (what bf16 GPU kernels do); false keeps it in f32. fp8
                                  //   variants ignore it (a is re-quantized to fp8).
  const char* config = nullptr;   // set by the front door (fused_moe etc.) from RunOptions::config or
                                  //   MOEKIT_FUSED_MOE_CONFIG for the kernels that take configs; a
                                  //   caller's value is replaced
};

// The variant SPEC 6 picks for these params (validation is separate). Inline: the backends' kernels
// call it too, and they link below the front doors.
inline MoeVariant fused_moe_variant(const FusedMoeParams& p) {
  if (!is_fp8(p.w1.dtype)) return MoeVariant::unquantized;
  if (p.scale_block_n > 0 || p.scale_block_k > 0) return MoeVariant::fp8_block;
  return p.weight_on_input ? MoeVariant::fp8_row_tkw1 : MoeVariant::fp8_row;
}

Status fused_moe(const FusedMoeParams& p, const RunOptions& opts = {});
Status validate_fused_moe(const FusedMoeParams& p);
// Bytes of workspace the kernel selected for p needs. Host kernels get a front-door allocation when
// the caller passes none; pass RunOptions::workspace to keep the call allocation-free. Checks the
// shapes, dtypes and scales of p but not the VALUES of ids / mask / map (they may not be filled yet).
Status fused_moe_workspace_size(const FusedMoeParams& p, const RunOptions& opts, size_t* bytes);
// The name of the kernel fused_moe would run for p and opts (the registry's rule, MOEKIT_* env
// included), without running it: what an engine logs ("which kernel runs"). Same checks as above.
Status fused_moe_kernel_name(const FusedMoeParams& p, const RunOptions& opts, std::string* name);
// The configs (RunOptions::config names) the kernel fused_moe would run for p can run, the one it
// would run first (its rules' pick, or the explicit config resolved); empty when that kernel takes
// no configs (docs/fused_moe_configs.md). Same checks as fused_moe_workspace_size.
Status fused_moe_configs(const FusedMoeParams& p, const RunOptions& opts, std::vector<std::string>* names);

// Shape facts derived from validated params.
struct MoeDims {
  int64_t T, H, I, E, Eg, k;
  int64_t N1;   // rows of w1: 2I (g1u1) or I (g1u0)
  bool g1u1;
};
// Header-only so that every backend can use it without depending on the front doors.
inline MoeDims moe_dims(const FusedMoeParams& p) {
  MoeDims d{};
  d.T = p.x.ndim == 2 ? p.x.shape[0] : 0;
  d.H = p.x.ndim == 2 ? p.x.shape[1] : 0;
  d.I = p.w2.ndim == 3 ? p.w2.shape[2] : 0;
  d.E = p.w1.ndim == 3 ? p.w1.shape[0] : 0;
  d.N1 = p.w1.ndim == 3 ? p.w1.shape[1] : 0;
  d.k = p.topk_ids.ndim == 2 ? p.topk_ids.shape[1] : 0;
  d.Eg = p.expert_mask.present() ? p.expert_mask.shape[0]
                                 : (p.expert_map.present() ? p.expert_map.shape[0] : d.E);
  d.g1u1 = d.N1 == 2 * d.I;
  return d;
}

}  // namespace moekit
