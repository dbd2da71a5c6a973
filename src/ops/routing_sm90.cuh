// Device helpers shared by the Hopper routing kernels (SPEC 1): src/ops/topk_softmax/
// topk_softmax_sm90.cu, src/ops/grouped_topk/grouped_topk_sm90.cu, src/ops/sigmoid_topk/
// sigmoid_topk_sm90.cu. CUDA-only header. Tests: tests/test_{topk_softmax,grouped_topk,
// sigmoid_topk}.cpp (Cuda* cases, compared with the ref kernels through the check harness).
//
// Layout: one warp per token row. A row of Eg <= 32*VPT logits lives in registers, lane l holding
// elements e = i*32 + l for i < VPT (coalesced loads). Elements e >= Eg are padding: -inf and
// marked taken, so no selection ever returns them.
//
// The arithmetic mirrors src/ref/ref_topk.h step for step (f32, NaN -> -inf, expf(x - max), sum,
// divide, the +inf / all -inf special cases), so the values match the reference up to the order of
// the f32 sum (a warp tree here, a sequential loop there) and the last ulp of expf; every selection
// uses the same (value desc, id asc) order with NaN ranked as -inf.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.h"
#include "moekit/core/dtype.h"
#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"

namespace moekit::cuda::routing {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;  // rows per CTA (128 threads)
constexpr int kMaxExperts = 512;   // Eg limit of the register-resident row (16 per lane)

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Element i of a gating row as f32 (bf16 / f16 widened exactly).
__device__ __forceinline__ float load_logit(const void* row, DType dt, int i) {
  if (dt == DType::f32) return static_cast<const float*>(row)[i];
  const unsigned short bits = static_cast<const unsigned short*>(row)[i];
  if (dt == DType::bf16) return __uint_as_float(uint32_t(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// NaN -> -inf (SPEC 1: a NaN logit or score counts as -inf).
__device__ __forceinline__ float clean(float v) { return isnan(v) ? neg_inf() : v; }

// Same formula as ref::sigmoid_f32: exp only of a non-positive argument; NaN -> 0.
__device__ __forceinline__ float sigmoid_f32(float x) {
  if (isnan(x)) return 0.0f;
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A selection candidate: rank (higher first; `tier` before value), value, id (lower wins ties).
// tier carries grouped_topk's "eligible experts first" rule; the other ops use tier 0 everywhere.
struct Cand {
  int tier;
  float v;  // never NaN (callers clean it)
  int id;   // -1 = none
};

__device__ __forceinline__ bool better(const Cand& a, const Cand& b) {
  if (a.id < 0) return false;
  if (b.id < 0) return true;
  if (a.tier != b.tier) return a.tier > b.tier;
  if (a.v != b.v) return a.v > b.v;
  return a.id < b.id;
}

// The best candidate of the warp (every lane gets it).
__device__ __forceinline__ Cand warp_best(Cand c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Cand other;
    other.tier = __shfl_xor_sync(0xffffffffu, c.tier, o);
    other.v = __shfl_xor_sync(0xffffffffu, c.v, o);
    other.id = __shfl_xor_sync(0xffffffffu, c.id, o);
    if (better(other, c)) c = other;
  }
  return c;
}

// Loads row `row` (cleaned logits) into v[]; padding elements get -inf. Returns the mask of
// padding slots (bit i set: element i*32 + lane does not exist).
template <int VPT>
__device__ __forceinline__ uint32_t load_row(const void* gating, DType dt, int64_t row_stride, int64_t row, int Eg,
                                             int lane, float (&v)[VPT]) {
  const int esize = dt == DType::f32 ? 4 : 2;
  const void* base = static_cast<const char*>(gating) + row * row_stride * esize;
  uint32_t pad = 0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int e = i * kWarp + lane;
    if (e < Eg) {
      v[i] = clean(load_logit(base, dt, e));
    } else {
      v[i] = neg_inf();
      pad |= 1u << i;
    }
  }
  return pad;
}

// In-place softmax of a register row with ref::softmax_row's rules: +inf logits share the mass,
// a row with no logit above -inf is all 0, else expf(x - max) / sum. Padding holds -inf and ends
// at 0 (it adds nothing to the sum and never counts as +inf).
template <int VPT>
__device__ __forceinline__ void softmax_row(float (&v)[VPT]) {
  float mx = neg_inf();
#pragma unroll
  for (int i = 0; i < VPT; ++i) mx = fmaxf(mx, v[i]);
  mx = warp_max(mx);
  if (isinf(mx)) {
    // NOTE: x - max is NaN for x = max = +-inf, so both cases are spelled out (as in the ref).
    int n_pos = 0;
#pragma unroll
    for (int i = 0; i < VPT; ++i) n_pos += (mx > 0.0f && v[i] == mx) ? 1 : 0;
    n_pos = warp_sum_int(n_pos);
    const float share = n_pos > 0 ? 1.0f / float(n_pos) : 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) v[i] = (mx > 0.0f && v[i] == mx) ? share : 0.0f;
    return;
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    v[i] = expf(v[i] - mx);
    sum += v[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < VPT; ++i) v[i] = v[i] / sum;  // sum >= 1: the max entry contributes exp(0)
}

// The best not-yet-taken element of this lane (ids ascending within a lane, so a strict compare
// keeps the lower id on ties). tier[i] is given per element through the `tier_bits` mask.
template <int VPT>
__device__ __forceinline__ Cand lane_best(const float (&v)[VPT], uint32_t taken, uint32_t tier_bits, int lane) {
  Cand best{0, 0.0f, -1};
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (taken & (1u << i)) continue;
    const Cand c{int((tier_bits >> i) & 1u), v[i], i * kWarp + lane};
    if (better(c, best)) best = c;
  }
  return best;
}

// The VPT instance for Eg (smallest power of two with 32*VPT >= Eg), as a launch switch.
inline int values_per_lane(int64_t Eg) {
  int vpt = 1;
  while (vpt * kWarp < Eg) vpt *= 2;
  return vpt;
}

// supports() part shared by the routing kernels: a row of up to kMaxExperts logits per warp.
inline Status check_row_fits(const char* kernel, int64_t Eg) {
  if (Eg > kMaxExperts) {
    return Unsupported(kernel, ": Eg must be <= ", kMaxExperts, " (one register row per warp), got ", Eg);
  }
  return Status::Ok();
}

// The one launch switch of the routing kernels: calls launch(std::integral_constant<int, VPT>{})
// with VPT = values_per_lane(Eg) in {1, 2, 4, 8, 16} (Eg <= 512 is checked by supports()).
template <class Launch>
void with_values_per_lane(int64_t Eg, Launch&& launch) {
  switch (values_per_lane(Eg)) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 8: launch(std::integral_constant<int, 8>{}); break;
    default: launch(std::integral_constant<int, 16>{}); break;
  }
}

// The fields every routing kernel's arguments start with (each op's Args derives from it and adds
// its own after them): the gating rows and the problem's sizes.
struct RowArgs {
  const void* gating;
  DType dtype;
  int64_t row_stride;  // elements
  int64_t T;
  int Eg, k;
};

// a's RowArgs fields for gating [T, Eg] (rows strided) and k picks per row.
inline void set_row_args(RowArgs& a, const TensorView& gating, int k) {
  a.gating = gating.data;
  a.dtype = gating.dtype;
  a.row_stride = gating.stride[0];
  a.T = gating.shape[0];
  a.Eg = int(gating.shape[1]);
  a.k = k;
}

// Launches kernel(vpt) (the kernel's instance for std::integral_constant<int, VPT>, with_values_per_lane)
// over a.T rows, a warp each, on stream s; nothing for T = 0. Launch errors name `what`.
template <class A, class Pick>
Status launch_rows(const A& a, cudaStream_t s, const char* what, Pick kernel) {
  if (a.T == 0) return Status::Ok();
  with_values_per_lane(a.Eg, [&](auto vpt) {
    kernel(vpt)<<<ceil_div(a.T, kWarpsPerBlock), kWarp * kWarpsPerBlock, 0, s>>>(a);
  });
  return last_launch(what);
}

}  // namespace moekit::cuda::routing
