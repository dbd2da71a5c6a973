// The independent float64 oracle of fused_moe (SPEC 3), the shared fused-MoE problem generator and
// the tolerance table (docs/tolerances.md), used by tests/test_fused_moe*.cpp, `moekit check` and
// `moekit bench` (src/testing/check_fused_moe.cpp), so a benchmarked shape is a tested shape.
//
// Oracle: a DENSE formulation. It builds the routing matrix R [T, E] (local experts; R[t, e] = sum
// of the router weights of the slots of t that land on e; -1 ids and remote experts add nothing),
// dequantizes each expert's weights into float64 matrices (code value x scale, whatever the scale
// granularity), evaluates the expert FFN for the tokens of R's column in float64 and combines
// y = sum_e R[:, e] * FFN_e(X). Zero entries of R are skipped (their term is exactly 0). fp8
// variants use the UNQUANTIZED activations, so ref-vs-oracle includes the activation quantization
// error. Router weight on the input is applied by scaling x (SPEC 6.4) where the reference scales
// g and u (SPEC 3.4): the comparison checks that the two forms agree. The one rounding the oracle
// reproduces is the documented round_intermediate of the unquantized variant (a -> x's dtype).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/ops/fused_moe.h"
#include "testing/harness.h"

namespace moekit::testing {

// ---------------------------------------------------------------- problem generator
enum class ExpertParallel : uint8_t { none, mask, map };

struct MoeProblemOptions {
  bool g1u1 = true;
  bool shuffled = false;            // weights in the shuffled_16x16 layout (needs N%16, K%32)
  bool round_intermediate = true;   // FusedMoeParams::round_intermediate
  int64_t local_experts = 0;        // E held here; 0 = all of shape.E (then ep must be none)
  ExpertParallel ep = ExpertParallel::none;  // how the local subset is described
  int64_t row_pad = 0;              // x / out row stride = H + row_pad
  bool static_a1_scale = false;     // fp8_tensor / fp8_channel: pass a static a1_scale
  int block = 128;                  // fp8_block: block height along N (and width along K unless block_k)
  int block_k = 0;                  // fp8_block: block width along K; 0 = block
};

// An owned fused-MoE problem: buffers plus the FusedMoeParams viewing them.
struct MoeProblem {
  MoeShape shape;                   // T, Eg (= shape.E), k, H, I, scheme, activation, ...
  MoeProblemOptions opts;
  int64_t E = 0, N1 = 0;            // local experts, rows of w1
  DType x_dtype = DType::bf16;
  Buffer x, out;                    // [T, H + row_pad]
  Buffer w1, w2;                    // [E, N1, H], [E, H, I] (fp8 codes or x's dtype)
  Buffer w1_scale, w2_scale, a1_scale;  // fp8 only
  Buffer topk_ids, topk_weights;    // [T, k]
  Buffer expert_mask, expert_map;   // [Eg] (both filled when local_experts < Eg; params pass one)
  std::vector<bool> touched;        // [E] local experts some token routes to
  std::vector<bool> filled;         // [E] experts whose weights hold generated values
  uint64_t seed = 0;

