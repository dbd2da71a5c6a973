// Pieces shared by the two halves of the unfused cuBLAS baseline of fused_moe: the bf16 / f16 path
// (moe_baseline_cublas.cu) and the fp8 path (moe_baseline_cublas_fp8.cu). Contract and steps:
// moe_baseline_cublas.h. Test: tests/test_moe_baseline_cublas.cpp (MoeBaselineCublas.*).
// CUDA-only header: include only from .cu files.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/moe_baseline_cublas.h"

namespace moekit::cuda::baseline_detail {

inline constexpr size_t kCublasWorkspace = size_t(32) << 20;  // NVIDIA's recommendation for Hopper
inline constexpr int kThreads = 256;

inline Status check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return BackendError(what, ": ", cublasGetStatusString(s));
}

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// Same formulas as the reference (src/ops/fused_moe/fused_moe_ref.h, activation()).
__device__ __forceinline__ float activate(int act, float z) {
  if (act == int(Activation::silu)) return z / (1.0f + expf(-z));
  if (act == int(Activation::gelu)) return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
  const float c = 0.79788456080286536f;  // sqrt(2 / pi)
  return 0.5f * z * (1.0f + tanhf(c * (z + 0.044715f * z * z * z)));
}

// Step 5: out[t, c] = sum over j in order of w_tj * y[slot_row[t * k + j], c] (f32), one rounding.
template <class T>
__global__ void weighted_sum(const T* __restrict__ y, int64_t H, const int32_t* __restrict__ slot_row,
                             const float* __restrict__ topk_w, int k, bool weight_on_input, T* __restrict__ out,
                             int64_t out_stride) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t row = slot_row[t * k + j];
      if (row < 0) continue;
      const float w = weight_on_input ? 1.0f : topk_w[t * k + j];
      acc += w * to_f32(y[int64_t(row) * H + c]);
    }
    out[t * out_stride + c] = from_f32<T>(acc);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline Status require_cuda(const TensorView& t, const char* name) {
  if (t.device != Device::cuda) return Unsupported("moe_baseline_cublas: ", name, " must be a device tensor, got ", t.describe());
  return Status::Ok();
}

// The weight checks both paths make: w1 / w2 row_major, w1 / w2 / topk_weights contiguous.
inline Status check_weight_layout(const FusedMoeParams& p) {
  if (p.w1.layout != Layout::row_major || p.w2.layout != Layout::row_major) {
    return Unsupported("moe_baseline_cublas: w1 / w2 must be row_major (shuffled layouts are not GEMM operands)");
  }
  if (!p.w1.is_contiguous() || !p.w2.is_contiguous() || !p.topk_weights.is_contiguous()) {
    return Unsupported("moe_baseline_cublas: w1, w2 and topk_weights must be contiguous");
  }
  return Status::Ok();
}

// The shape checks both paths make (the front door's validation does not run on the baseline's
// params): x [T, H], w1 [E, N1, H] with N1 = 2I or I, w2 [E, H, I], topk_weights f32 [T*k], out [T, H].
inline Status check_shapes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  if (p.x.ndim != 2 || p.w1.ndim != 3 || p.w2.ndim != 3 || p.w1.shape[2] != d.H || p.w2.shape[0] != d.E ||
      p.w2.shape[1] != d.H || (d.N1 != 2 * d.I && d.N1 != d.I) || p.topk_weights.dtype != DType::f32 ||
      p.topk_weights.numel() != d.T * d.k || p.out.ndim != 2 || p.out.shape[0] != d.T || p.out.shape[1] != d.H) {
    return InvalidArgument("moe_baseline_cublas: inconsistent shapes: x ", p.x.describe(), ", w1 ", p.w1.describe(),
                           ", w2 ", p.w2.describe(), ", topk_weights ", p.topk_weights.describe(), ", out ",
                           p.out.describe());
  }
  return Status::Ok();
}

// x, w1, w2, topk_weights and out on the device.
inline Status require_cuda_operands(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_cuda(p.x, "x"));
  MOEKIT_RETURN_IF_ERROR(require_cuda(p.w1, "w1"));
  MOEKIT_RETURN_IF_ERROR(require_cuda(p.w2, "w2"));
  MOEKIT_RETURN_IF_ERROR(require_cuda(p.topk_weights, "topk_weights"));
  return require_cuda(p.out, "out");
}

inline Status routing_matches(const FusedMoeParams& p, const MoeBaselineRouting& r) {
  const MoeDims d = moe_dims(p);
  if (r.T != d.T || r.k != d.k || r.E != d.E || int64_t(r.slot_row.size()) != d.T * d.k ||
      int64_t(r.expert_begin.size()) != d.E + 1) {
    return InvalidArgument("moe_baseline_cublas: routing is for T=", r.T, " k=", r.k, " E=", r.E, ", params have T=",
                           d.T, " k=", d.k, " E=", d.E);
  }
  // The lists index device buffers: check them here so a bad list can never read out of bounds.
  const int64_t M = r.rows();
  if (r.expert_begin.front() != 0 || r.expert_begin.back() != M) {
    return InvalidArgument("moe_baseline_routing: expert_begin must run from 0 to rows() = ", M);
  }
  for (size_t e = 0; e + 1 < r.expert_begin.size(); ++e) {
    if (r.expert_begin[e] > r.expert_begin[e + 1]) return InvalidArgument("moe_baseline_routing: expert_begin decreases at ", e);
  }
  for (int32_t slot : r.row_slot) {
    if (slot < 0 || slot >= d.T * d.k) return InvalidArgument("moe_baseline_routing: row_slot holds ", slot);
  }
  for (int32_t row : r.slot_row) {
    if (row < -1 || row >= M) return InvalidArgument("moe_baseline_routing: slot_row holds ", row);
  }
  return Status::Ok();
}

}  // namespace moekit::cuda::baseline_detail
