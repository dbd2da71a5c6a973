// grouped_topk Hopper kernel (SPEC 1.2, contract include/moekit/ops/routing.h; DeepSeek-V2/V3
// routing): one warp per token row. Deterministic always (no atomics, fixed shuffle orders).
// Test: tests/test_grouped_topk.cpp (Cuda*), compared with grouped_topk_ref through
// check_grouped_topk (src/testing/check_routing.cpp).
//
// Per row, the reference's steps in the same f32 arithmetic:
//   1. s = softmax(row) (routing_sm90.cuh rules) or sigmoid(logit) (NaN -> 0), in registers;
//   2. b = s + bias (or s), NaN -> -inf; s and b also go to the warp's shared-memory row, since a
//      group of G = Eg / n_group consecutive experts spans several lanes;
//   3. group score (one lane per group, a sequential walk over the group): the sum of the two
//      largest b with a bias (G = 1: that b), the largest b without; NaN -> -inf;
//   4. topk_group rounds of warp argmax over the group scores (ties to the lower group);
//   5. k rounds of warp argmax over the experts, kept groups first (tier 1), then b, then id;
//   6. weights = s of the picks, summed in pick order, renormalized unless the sum is 0, times rsf.
// Eg <= 512 (16 logits per lane), any n_group dividing Eg, k <= topk_group * G, any row stride.
#include <cstdint>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_utils.h"
#include "moekit/ops/routing.h"
#include "ops/routing_sm90.cuh"

namespace moekit::cuda {

namespace {

using namespace routing;

struct Args : RowArgs {
  int n_group, topk_group;
  bool sigmoid;
  bool renormalize;
  float rsf;
  const float* bias;  // nullptr when absent
  float* weights;
  int32_t* ids;
};

struct WarpRow {
  float s[kMaxExperts];      // unbiased scores (the weights)
  float b[kMaxExperts];      // selection scores
  float group[kMaxExperts];  // group scores; reused for the picks' weights in step 6
  unsigned char kept[kMaxExperts];
};

template <int VPT>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock) grouped_topk_kernel(const Args a) {
  __shared__ WarpRow s_rows[kWarpsPerBlock];
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= a.T) return;  // whole warp leaves together
  WarpRow& sh = s_rows[warp];
  const int G = a.Eg / a.n_group;

  // 1-2. scores and selection scores.
  float v[VPT];
  uint32_t taken = load_row<VPT>(a.gating, a.dtype, a.row_stride, row, a.Eg, lane, v);
  if (a.sigmoid) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) v[i] = sigmoid_f32(v[i]);  // cleaned -inf -> 0, as NaN -> 0
  } else {
    softmax_row<VPT>(v);
  }
  float b[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * kWarp + lane;
    b[i] = neg_inf();
    if (e < a.Eg) {
      b[i] = clean(a.bias ? v[i] + a.bias[e] : v[i]);
      sh.s[e] = v[i];
      sh.b[e] = b[i];
    }
  }
  __syncwarp();

  // 3. group scores, one lane per group.
  for (int g = lane; g < a.n_group; g += kWarp) {
    const float* bg = sh.b + g * G;
    float score;
    if (a.bias && G >= 2) {
      float m1 = neg_inf(), m2 = neg_inf();  // the two largest, as the reference's top-2 picks
      for (int i = 0; i < G; ++i) {
        const float x = bg[i];
        if (x > m1) {
          m2 = m1;
          m1 = x;
        } else if (x > m2) {
          m2 = x;
        }
      }
      score = m1 + m2;
    } else if (a.bias) {
      score = bg[0];
    } else {
      score = neg_inf();
      for (int i = 0; i < G; ++i) score = fmaxf(score, bg[i]);
    }
    sh.group[g] = clean(score);
    sh.kept[g] = 0;
  }
  __syncwarp();

  // 4. kept groups. Lane l owns groups i*32 + l (n_group <= Eg <= 512, so i < 16).
  uint32_t g_taken = 0;
  for (int j = 0; j < a.topk_group; ++j) {
    Cand best{0, 0.0f, -1};
    for (int i = 0; i * kWarp + lane < a.n_group; ++i) {
      if (g_taken & (1u << i)) continue;
      const int g = i * kWarp + lane;
      const Cand c{0, sh.group[g], g};
      if (better(c, best)) best = c;
    }
    best = warp_best(best);
    if ((best.id & (kWarp - 1)) == lane) g_taken |= 1u << (best.id / kWarp);
    if (lane == 0) sh.kept[best.id] = 1;
  }
  __syncwarp();

  // 5. experts: kept groups first (tier 1), masked experts at -inf.
  uint32_t tier = 0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * kWarp + lane;
    if (e < a.Eg && sh.kept[e / G]) {
      tier |= 1u << i;
    } else {
      b[i] = neg_inf();
    }
  }
  __syncwarp();  // every lane has read sh.group before it is reused below
  const int64_t out = row * a.k;
  float sum = 0.0f;
  for (int j = 0; j < a.k; ++j) {
    const Cand c = warp_best(lane_best<VPT>(b, taken, tier, lane));
    if ((c.id & (kWarp - 1)) == lane) taken |= 1u << (c.id / kWarp);
    const float s = sh.s[c.id];
    sum += s;  // pick order, as the reference
    if (lane == 0) {
      a.ids[out + j] = c.id;
      sh.group[j] = s;
    }
  }
  __syncwarp();

  // 6. weights.
  for (int j = lane; j < a.k; j += kWarp) {
    float w = sh.group[j];
    if (a.renormalize && sum > 0.0f) w /= sum;
    a.weights[out + j] = w * a.rsf;
  }
}

Status supports(const GroupedTopkParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_device({{"gating", &p.gating},
                                         {"correction_bias", &p.correction_bias},
                                         {"topk_weights", &p.topk_weights},
                                         {"topk_ids", &p.topk_ids}}));
  return check_row_fits("grouped_topk_sm90", p.gating.shape[1]);
}

Status run(const GroupedTopkParams& p, const RunContext& ctx) {
  Args a;
  set_row_args(a, p.gating, p.k);
  a.n_group = p.n_group;
  a.topk_group = p.topk_group;
  a.sigmoid = p.scoring == Scoring::sigmoid;
  a.renormalize = p.renormalize;
  a.rsf = p.routed_scaling_factor;
  a.bias = p.correction_bias.present() ? p.correction_bias.ptr<float>() : nullptr;
  a.weights = p.topk_weights.ptr<float>();
  a.ids = p.topk_ids.ptr<int32_t>();
  return launch_rows(a, static_cast<cudaStream_t>(ctx.stream), "grouped_topk_sm90",
                     [](auto vpt) { return grouped_topk_kernel<decltype(vpt)::value>; });
}

}  // namespace

void register_grouped_topk_sm90(Registry& r) {
  r.add({"grouped_topk_sm90", OpKind::grouped_topk, MoeVariant::none, Backend::cuda,
         "gating f32|bf16|f16 (Eg <= 512), bias f32 -> f32 weights, i32 ids; f32 math, warp per row", 100,
         erase_supports<GroupedTopkParams, supports>, nullptr, erase_run<GroupedTopkParams, run>});
}

}  // namespace moekit::cuda
