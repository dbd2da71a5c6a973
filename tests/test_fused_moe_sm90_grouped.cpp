// fused_moe_sm90_grouped (src/ops/fused_moe/fused_moe_sm90_grouped.cu): the prefill HMMA kernel of
// the unquantized variant, checked against the reference kernel fused_moe_ref under the
// kernel_vs_ref row of docs/tolerances.md. Named edge cases first (routing corner cases, expert
// parallelism, every activation, g1u0, weight_on_input, row strides, f16, partial tiles,
// determinism), then the model presets at T in {1, 64, 512}, then the refusals of supports().
// Every GPU case poisons `out` (0xAB) first, so an element the kernel never writes shows up.
// Without a CUDA device (or without the CUDA backend compiled) the GPU cases GTEST_SKIP; the
// refusal cases only need the kernel compiled in.
// Run: ./build/tests/moekit_tests --gtest_filter='FusedMoeSm90Grouped.*'
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/device_facts.h"
#include "fused_moe_test_util.h"
#include "ops/fused_moe/fused_moe_heuristic.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"
#include "cuda/sm90/wgmma_desc.h"
#include "testing/harness.h"
#include "testing/oracle_fused_moe.h"

namespace moekit::testing {
namespace {

using moe_test::make;
using moe_test::small_shape;

constexpr const char* kKernel = "fused_moe_sm90_grouped";

// True when the kernel is compiled in and a CUDA device is usable; *why says why not.
bool cuda_ready(std::string* why) {
  if (registry().find(kKernel) == nullptr) {
    *why = "fused_moe_sm90_grouped not compiled (MOEKIT_CUDA off)";
    return false;
  }
  const Status st = registry().backend_available(Backend::cuda);
  if (!st.ok()) {
    *why = "CUDA backend unavailable: " + st.to_string();
    return false;
  }
  return true;
}
#define REQUIRE_CUDA()                              \
  do {                                              \
    std::string why_;                               \
    if (!cuda_ready(&why_)) GTEST_SKIP() << why_;   \
  } while (0)

std::string describe(const MoeProblem& prob) {
  std::ostringstream os;
  os << prob.shape.label << " T=" << prob.shape.T << " Eg=" << prob.shape.E << " E=" << prob.E
     << " k=" << prob.shape.k << " H=" << prob.shape.H << " I=" << prob.shape.I << ' '
     << (prob.opts.g1u1 ? "g1u1" : "g1u0") << ' ' << dtype_name(prob.x_dtype) << ' '
     << activation_name(prob.shape.activation) << (prob.shape.weight_on_input ? " weight_on_input" : "")
     << " row_pad=" << prob.opts.row_pad;
  return os.str();
}

// The reference kernel's output on the host problem.
std::vector<double> ref_out(MoeProblem& prob) {
  FusedMoeParams p = prob.params();
  RunOptions o;
  o.kernel = "fused_moe_ref";
  const Status st = fused_moe(p, o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return read_out(p.out);
}

// Runs the kernel on a device mirror of prob (out poisoned with 0xAB first) and reads its output
// back into prob.out. Returns the call's status.
Status run_kernel(MoeProblem& prob, std::vector<double>* y) {
  prob.out.fill_bytes(0xAB);
  FusedMoeParams p = prob.params();
  DeviceMirror m(Backend::cuda);
  for (TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights, &p.expert_mask, &p.expert_map}) {
    MOEKIT_RETURN_IF_ERROR(m.input(t));
  }
  MOEKIT_RETURN_IF_ERROR(m.output(&p.out));
  RunOptions o;
  o.kernel = kKernel;
  size_t ws = 0;
  MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(p, o, &ws));
  MOEKIT_RETURN_IF_ERROR(m.scratch(ws, &o.workspace));
  o.workspace_bytes = ws;
  MOEKIT_RETURN_IF_ERROR(fused_moe(p, o));
  MOEKIT_RETURN_IF_ERROR(m.copy_back());
  *y = read_out(prob.params().out);
  return Status::Ok();
}

void expect_close(const MoeProblem& prob, const std::vector<double>& actual, const std::vector<double>& expected) {
  const MoeTolerance& tol = moe_tolerance(MoeVariant::unquantized, prob.x_dtype, MoeCompare::kernel_vs_ref);
  Metrics m;
  std::string detail;
  EXPECT_TRUE(judge_moe(actual, expected, prob.shape.T, prob.shape.H, tol, &m, &detail))
      << describe(prob) << " | " << detail << " | worst " << m.worst;
}

// The reference kernel's output for tokens [t0, t0 + n) only (views narrowed to those rows): the
// reference is per token, so this equals the same rows of the full run at a fraction of the cost.
std::vector<double> ref_rows(MoeProblem& prob, int64_t t0, int64_t n) {
  FusedMoeParams p = prob.params();
  for (TensorView* v : {&p.x, &p.out, &p.topk_ids, &p.topk_weights}) {
    v->data = static_cast<unsigned char*>(v->data) + t0 * v->stride[0] * dtype_size(v->dtype);
    v->shape[0] = n;
  }
  RunOptions o;
  o.kernel = "fused_moe_ref";
  const Status st = fused_moe(p, o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return read_out(p.out);
}

// Reference first (host), then the kernel, then the comparison. Above kSampleAbove tokens the
// reference covers the first and last kSampleRows / 2 tokens (the kernel still runs all of them,
// so routing, tiling and partial tiles are those of the full T) to keep the test fast.
constexpr int64_t kSampleAbove = 128, kSampleRows = 128;
void expect_matches_ref(MoeProblem& prob) {
  const int64_t T = prob.shape.T, H = prob.shape.H;
  if (T <= kSampleAbove) {
    const std::vector<double> expected = ref_out(prob);
    std::vector<double> actual;
    const Status st = run_kernel(prob, &actual);
    ASSERT_TRUE(st.ok()) << describe(prob) << ": " << st.to_string();
    expect_close(prob, actual, expected);
    return;
  }
  const int64_t half = kSampleRows / 2;
  std::vector<double> expected = ref_rows(prob, 0, half);
  const std::vector<double> tail = ref_rows(prob, T - half, half);
  expected.insert(expected.end(), tail.begin(), tail.end());
  std::vector<double> full;
  const Status st = run_kernel(prob, &full);
  ASSERT_TRUE(st.ok()) << describe(prob) << ": " << st.to_string();
  std::vector<double> actual(full.begin(), full.begin() + half * H);
  actual.insert(actual.end(), full.end() - half * H, full.end());
  const MoeTolerance& tol = moe_tolerance(MoeVariant::unquantized, prob.x_dtype, MoeCompare::kernel_vs_ref);
  Metrics m;
  std::string detail;
  EXPECT_TRUE(judge_moe(actual, expected, kSampleRows, H, tol, &m, &detail))
      << describe(prob) << " (tokens [0, " << half << ") and [" << T - half << ", " << T << ")) | " << detail
      << " | worst " << m.worst;
}

// Row t of y [T, H] is exactly zero.
void expect_zero_row(const std::vector<double>& y, int64_t t, int64_t H) {
  for (int64_t c = 0; c < H; ++c) ASSERT_EQ(y[size_t(t * H + c)], 0.0) << "token " << t << " column " << c;
}

// ---------------------------------------------------------------- edge cases
TEST(FusedMoeSm90Grouped, TZeroLaunchesNothing) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::bf16, 0, 6, 2, 128, 128));
  std::vector<double> y;
  ASSERT_TRUE(run_kernel(prob, &y).ok());
  EXPECT_TRUE(y.empty());
}

