// topk_softmax Hopper kernel (SPEC 1.1, contract include/moekit/ops/routing.h): one warp per token
// row, the row's softmax in registers, then k rounds of warp argmax. Deterministic always (no
// atomics; every reduction has a fixed shuffle order). Test: tests/test_topk_softmax.cpp (Cuda*),
// compared with topk_softmax_ref through check_topk_softmax (src/testing/check_routing.cpp).
//
// Per row: logits widened to f32 (NaN -> -inf), softmax with the reference's rules (routing_sm90.cuh),
// then for j < k: the warp's best untaken p (ties to the lower id), written as pick j. With
// renormalize the picks wait in shared memory until their sum (accumulated in pick order, like the
// reference) is known. Eg <= 512 (16 logits per lane), k <= Eg, any row stride.
#include <cstdint>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_utils.h"
#include "moekit/ops/routing.h"
#include "ops/routing_sm90.cuh"

namespace moekit::cuda {

namespace {

using namespace routing;

struct Args : RowArgs {
  bool renormalize;
  float* weights;
  int32_t* ids;
  int32_t* tei;  // nullptr when absent
};

template <int VPT>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock) topk_softmax_kernel(const Args a) {
  __shared__ float s_pick[kWarpsPerBlock][kMaxExperts];  // picks awaiting the renormalize sum
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= a.T) return;  // whole warp leaves together

  float p[VPT];
  uint32_t taken = load_row<VPT>(a.gating, a.dtype, a.row_stride, row, a.Eg, lane, p);
  softmax_row<VPT>(p);

  const int64_t out = row * a.k;
  float sum = 0.0f;
  for (int j = 0; j < a.k; ++j) {
    const Cand c = warp_best(lane_best<VPT>(p, taken, 0u, lane));
    // k <= Eg, so an untaken real element always exists and c.id >= 0.
    if ((c.id & (kWarp - 1)) == lane) taken |= 1u << (c.id / kWarp);
    sum += c.v;  // same value in every lane: the reference's sequential sum over the picks
    if (lane == 0) {
      a.ids[out + j] = c.id;
      if (a.tei) a.tei[out + j] = int32_t(int64_t(j) * a.T + row);
      if (a.renormalize) {
        s_pick[warp][j] = c.v;
      } else {
        a.weights[out + j] = c.v;
      }
    }
  }
  if (a.renormalize) {
    __syncwarp();
    for (int j = lane; j < a.k; j += kWarp) {
      float w = s_pick[warp][j];
      if (sum > 0.0f) w /= sum;
      a.weights[out + j] = w;
    }
  }
}

Status supports(const TopkSoftmaxParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_device({{"gating", &p.gating},
                                         {"topk_weights", &p.topk_weights},
                                         {"topk_ids", &p.topk_ids},
                                         {"token_expert_indices", &p.token_expert_indices}}));
  return check_row_fits("topk_softmax_sm90", p.gating.shape[1]);
}

Status run(const TopkSoftmaxParams& p, const RunContext& ctx) {
  Args a;
  set_row_args(a, p.gating, p.k);
  a.renormalize = p.renormalize;
  a.weights = p.topk_weights.ptr<float>();
  a.ids = p.topk_ids.ptr<int32_t>();
  a.tei = p.token_expert_indices.present() ? p.token_expert_indices.ptr<int32_t>() : nullptr;
  return launch_rows(a, static_cast<cudaStream_t>(ctx.stream), "topk_softmax_sm90",
                     [](auto vpt) { return topk_softmax_kernel<decltype(vpt)::value>; });
}

}  // namespace

void register_topk_softmax_sm90(Registry& r) {
  r.add({"topk_softmax_sm90", OpKind::topk_softmax, MoeVariant::none, Backend::cuda,
         "gating f32|bf16|f16 (Eg <= 512) -> f32 weights, i32 ids; f32 math, warp per row", 100,
         erase_supports<TopkSoftmaxParams, supports>, nullptr, erase_run<TopkSoftmaxParams, run>});
}

}  // namespace moekit::cuda
