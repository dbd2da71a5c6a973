// moekit/ops/fused_moe.h: the fused expert computation (SPEC 3) [ck_moe, asm_moe, asm_moe_tkw1,
// fmoe_fp8_blockscale_g1u1].
//
//   h = w1[e] . x_t (f32)      g = h[0:I], u = h[I:2I]      a = act(g) * u   (g1u0: a = act(h))
//   y_t = sum_j w_tj * (w2[e_tj] . a)      one rounding to out's dtype at the end
// The variant is picked from the data, in this order (SPEC 6):
//   fp8 w1/w2 and scale_block_n/k > 0       -> fp8_block      (128x128 weight blocks, 1x128 act groups)
//   fp8 w1/w2 and weight_on_input           -> fp8_row_tkw1   (k == 1)
//   fp8 w1/w2 otherwise                     -> fp8_row        (per-row or per-tensor weight scales,
//                                                              dynamic per-token activations)
//   w1/w2 of x's dtype                      -> unquantized
// Gate mode is read from the shapes: w1 rows == 2*I is g1u1, == I is g1u0 (I = w2.shape[2]).
// Expert ids are GLOBAL; with expert_mask / expert_map remote experts are skipped (SPEC 3.5) and a
// token whose experts are all remote gets a zero row; an id of -1 is skipped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/core/tensor_view.h"
#include "moekit/registry.h"

namespace moekit {

enum class Activation : uint8_t { silu, gelu, gelu_tanh };
const char* activation_name(Activation a);
bool parse_activation(const char* s, Activation* out);

struct FusedMoeParams {
  TensorView x;             // [T, H] bf16|f16|f32 (row stride may exceed H; last dim contiguous)
  TensorView w1;            // [E, 2I, H] (g1u1) or [E, I, H] (g1u0): x's dtype, or fp8_e4m3fn;
                            //   layout row_major or shuffled_16x16
  TensorView w2;            // [E, H, I]: same dtype and layout as w1
  TensorView topk_ids;      // [T, k] i32 global expert ids in [-1, Eg)
  TensorView topk_weights;  // [T, k] f32
  TensorView out;           // [T, H] x's dtype (row stride may exceed H)
  TensorView w1_scale;      // fp8 only, f32: [E] per-tensor | [E, N1] or [E, N1, 1] per-row |
                            //   [E, ceil(N1/bn), ceil(H/bk)] block      (N1 = w1 rows)
  TensorView w2_scale;      // fp8 only, f32: [E] | [E, H] or [E, H, 1] | [E, ceil(H/bn), ceil(I/bk)]
  TensorView a1_scale;      // fp8_row / tkw1 only, optional [1] f32: static activation scale
  TensorView expert_mask;   // [Eg] i32 0/1, optional; E == sum(mask)
  TensorView expert_map;    // [Eg] i32 local index or -1, optional (not together with the mask)
  Activation activation = Activation::silu;
  bool weight_on_input = false;   // tkw1: k must be 1; y = w2 . (act(w*g) * (w*u)), no final weight
  int scale_block_n = 0;          // fp8 block scale: 128 x 128 (0, 0 = not block-scaled)
  int scale_block_k = 0;
  bool round_intermediate = true; // unquantized: round a to x's dtype before the down projection
                                  //   (what bf16 GPU kernels do); false keeps it in f32
};

// The variant SPEC 6 picks for these params (validation is separate).
MoeVariant fused_moe_variant(const FusedMoeParams& p);

Status fused_moe(const FusedMoeParams& p, const RunOptions& opts = {});
Status validate_fused_moe(const FusedMoeParams& p);
// Bytes of workspace the kernel selected for p needs (0 for most host kernels).
Status fused_moe_workspace_size(const FusedMoeParams& p, const RunOptions& opts, size_t* bytes);

// Shape facts derived from validated params.
struct MoeDims {
  int64_t T, H, I, E, Eg, k;
  bool g1u1;
};
MoeDims moe_dims(const FusedMoeParams& p);

}  // namespace moekit