TEST(FusedMoeSm90Grouped, TOne) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::bf16, 1, 6, 2, 128, 128));
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, MoreExpertsThanTokensENotPowerOfTwo) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::bf16, 2, 13, 3, 128, 64));
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, AllTokensToOneExpertSeveralTiles) {
  REQUIRE_CUDA();
  // 300 rows on one expert: three M tiles, the last one partial.
  MoeProblem prob = make(small_shape(Scheme::bf16, 300, 6, 1, 128, 128));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  for (int64_t i = 0; i < prob.topk_ids.numel(); ++i) ids[i] = 4;
  update_touched(&prob);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, EmptyExpertsAreNeverRead) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::bf16, 2, 16, 2, 128, 64));
  const int64_t per1 = prob.N1 * prob.shape.H, per2 = prob.shape.H * prob.shape.I;
  for (int64_t e = 0; e < prob.E; ++e) {
    if (prob.touched[size_t(e)]) continue;
    for (int64_t i = 0; i < per1; ++i) prob.w1.set(e * per1 + i, std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < per2; ++i) prob.w2.set(e * per2 + i, std::numeric_limits<float>::quiet_NaN());
  }
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, MinusOneIdsAndAllSkippedTokenGetsZeroRow) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::bf16, 9, 6, 2, 128, 128));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  ids[0 * 2 + 1] = -1;  // token 0: one slot unused
  ids[3 * 2 + 0] = -1;  // token 3: both unused -> zero row
  ids[3 * 2 + 1] = -1;
  update_touched(&prob);
  const std::vector<double> expected = ref_out(prob);
  std::vector<double> actual;
  ASSERT_TRUE(run_kernel(prob, &actual).ok());
  expect_close(prob, actual, expected);
  expect_zero_row(actual, 3, prob.shape.H);
}

