// sigmoid_topk Hopper kernel (SPEC 1.3, contract include/moekit/ops/routing.h): one warp per token
// row, the cleaned raw logits in registers, k rounds of warp argmax, weight = sigmoid(pick).
// Deterministic always (no atomics). Test: tests/test_sigmoid_topk.cpp (Cuda*), compared with
// sigmoid_topk_ref through check_sigmoid_topk (src/testing/check_routing.cpp).
//
// NaN logits rank as -inf (weight 0), ties go to the lower id, -inf picks weigh 0 and +inf picks 1
// (the reference's sigmoid_f32 formula). Eg <= 512, k <= Eg, any row stride.
#include <cstdint>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_utils.h"
#include "moekit/ops/routing.h"
#include "ops/routing_sm90.cuh"

namespace moekit::cuda {

namespace {

using namespace routing;

struct Args : RowArgs {
  float* weights;
  int32_t* ids;
};

template <int VPT>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock) sigmoid_topk_kernel(const Args a) {
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= a.T) return;  // whole warp leaves together

  float x[VPT];
  uint32_t taken = load_row<VPT>(a.gating, a.dtype, a.row_stride, row, a.Eg, lane, x);
  const int64_t out = row * a.k;
  for (int j = 0; j < a.k; ++j) {
    const Cand c = warp_best(lane_best<VPT>(x, taken, 0u, lane));
    if ((c.id & (kWarp - 1)) == lane) taken |= 1u << (c.id / kWarp);
    if (lane == 0) {
      a.ids[out + j] = c.id;
      a.weights[out + j] = sigmoid_f32(c.v);
    }
  }
}

Status supports(const SigmoidTopkParams& p) {
  MOEKIT_RETURN_IF_ERROR(
      require_device({{"gating", &p.gating}, {"topk_weights", &p.topk_weights}, {"topk_ids", &p.topk_ids}}));
  return check_row_fits("sigmoid_topk_sm90", p.gating.shape[1]);
}

Status run(const SigmoidTopkParams& p, const RunContext& ctx) {
  Args a;
  set_row_args(a, p.gating, p.k);
  a.weights = p.topk_weights.ptr<float>();
  a.ids = p.topk_ids.ptr<int32_t>();
  return launch_rows(a, static_cast<cudaStream_t>(ctx.stream), "sigmoid_topk_sm90",
                     [](auto vpt) { return sigmoid_topk_kernel<decltype(vpt)::value>; });
}

}  // namespace

void register_sigmoid_topk_sm90(Registry& r) {
  r.add({"sigmoid_topk_sm90", OpKind::sigmoid_topk, MoeVariant::none, Backend::cuda,
         "gating f32|bf16|f16 (Eg <= 512) -> f32 weights, i32 ids; f32 math, warp per row", 100,
         erase_supports<SigmoidTopkParams, supports>, nullptr, erase_run<SigmoidTopkParams, run>});
}

}  // namespace moekit::cuda
