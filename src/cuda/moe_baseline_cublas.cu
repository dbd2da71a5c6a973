// The unfused cuBLAS baseline of fused_moe (contract and steps: moe_baseline_cublas.h; how the bench
// uses it: docs/cli.md, "The cuBLAS baseline"). Test: tests/test_moe_baseline_cublas.cpp
// (MoeBaselineCublas.*: routing lists on the host, and on the GPU the output against the ref kernel).
//
// Deterministic: the GEMMs are cuBLAS's (deterministic for a fixed problem, workspace and device),
// the weighted sum runs over k in slot order with no atomics.
// Graph-capturable: every buffer (gathered rows, h, a, y, the routing lists, cuBLAS's workspace) is
// allocated in setup(); enqueue() only launches on its stream after cublasSetStream +
// cublasSetWorkspace (cuBLAS then allocates nothing during capture).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/cuda_timing.h"
#include "cuda/cuda_utils.h"
#include "cuda/moe_baseline_cublas.h"
#include "cuda/moe_baseline_cublas_common.cuh"
#include "cuda/moe_baseline_cublas_fp8.h"

namespace moekit::cuda {

namespace {

using namespace baseline_detail;

// Step 1: gathered row r = x row (row_slot[r] / k). W is the copy word (uint4 when every row start is
// 16-byte aligned, else one element); strides and widths are in words.
template <class W>
__global__ void gather_rows(const W* __restrict__ x, int64_t x_stride, const int32_t* __restrict__ row_slot, int k,
                            int64_t cols, W* __restrict__ xg) {
  const int64_t r = blockIdx.x;
  const W* src = x + int64_t(row_slot[r] / k) * x_stride;
  W* dst = xg + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

// Step 3: a[r, i] = act(g) * u from h[r] = [g | u] (g1u1) or act(h[r, i]) (g1u0).
template <class T>
__global__ void act_mul(const T* __restrict__ h, int64_t N1, int64_t I, bool g1u1, int act,
                        const float* __restrict__ topk_w, const int32_t* __restrict__ row_slot, bool weight_on_input,
                        T* __restrict__ a) {
  const int64_t r = blockIdx.x;
  const float w = weight_on_input ? topk_w[row_slot[r]] : 1.0f;
  const T* hr = h + r * N1;
  for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
    const float g = activate(act, w * to_f32(hr[i]));
    a[r * I + i] = from_f32<T>(g1u1 ? g * (w * to_f32(hr[I + i])) : g);
  }
}

// What the baseline computes: unquantized bf16 / f16, row-major contiguous weights, device tensors.
Status params_supported(const FusedMoeParams& p) {
  const DType dt = p.x.dtype;
  if (dt != DType::bf16 && dt != DType::f16) {
    return Unsupported("moe_baseline_cublas: x must be bf16 or f16, got ", dtype_name(dt));
  }
  if (p.w1.dtype != dt || p.w2.dtype != dt || p.out.dtype != dt) {
    return Unsupported("moe_baseline_cublas: w1, w2 and out must have x's dtype ", dtype_name(dt), ", got ",
                       dtype_name(p.w1.dtype), ", ", dtype_name(p.w2.dtype), ", ", dtype_name(p.out.dtype));
  }
  MOEKIT_RETURN_IF_ERROR(check_weight_layout(p));
  if (!p.x.is_row_strided_2d() || !p.out.is_row_strided_2d()) {
    return Unsupported("moe_baseline_cublas: x and out must have a unit last-dimension stride");
  }
  MOEKIT_RETURN_IF_ERROR(check_shapes(p));
  MOEKIT_RETURN_IF_ERROR(require_cuda_operands(p));
  return Status::Ok();
}

// Owns the intermediates, the routing lists on the device and the cuBLAS handle of one problem.
class Baseline {
 public:
  Baseline() = default;
  Baseline(const Baseline&) = delete;
  Baseline& operator=(const Baseline&) = delete;
  ~Baseline() {
    if (handle_ != nullptr) cublasDestroy(handle_);
    for (void* p : allocs_) cudaFree(p);
  }