TEST(FusedMoeSm90Grouped, IdsOutsideRangeAreSkippedOnTheDevice) {
  REQUIRE_CUDA();
  // Device ids are not scanned by the front door: ids < -1 or >= Eg must be skipped like -1.
  MoeProblem prob = make(small_shape(Scheme::bf16, 9, 6, 2, 128, 128));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  ids[1 * 2 + 0] = -1;
  ids[5 * 2 + 1] = -1;
  update_touched(&prob);
  const std::vector<double> expected = ref_out(prob);
  ids[1 * 2 + 0] = 6;       // == Eg
  ids[5 * 2 + 1] = -7;
  std::vector<double> actual;
  ASSERT_TRUE(run_kernel(prob, &actual).ok());
  expect_close(prob, actual, expected);
}

TEST(FusedMoeSm90Grouped, ExpertMask) {
  REQUIRE_CUDA();
  MoeProblemOptions o;
  o.local_experts = 5;
  o.ep = ExpertParallel::mask;
  MoeProblem prob = make(small_shape(Scheme::bf16, 40, 12, 3, 128, 128), o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, ExpertMap) {
  REQUIRE_CUDA();
  MoeProblemOptions o;
  o.local_experts = 5;
  o.ep = ExpertParallel::map;
  MoeProblem prob = make(small_shape(Scheme::bf16, 40, 12, 3, 128, 128), o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, G1U0) {
  REQUIRE_CUDA();
  MoeProblemOptions o;
  o.g1u1 = false;
  MoeProblem prob = make(small_shape(Scheme::bf16, 37, 6, 2, 128, 128), o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, EveryActivationG1U1AndG1U0) {
  REQUIRE_CUDA();
  for (Activation a : {Activation::silu, Activation::gelu, Activation::gelu_tanh}) {
    for (bool g1u1 : {true, false}) {
      MoeShape s = small_shape(Scheme::bf16, 33, 6, 2, 128, 192);
      s.activation = a;
      MoeProblemOptions o;
      o.g1u1 = g1u1;
      MoeProblem prob = make(s, o);
      expect_matches_ref(prob);
    }
  }
}

TEST(FusedMoeSm90Grouped, WeightOnInputKOne) {
  REQUIRE_CUDA();
  MoeShape s = small_shape(Scheme::bf16, 50, 6, 1, 128, 128);
  s.weight_on_input = true;
  MoeProblem prob = make(s);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, RowStridedXAndOutLeavePaddingUntouched) {
  REQUIRE_CUDA();
  MoeProblemOptions o;
  o.row_pad = 24;
  MoeProblem prob = make(small_shape(Scheme::bf16, 21, 6, 2, 128, 64), o);
  expect_matches_ref(prob);
  const int64_t H = prob.shape.H, stride = H + o.row_pad;
  for (int64_t t = 0; t < prob.shape.T; ++t) {
    for (int64_t c = H; c < stride; ++c) {
      for (int b = 0; b < 2; ++b) {
        ASSERT_EQ(prob.out.bytes[size_t((t * stride + c) * 2 + b)], 0xAB) << "padding of row " << t << " written";
      }
    }
  }
}

TEST(FusedMoeSm90Grouped, F16) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::f16, 70, 6, 2, 192, 128));
  expect_matches_ref(prob);
  MoeProblemOptions o;
  o.g1u1 = false;
  MoeProblem prob0 = make(small_shape(Scheme::f16, 70, 6, 2, 192, 128), o);
  expect_matches_ref(prob0);
}