  // Views over the buffers (out writable). Rebuilt on each call, so edits to buffers show.
  FusedMoeParams params();
};

// Random problem: x ~ N(0, 1); w1 rows ~ U with std 1/sqrt(H), w2 rows std 1/sqrt(I), each
// expert and row scaled by a factor in [0.5, 1.5] (so per-tensor / per-row scales differ); fp8
// weights are those values quantized per tensor / per row / per block x block_k (local helper,
// scale = max(amax, floor) / 448). Routing: softmax top-k of N(0, 1) logits over shape.E global
// experts (renormalized per shape, times shape.rsf); weight_on_input: sigmoid of the top-1 logit.
// Weights of local experts no token uses stay 0 (the presets hold up to 176M weights).
// Errors for unsupported combinations (e.g. weight_on_input with k != 1).
Status make_moe_problem(const MoeShape& s, const MoeProblemOptions& o, uint64_t seed, MoeProblem* out);

// After a test edited topk_ids / mask / map: recomputes `touched` and generates the weights of
// experts that became touched (deterministic in (seed, expert), as make_moe_problem does).
void update_touched(MoeProblem* p);

// ---------------------------------------------------------------- oracle
struct OracleOptions {
  // fp8 variants: quantize-dequantize x and the intermediate exactly as SPEC 3.2 / 3.3 prescribe
  // (per token / per group / static a1_scale, e4m3fn RNE) in float64 instead of using them
  // unquantized. The difference to the reference is then only f32-vs-float64 arithmetic, which
  // pins the quantization recipe itself (MoeCompare::ref_vs_emulation).
  bool emulate_fp8_activations = false;
};

// y [T * H] in float64 for valid host params p (see the top of this file).
std::vector<double> oracle_fused_moe(const FusedMoeParams& p, const OracleOptions& o = {});

// ---------------------------------------------------------------- tolerances (docs/tolerances.md)
// kernel_tc_vs_ref: a kernel whose fp8 GEMMs sum long K loops (thousands) in sm_90's e4m3 wgmma,
// which accumulates with fewer bits than f32 (docs/tolerances.md; used by the long-K tests).
enum class MoeCompare : uint8_t { ref_vs_oracle, ref_vs_emulation, kernel_vs_ref, kernel_tc_vs_ref };

struct MoeTolerance {
  MoeVariant variant;
  DType x_dtype;        // unquantized: x/out dtype; fp8 variants: f32 means "any x dtype"
  MoeCompare compare;
  // Elementwise bound |a - e| <= atol_rms * rms(expected) + rtol * |e| (used when rtol > 0), which
  // at most a fraction max_bad of the elements may exceed (0 = every element).
  double rtol, atol_rms, max_bad;
  // Similarity bounds (always checked): cosine >= min_cosine, rms(a)/rms(e) in [rms_lo, rms_hi].
  double min_cosine, rms_lo, rms_hi;
};

// Every number is explained in docs/tolerances.md (one row there per row here).
inline constexpr MoeTolerance kMoeTolerances[] = {
    // variant                 x dtype      compare                       rtol    atol_rms max_bad min_cos   rms range
    {MoeVariant::unquantized, DType::f32, MoeCompare::ref_vs_oracle, 1e-4, 1e-4, 0, 0.999999, 0.9999, 1.0001},
    {MoeVariant::unquantized, DType::bf16, MoeCompare::ref_vs_oracle, 8e-3, 8e-3, 0, 0.99999, 0.995, 1.005},
    {MoeVariant::unquantized, DType::f16, MoeCompare::ref_vs_oracle, 1e-3, 1e-3, 0, 0.999999, 0.999, 1.001},
    {MoeVariant::fp8_row, DType::f32, MoeCompare::ref_vs_oracle, 0, 0, 0, 0.995, 0.95, 1.05},
    {MoeVariant::fp8_row_tkw1, DType::f32, MoeCompare::ref_vs_oracle, 0, 0, 0, 0.995, 0.95, 1.05},
    {MoeVariant::fp8_block, DType::f32, MoeCompare::ref_vs_oracle, 0, 0, 0, 0.995, 0.95, 1.05},
    {MoeVariant::fp8_row, DType::f32, MoeCompare::ref_vs_emulation, 8e-3, 8e-3, 0.05, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_row_tkw1, DType::f32, MoeCompare::ref_vs_emulation, 8e-3, 8e-3, 0.05, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_block, DType::f32, MoeCompare::ref_vs_emulation, 8e-3, 8e-3, 0.05, 0.9995, 0.995, 1.005},
    {MoeVariant::unquantized, DType::f32, MoeCompare::kernel_vs_ref, 2e-4, 2e-4, 0, 0.99999, 0.999, 1.001},
    {MoeVariant::unquantized, DType::bf16, MoeCompare::kernel_vs_ref, 1.6e-2, 1.6e-2, 0, 0.9999, 0.99, 1.01},
    {MoeVariant::unquantized, DType::f16, MoeCompare::kernel_vs_ref, 2e-3, 2e-3, 0, 0.99999, 0.998, 1.002},
    {MoeVariant::fp8_row, DType::f32, MoeCompare::kernel_vs_ref, 1.6e-2, 1.6e-2, 0.05, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_row_tkw1, DType::f32, MoeCompare::kernel_vs_ref, 1.6e-2, 1.6e-2, 0.05, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_block, DType::f32, MoeCompare::kernel_vs_ref, 1.6e-2, 1.6e-2, 0.05, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_row, DType::f32, MoeCompare::kernel_tc_vs_ref, 1.6e-2, 1.6e-2, 0.12, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_row_tkw1, DType::f32, MoeCompare::kernel_tc_vs_ref, 1.6e-2, 1.6e-2, 0.12, 0.9995, 0.995, 1.005},
    {MoeVariant::fp8_block, DType::f32, MoeCompare::kernel_tc_vs_ref, 1.6e-2, 1.6e-2, 0.12, 0.9995, 0.995, 1.005},
};

// The row of kMoeTolerances for (variant, x dtype, compare).
const MoeTolerance& moe_tolerance(MoeVariant v, DType x_dtype, MoeCompare c);

// Compares an output [T, H] against its reference under tol: fills *m (compare_close metrics plus
// cosine / rms ratio / finiteness) and *detail (the bound used, or why it failed); returns ok.
bool judge_moe(const std::vector<double>& actual, const std::vector<double>& expected, int64_t T, int64_t H,
               const MoeTolerance& tol, Metrics* m, std::string* detail);

// Runs fused_moe(prob.params(), opts) and judges its output against the oracle (ref_vs_oracle,
// or kernel-independent: the table row of the problem's variant) and, for fp8 variants, also
// against the emulating oracle (ref_vs_emulation). Returns ok; *detail says what was compared.
bool run_against_oracle(MoeProblem& prob, const RunOptions& opts, std::string* detail);

// Reads out [T, H] (row-strided) as doubles.
std::vector<double> read_out(const TensorView& out);

// Points p's tensors at device copies held by dev: every input (x, weights, routing, scales, mask,
// map) and out (copied back by dev.copy_back()). Absent tensors stay absent.
Status mirror_fused_moe(DeviceMirror& dev, FusedMoeParams* p);

}  // namespace moekit::testing