  Status setup(const FusedMoeParams& p, const MoeBaselineRouting& r) {
    MOEKIT_RETURN_IF_ERROR(params_supported(p));
    MOEKIT_RETURN_IF_ERROR(routing_matches(p, r));
    d_ = moe_dims(p);
    begin_ = r.expert_begin;
    M_ = r.rows();
    const size_t es = size_t(dtype_size(p.x.dtype));
    MOEKIT_RETURN_IF_ERROR(check_cublas(cublasCreate(&handle_), "cublasCreate"));
    MOEKIT_RETURN_IF_ERROR(alloc(kCublasWorkspace, &ws_));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(d_.T * d_.k) * sizeof(int32_t), reinterpret_cast<void**>(&slot_row_)));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_) * sizeof(int32_t), reinterpret_cast<void**>(&row_slot_)));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * d_.H) * es, &xg_));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * d_.N1) * es, &h_));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * d_.I) * es, &a_));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * d_.H) * es, &y_));
    if (!r.slot_row.empty()) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(
          cudaMemcpy(slot_row_, r.slot_row.data(), r.slot_row.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
          "cudaMemcpy (slot_row)"));
    }
    if (M_ > 0) {
      MOEKIT_RETURN_IF_ERROR(check_cuda(
          cudaMemcpy(row_slot_, r.row_slot.data(), r.row_slot.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
          "cudaMemcpy (row_slot)"));
    }
    return Status::Ok();
  }

  // The whole baseline on `stream` for params p (same shape as setup's; may point at another set).
  Status enqueue(const FusedMoeParams& p, cudaStream_t stream) {
    MOEKIT_RETURN_IF_ERROR(params_supported(p));
    const MoeDims d = moe_dims(p);
    if (d.T != d_.T || d.k != d_.k || d.E != d_.E || d.H != d_.H || d.I != d_.I || d.N1 != d_.N1) {
      return InvalidArgument("moe_baseline_cublas: input set has another shape than the one set up");
    }
    if (d_.T == 0) return Status::Ok();
    return p.x.dtype == DType::bf16 ? enqueue_typed<__nv_bfloat16>(p, stream, CUDA_R_16BF)
                                    : enqueue_typed<__half>(p, stream, CUDA_R_16F);
  }

 private:
  template <class T>
  Status enqueue_typed(const FusedMoeParams& p, cudaStream_t stream, cudaDataType dt) {
    const int64_t es = int64_t(sizeof(T));
    const int k = int(d_.k);
    const auto* tw = p.topk_weights.ptr<const float>();
    if (M_ > 0) {
      // 1. gather (16-byte words when every row start allows it)
      const int64_t row_bytes = d_.H * es, stride_bytes = p.x.stride[0] * es;
      if (row_bytes % 16 == 0 && stride_bytes % 16 == 0 && aligned16(p.x.data) && aligned16(xg_)) {
        gather_rows<uint4><<<unsigned(M_), kThreads, 0, stream>>>(p.x.ptr<const uint4>(), stride_bytes / 16, row_slot_,
                                                                   k, row_bytes / 16, static_cast<uint4*>(xg_));
      } else {
        gather_rows<T><<<unsigned(M_), kThreads, 0, stream>>>(p.x.ptr<const T>(), p.x.stride[0], row_slot_, k, d_.H,
                                                               static_cast<T*>(xg_));
      }
      MOEKIT_RETURN_IF_ERROR(last_launch("moe_baseline_cublas: gather_rows"));
      MOEKIT_RETURN_IF_ERROR(check_cublas(cublasSetStream(handle_, stream), "cublasSetStream"));
      // NOTE: after cublasSetStream, which resets the workspace to cuBLAS's own pool.
      MOEKIT_RETURN_IF_ERROR(check_cublas(cublasSetWorkspace(handle_, ws_, kCublasWorkspace), "cublasSetWorkspace"));
      // 2. h_e [rows, N1] = xg_e [rows, H] . w1[e]^T
      MOEKIT_RETURN_IF_ERROR(grouped_gemm(dt, p.w1.data, d_.N1, d_.H, xg_, h_, es, "cublasGemmEx (gate/up)"));
      // 3. a = act(g) * u
      act_mul<T><<<unsigned(M_), kThreads, 0, stream>>>(static_cast<const T*>(h_), d_.N1, d_.I, d_.g1u1,
                                                         int(p.activation), tw, row_slot_, p.weight_on_input,
                                                         static_cast<T*>(a_));
      MOEKIT_RETURN_IF_ERROR(last_launch("moe_baseline_cublas: act_mul"));
      // 4. y_e [rows, H] = a_e [rows, I] . w2[e]^T
      MOEKIT_RETURN_IF_ERROR(grouped_gemm(dt, p.w2.data, d_.H, d_.I, a_, y_, es, "cublasGemmEx (down)"));
    }
    // 5. weighted sum over k (also writes the zero rows of tokens without a local expert)
    weighted_sum<T><<<unsigned(d_.T), kThreads, 0, stream>>>(static_cast<const T*>(y_), d_.H, slot_row_, tw, k,
                                                             p.weight_on_input, p.out.ptr<T>(), p.out.stride[0]);
    return last_launch("moe_baseline_cublas: weighted_sum");
  }

  Status alloc(size_t bytes, void** out) {
    *out = nullptr;
    if (bytes == 0) return Status::Ok();
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(out, bytes), "cudaMalloc (moe_baseline_cublas)"));
    allocs_.push_back(*out);
    return Status::Ok();
  }

  // Per expert with rows: out_e [rows, N] = in_e [rows, K] . w[e]^T, w = [E, N, K] row-major.
  Status grouped_gemm(cudaDataType dt, const void* w, int64_t N, int64_t K, const void* in, void* out, int64_t es,
                      const char* what) {
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t e = 0; e < d_.E; ++e) {
      const int64_t r0 = begin_[size_t(e)], rows = begin_[size_t(e) + 1] - r0;
      if (rows == 0) continue;
      const auto* we = static_cast<const char*>(w) + e * N * K * es;
      const auto* ie = static_cast<const char*>(in) + r0 * K * es;
      auto* oe = static_cast<char*>(out) + r0 * N * es;
      MOEKIT_RETURN_IF_ERROR(check_cublas(
          cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(rows), int(K), &alpha, we, dt, int(K), ie, dt,
                       int(K), &beta, oe, dt, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          what));
    }
    return Status::Ok();
  }

  MoeDims d_{};
  std::vector<int64_t> begin_;
  int64_t M_ = 0;
  cublasHandle_t handle_ = nullptr;
  std::vector<void*> allocs_;
  void *ws_ = nullptr, *xg_ = nullptr, *h_ = nullptr, *a_ = nullptr, *y_ = nullptr;
  int32_t *slot_row_ = nullptr, *row_slot_ = nullptr;
};

}  // namespace