TEST(FusedMoeSm90Grouped, PartialNTilesHAndINotMultiplesOf128) {
  REQUIRE_CUDA();
  // H = 192: the second GEMM-2 N tile is half empty; I = 320: g1u0's last N tile is half empty.
  for (bool g1u1 : {true, false}) {
    MoeProblemOptions o;
    o.g1u1 = g1u1;
    MoeProblem prob = make(small_shape(Scheme::bf16, 45, 6, 2, 192, 320), o);
    expect_matches_ref(prob);
  }
}

TEST(FusedMoeSm90Grouped, RowsAroundTheM16CutsOf64RowTiles) {
  REQUIRE_CUDA();
  // BM = 64 tiles multiply only the m16 tiles holding rows (1 up to 16 rows, 2 up to 32, else 4):
  // experts with 16, 17, 32, 33 and 1 rows, expert 5 empty.
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(99, 6) == 64, "covers the BM = 64 tiles");
  MoeProblem prob = make(small_shape(Scheme::bf16, 99, 6, 1, 128, 128));
  moe_test::assign_expert_rows(&prob, {16, 17, 32, 33, 1});
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, PartialNTilesWith128RowMTiles) {
  REQUIRE_CUDA();
  // 800 rows over 6 experts: BM = 128 (the case above runs BM = 64), partial M and N tiles.
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(400 * 2, 6) == 128, "covers the BM = 128 tiles");
  for (bool g1u1 : {true, false}) {
    MoeProblemOptions o;
    o.g1u1 = g1u1;
    MoeProblem prob = make(small_shape(Scheme::bf16, 400, 6, 2, 192, 320), o);
    expect_matches_ref(prob);
  }
}

TEST(FusedMoeSm90Grouped, AllTokensToOneExpert128RowMTiles) {
  REQUIRE_CUDA();
  // 700 rows on one expert with BM = 128: six M tiles, the last one partial (60 rows).
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(700, 6) == 128, "covers the BM = 128 tiles");
  MoeProblem prob = make(small_shape(Scheme::bf16, 700, 6, 1, 128, 128));
  int32_t* ids = prob.topk_ids.data<int32_t>();
  for (int64_t i = 0; i < prob.topk_ids.numel(); ++i) ids[i] = 2;
  update_touched(&prob);
  expect_matches_ref(prob);
}

// The BM = 128 kernels (TMA + wgmma, fused_moe_sm90_grouped_tma.cuh) in f16, g1u1 and g1u0, with a
// partial last N tile in both GEMMs (I = 320: gemm1 N tile 2 holds 64 of 128 columns; H = 192).
TEST(FusedMoeSm90Grouped, F16With128RowMTiles) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(400 * 2, 6) == 128, "covers the BM = 128 tiles");
  for (bool g1u1 : {true, false}) {
    MoeProblemOptions o;
    o.g1u1 = g1u1;
    MoeProblem prob = make(small_shape(Scheme::f16, 400, 6, 2, 192, 320), o);
    expect_matches_ref(prob);
  }
}

// BM = 128 with K loops longer than the 4-stage pipeline (gemm1 K = H = 1024: 16 slices, every
// stage slot reused 4 times; gemm2 K = I = 256) and several N tiles in both GEMMs.
TEST(FusedMoeSm90Grouped, LongKLoops128RowMTiles) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(200 * 2, 3) == 128, "covers the BM = 128 tiles");
  MoeProblem prob = make(small_shape(Scheme::bf16, 200, 3, 2, 1024, 256));
  expect_matches_ref(prob);
}

// The 128 x 256 TMA gemms on the dynamic schedule (fused_moe_sm90_grouped_ws_dynamic: N >= 4096): gemm2
// alone (H = 4096, gemm1 N = 2 I = 512 in the static order), then gemm1 alone (I = 2048, g1u1: N =
// 4096; gemm2 N = H = 256), each with several items per CTA of the H200's 132; bf16, then f16.
TEST(FusedMoeSm90Grouped, DynamicSchedule128RowMTiles) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(300 * 2, 3) == 128, "covers the BM = 128 tiles");
  static_assert(fused_moe_sm90_grouped_ws_dynamic(4096) && !fused_moe_sm90_grouped_ws_dynamic(512) &&
                    !fused_moe_sm90_grouped_ws_dynamic(256),
                "one gemm dynamic, the other static");
  for (Scheme sc : {Scheme::bf16, Scheme::f16}) {
    for (auto [h, inter] : {std::pair{4096, 256}, std::pair{256, 2048}}) {
      SCOPED_TRACE(std::string(scheme_name(sc)) + " H " + std::to_string(h) + " I " + std::to_string(inter));
      MoeProblem prob = make(small_shape(sc, 300, 3, 2, h, inter));
      expect_matches_ref(prob);
    }
  }
}

// The persistent TMA kernels (BM = 128) with the router weight on the input (the epilogue reads w
// through row_entry) and with remote experts skipped by an expert map (tiles only for local ones;
// more work items than CTAs would be needed on a small GPU, and several per CTA here).
TEST(FusedMoeSm90Grouped, WeightOnInput128RowMTiles) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(600, 4) == 128, "covers the BM = 128 tiles");
  MoeShape s = small_shape(Scheme::bf16, 600, 4, 1, 256, 384);
  s.weight_on_input = true;
  MoeProblem prob = make(s);
  expect_matches_ref(prob);
}

// BM = 128 tiles around the warpgroup cut (64 rows): experts with 64, 65, 1, 192 (a tail of 64)
// and 129 (a tail of 1) rows, expert 5 empty; H = 192 (3 K slices in gemm1). I = 384 runs gemm2 in
// one K range, I = 640 in two (fused_moe_sm90_grouped_gemm2_splits).
TEST(FusedMoeSm90Grouped, TailTilesAndSplitKGemm2) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(451, 6) == 128, "covers the BM = 128 tiles");
  static_assert(cuda::fused_moe_sm90_grouped_gemm2_splits(4 + 6, 1, 384 / 64, kH200Facts.sm_count) ==
                    1, "one K range");
  static_assert(cuda::fused_moe_sm90_grouped_gemm2_splits(4 + 6, 1, 640 / 64, kH200Facts.sm_count) ==
                    2, "two K ranges");
  for (int inter : {384, 640}) {
    MoeProblem prob = make(small_shape(Scheme::bf16, 451, 6, 1, 192, inter));
    moe_test::assign_expert_rows(&prob, {64, 65, 1, 192, 129});
    expect_matches_ref(prob);
  }
}

// gemm2 in two K ranges with an odd number of K slices (I = 576: 4 + 5), k = 2, g1u1 and g1u0.
TEST(FusedMoeSm90Grouped, SplitKGemm2OddSlices) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(400 * 2, 6) == 128, "covers the BM = 128 tiles");
  static_assert(cuda::fused_moe_sm90_grouped_gemm2_splits(7 + 6, 1, 576 / 64, kH200Facts.sm_count) ==
                    2, "two K ranges");
  for (bool g1u1 : {true, false}) {
    MoeProblemOptions o;
    o.g1u1 = g1u1;
    MoeProblem prob = make(small_shape(Scheme::bf16, 400, 6, 2, 192, 576), o);
    expect_matches_ref(prob);
  }
}

TEST(FusedMoeSm90Grouped, ExpertMap128RowMTiles) {
  REQUIRE_CUDA();
  static_assert(cuda::fused_moe_sm90_grouped_tile_m(500 * 2, 8) == 128, "covers the BM = 128 tiles");
  MoeProblemOptions o;
  o.local_experts = 3;
  o.ep = ExpertParallel::map;
  MoeProblem prob = make(small_shape(Scheme::bf16, 500, 8, 2, 128, 256), o);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, ManyTokensManyTilesPerExpert) {
  REQUIRE_CUDA();
  for (uint64_t seed : {1, 2}) {
    MoeProblem prob = make(small_shape(Scheme::bf16, 1000, 6, 2, 128, 128), {}, seed);
    expect_matches_ref(prob);
  }
}

TEST(FusedMoeSm90Grouped, DeterministicBitIdenticalReruns) {
  REQUIRE_CUDA();
  MoeProblem prob = make(small_shape(Scheme::bf16, 500, 8, 2, 128, 128));
  std::vector<double> y1, y2;
  ASSERT_TRUE(run_kernel(prob, &y1).ok());
  const std::vector<unsigned char> first = prob.out.bytes;
  ASSERT_TRUE(run_kernel(prob, &y2).ok());
  EXPECT_EQ(prob.out.bytes, first);
}