Status moe_baseline_routing(const FusedMoeParams& p, MoeBaselineRouting* out) {
  const MoeDims d = moe_dims(p);
  if (p.topk_ids.device != Device::cpu || (p.expert_mask.present() && p.expert_mask.device != Device::cpu) ||
      (p.expert_map.present() && p.expert_map.device != Device::cpu)) {
    return InvalidArgument("moe_baseline_routing: topk_ids and expert_mask / expert_map must be host tensors");
  }
  if (p.topk_ids.dtype != DType::i32 || !p.topk_ids.is_contiguous()) {
    return InvalidArgument("moe_baseline_routing: topk_ids must be contiguous i32, got ", p.topk_ids.describe());
  }
  // Local expert of each global id (SPEC 3.5): identity, cumsum(mask) - 1, or map; -1 = remote.
  std::vector<int64_t> local(static_cast<size_t>(d.Eg), -1);
  int64_t before = 0;
  for (int64_t g = 0; g < d.Eg; ++g) {
    if (p.expert_mask.present()) {
      const bool on = p.expert_mask.ptr<const int32_t>()[g] != 0;
      local[size_t(g)] = on ? before : -1;
      before += on ? 1 : 0;
    } else if (p.expert_map.present()) {
      local[size_t(g)] = p.expert_map.ptr<const int32_t>()[g];
    } else {
      local[size_t(g)] = g;
    }
    if (local[size_t(g)] >= d.E) local[size_t(g)] = -1;
  }
  MoeBaselineRouting r;
  r.T = d.T;
  r.k = d.k;
  r.E = d.E;
  const int64_t slots = d.T * d.k;
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  std::vector<int64_t> expert_of(static_cast<size_t>(slots), -1);
  r.expert_begin.assign(size_t(d.E + 1), 0);
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t g = ids[s];
    if (g < 0 || g >= d.Eg) continue;
    expert_of[size_t(s)] = local[size_t(g)];
    if (expert_of[size_t(s)] >= 0) ++r.expert_begin[size_t(expert_of[size_t(s)]) + 1];
  }
  for (int64_t e = 0; e < d.E; ++e) r.expert_begin[size_t(e + 1)] += r.expert_begin[size_t(e)];
  r.row_slot.assign(size_t(r.expert_begin.back()), 0);
  r.slot_row.assign(size_t(slots), -1);
  std::vector<int64_t> next(r.expert_begin.begin(), r.expert_begin.end() - 1);
  for (int64_t s = 0; s < slots; ++s) {  // ascending slots: rows of one expert in slot order
    const int64_t e = expert_of[size_t(s)];
    if (e < 0) continue;
    const int64_t row = next[size_t(e)]++;
    r.row_slot[size_t(row)] = int32_t(s);
    r.slot_row[size_t(s)] = int32_t(row);
  }
  *out = std::move(r);
  return Status::Ok();
}