// ---------------------------------------------------------------- presets
void check_preset(const char* model, int64_t T) {
  ShapeRequest req;
  req.model = model;
  req.scheme = Scheme::bf16;
  req.scheme_given = true;
  MoeShape s;
  const Status st = resolve_shape(req, T, &s);
  ASSERT_TRUE(st.ok()) << st.to_string();
  MoeProblem prob = make(s);
  expect_matches_ref(prob);
}

TEST(FusedMoeSm90Grouped, PresetMixtralSmall) {
  REQUIRE_CUDA();
  for (int64_t T : {1, 64, 512}) check_preset("mixtral", T);
}

TEST(FusedMoeSm90Grouped, PresetQwen3MoeSmall) {
  REQUIRE_CUDA();
  for (int64_t T : {1, 64, 512}) check_preset("qwen3-moe", T);
}

TEST(FusedMoeSm90Grouped, PresetDeepseekV3Small) {
  REQUIRE_CUDA();
  for (int64_t T : {1, 64, 512}) check_preset("deepseek-v3", T);
}

// ---------------------------------------------------------------- refusals (no device needed)
// The kernel's supports() on prob's params with every tensor marked as a device tensor (supports
// reads shapes, dtypes, layouts and pointers only).
Status supports_on_device(MoeProblem& prob, void (*edit)(FusedMoeParams&)) {
  FusedMoeParams p = prob.params();
  for (TensorView* t : {&p.x, &p.w1, &p.w2, &p.topk_ids, &p.topk_weights, &p.out, &p.expert_mask, &p.expert_map}) {
    if (t->present()) t->device = Device::cuda;
  }
  if (edit != nullptr) edit(p);
  return registry().find(kKernel)->supports(&p);
}

#define REQUIRE_COMPILED()                                                                          \
  do {                                                                                              \
    if (registry().find(kKernel) == nullptr) GTEST_SKIP() << "fused_moe_sm90_grouped not compiled"; \
  } while (0)

void expect_refused(MoeProblem& prob, void (*edit)(FusedMoeParams&), const char* needle) {
  const Status st = supports_on_device(prob, edit);
  ASSERT_FALSE(st.ok()) << "expected a refusal naming '" << needle << "'";
  EXPECT_NE(st.to_string().find(needle), std::string::npos) << st.to_string();
}

TEST(FusedMoeSm90Grouped, TileMSelectionByRowsPerExpert) {
  // Pure host rule: 128-row M tiles from 64 expected rows per expert (T*k / Eg) on, else 64.
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(0, 8), 64);
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(64 * 8 - 1, 8), 64);
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(64 * 8, 8), 128);
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(512 * 8, 256), 64);    // deepseek-v3 T=512
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(4096 * 8, 256), 128);  // deepseek-v3 T=4096
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(512 * 2, 8), 128);     // mixtral T=512
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_tile_m(100, 0), 128);         // Eg = 0 guarded
}

TEST(FusedMoeSm90Grouped, Gemm2SplitsByWorkListLength) {
  // Pure host rule: Mixtral T = 512 (<= 16 M tiles x 16 N tiles, 224 K slices) splits, T = 4096 not.
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_gemm2_splits(16, 16, 224, kH200Facts.sm_count), 2);
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_gemm2_splits(72, 16, 224, kH200Facts.sm_count), 1);
  EXPECT_EQ(cuda::fused_moe_sm90_grouped_gemm2_splits(16, 16, 7, kH200Facts.sm_count), 1);
}

TEST(FusedMoeSm90Grouped, MainloopSelectionRule) {
  // Pure host rule: the TMA + wgmma kernels for the 128-row M tiles, mma.sync for the 64-row ones.
  EXPECT_TRUE(cuda::fused_moe_sm90_grouped_uses_tma(128));
  EXPECT_FALSE(cuda::fused_moe_sm90_grouped_uses_tma(64));
}

TEST(FusedMoeSm90Grouped, WgmmaDescriptorFields) {
  // Hand-computed: start = addr >> 4 (bits 0-13), leading byte offset 16 B -> 1 (bits 16-29),
  // stride byte offset 1024 B -> 64 (bits 32-45), base offset 0 (bits 49-51), 128B swizzle = 1
  // (bits 62-63).
  using cuda::sm90::wgmma_desc_sw128;
  EXPECT_EQ(wgmma_desc_sw128(0), 0x4000004000010000ull);
  EXPECT_EQ(wgmma_desc_sw128(0x400), 0x4000004000010040ull);
  EXPECT_EQ(wgmma_desc_sw128(0x30400), 0x4000004000013040ull);  // 197 632: the top of a 193 KiB smem
  // A k16 step (+32 bytes) adds 2 to the start field only, as the mainloop assumes.
  EXPECT_EQ(wgmma_desc_sw128(0x400 + 32), wgmma_desc_sw128(0x400) + 2);
  EXPECT_EQ(wgmma_desc_sw128(0x400 + 96), wgmma_desc_sw128(0x400) + 6);
  // Field by field for an arbitrary aligned address.
  const uint64_t d = wgmma_desc_sw128(0x1C400);
  EXPECT_EQ(d & 0x3FFFu, 0x1C400u >> 4);
  EXPECT_EQ((d >> 16) & 0x3FFFu, 1u);
  EXPECT_EQ((d >> 32) & 0x3FFFu, 64u);
  EXPECT_EQ((d >> 49) & 0x7u, 0u);
  EXPECT_EQ(d >> 62, 1u);
  // Bits above the 18-bit shared window are dropped (the field holds addr[17:4]).
  EXPECT_EQ(wgmma_desc_sw128(0x40000 + 0x400), wgmma_desc_sw128(0x400));
}

TEST(FusedMoeSm90Grouped, AcceptsSupportedProblem) {
  REQUIRE_COMPILED();
  MoeProblem prob = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 128));
  const Status st = supports_on_device(prob, nullptr);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(FusedMoeSm90Grouped, RefusesHostTensors) {
  REQUIRE_COMPILED();
  MoeProblem prob = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 128));
  FusedMoeParams p = prob.params();
  const Status st = registry().find(kKernel)->supports(&p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("x"), std::string::npos) << st.to_string();
}

TEST(FusedMoeSm90Grouped, RefusesF32) {
  REQUIRE_COMPILED();
  MoeProblem prob = make(small_shape(Scheme::f32, 4, 6, 2, 128, 128));
  expect_refused(prob, nullptr, "x: needs bf16 or f16");
}

TEST(FusedMoeSm90Grouped, RefusesShuffledWeights) {
  REQUIRE_COMPILED();
  MoeProblemOptions o;
  o.shuffled = true;
  MoeProblem prob = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 128), o);
  expect_refused(prob, nullptr, "w1: needs layout row_major");
}

TEST(FusedMoeSm90Grouped, RefusesHAndINotMultiplesOf64) {
  REQUIRE_COMPILED();
  MoeProblem ph = make(small_shape(Scheme::bf16, 4, 6, 2, 96, 128));
  expect_refused(ph, nullptr, "x: hidden size H must be a multiple of 64");
  MoeProblem pi = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 96));
  expect_refused(pi, nullptr, "w2: intermediate size I must be a multiple of 64");
}

TEST(FusedMoeSm90Grouped, RefusesLargeKAndE) {
  REQUIRE_COMPILED();
  MoeProblem prob = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 128));
  expect_refused(prob, [](FusedMoeParams& p) { p.topk_ids.shape[1] = 33; }, "topk_ids: k must be <= 32");
  expect_refused(prob, [](FusedMoeParams& p) { p.w1.shape[0] = 1025; }, "w1: local experts E must be <= 1024");
}

TEST(FusedMoeSm90Grouped, RefusesUnroundedIntermediate) {
  REQUIRE_COMPILED();
  MoeProblemOptions o;
  o.round_intermediate = false;
  MoeProblem prob = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 128), o);
  expect_refused(prob, nullptr, "round_intermediate");
}

TEST(FusedMoeSm90Grouped, RefusesMisalignedXRows) {
  REQUIRE_COMPILED();
  MoeProblemOptions o;
  o.row_pad = 3;
  MoeProblem prob = make(small_shape(Scheme::bf16, 4, 6, 2, 128, 128), o);
  expect_refused(prob, nullptr, "x: rows must be 16-byte aligned");
}

}  // namespace
}  // namespace moekit::testing