Status run_moe_baseline_cublas(const FusedMoeParams& device_params, const MoeBaselineRouting& routing) {
  if (is_fp8(device_params.w1.dtype)) return run_moe_baseline_cublas_fp8(device_params, routing);
  Baseline b;
  MOEKIT_RETURN_IF_ERROR(b.setup(device_params, routing));
  MOEKIT_RETURN_IF_ERROR(b.enqueue(device_params, nullptr));
  return check_cuda(cudaDeviceSynchronize(), "moe_baseline_cublas: cudaDeviceSynchronize");
}

Status time_moe_baseline_cublas(const std::vector<FusedMoeParams>& device_sets, const MoeBaselineRouting& routing,
                                int warmup, int iters, std::vector<double>* us, double* median_us, L2Flush l2) {
  if (device_sets.empty()) return InvalidArgument("time_moe_baseline_cublas: device_sets is empty");
  if (is_fp8(device_sets.front().w1.dtype)) {
    return time_moe_baseline_cublas_fp8(device_sets, routing, warmup, iters, us, median_us, l2);
  }
  Baseline b;
  MOEKIT_RETURN_IF_ERROR(b.setup(device_sets.front(), routing));
  std::vector<double> samples;
  MOEKIT_RETURN_IF_ERROR(time_graph(
      [&](void* stream, int set) { return b.enqueue(device_sets[size_t(set)], static_cast<cudaStream_t>(stream)); },
      int(device_sets.size()), warmup, iters, l2, "moe_baseline_cublas", &samples));
  if (median_us != nullptr) *median_us = median_of(samples);
  if (us != nullptr) *us = std::move(samples);
  return Status::Ok();
}

}  // namespace moekit::cuda
