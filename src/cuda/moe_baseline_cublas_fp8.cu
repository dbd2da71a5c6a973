// The fp8 path of the unfused cuBLAS baseline of fused_moe (steps and what it refuses:
// moe_baseline_cublas_fp8.h; how the bench uses it: docs/cli.md, "The cuBLAS baseline"). Test:
// tests/test_moe_baseline_cublas.cpp (MoeBaselineCublas.Fp8*: the output against the ref kernel on
// the same quantized problem, and the Unsupported paths).
//
// cuBLASLt operand mapping. cuBLAS is column-major, so each expert's GEMM is written transposed:
//   D [N, rows] (col-major, ld N)  =  A^T . B,   A = the expert's weights [N, K] row-major, seen as
//   col-major [K, N] (ld K, TRANSA = T);  B = the gathered fp8 rows [rows, K] row-major, seen as
//   col-major [K, rows] (ld K, TRANSB = N).
// D is then exactly h (or y) [rows, N] row-major, and both operands are K-major ("TN", the layout
// fp8 GEMMs on Hopper want). So cuBLAS's A is the WEIGHT and its B the ACTIVATION: the weight's
// scales go to A_SCALE_*, the activation's to B_SCALE_*. Scale layouts (those PyTorch's
// _scaled_mm hands cuBLASLt for the same modes; the Fp8* GPU tests pin them on an H200):
//   OUTER_VEC_32F    A: N floats (one per weight row), B: rows floats (one per gathered row);
//   BLK128x128_32F   A: block (nb, kb) at nb * round_up(ceil(K/128), 4) + kb (K blocks inner,
//                    their count padded to a multiple of 4) -- moekit's [E, Nb, Kb] scales are
//                    repacked into that in setup, like a checkpoint loader would;
//   VEC128_32F       B: group (r, kb) at kb * rows + r (the rows inner: "M-major").
// Every scale vector an expert's GEMM points at starts on a 16-byte boundary (chunks padded to a
// multiple of 4 floats); SCALAR scales too: cublasLtMatmul refuses (NOT_SUPPORTED) a scalar scale
// pointer that is only 4-byte aligned, so the per-tensor w1 scales are spread 4 floats apart in
// setup and a1_scale is copied into an aligned float on the stream before the gate/up GEMM.
// With block scales each expert's rows are padded to a multiple of 16 (kBlockRowPad): on sm_90
// (cuBLASLt 13.1, H200) BLK128x128 x VEC128 has no algorithm for n < 16 (n = 1, 11 refused; 16, 64,
// 128, 512 run). A padding row repeats the expert's first row; its results are never read.
//
// Deterministic: cuBLASLt GEMMs with a fixed algorithm per expert (chosen in setup) and workspace,
// the quantizers are exact, the weighted sum runs over k in slot order. Graph-capturable: every
// buffer, descriptor and algorithm is made in setup(); enqueue() only launches on its stream.
#include <cublasLt.h>

#include <algorithm>
#include <memory>
#include <string>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_timing.h"
#include "cuda/cuda_utils.h"
#include "cuda/fp8_encode.cuh"
#include "cuda/moe_baseline_cublas_common.cuh"
#include "cuda/moe_baseline_cublas_fp8.h"
#include "moekit/ops/quant.h"

namespace moekit::cuda {

namespace {

using namespace baseline_detail;

constexpr int kBlock = 128;  // the only block / group size cuBLASLt's fp8 block scaling has
constexpr int64_t kBlockRowPad = 16;  // block scales: each expert's gathered rows, a multiple of this
constexpr int64_t kScalarStride = 4;  // floats between two aligned SCALAR scales (16 bytes)

int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }

// The largest power of two <= 256 dividing a byte offset / address (cuBLASLt's alignment unit).
uint32_t align_of(uint64_t v) {
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// ---------------------------------------------------------------- kernels
// Step 2: gathered row r = fp8 row t = row_slot[r] / k of xq ([T, words] 16-byte words), and its G
// activation scales: sg[soff[r] + g * sld[r]] = sx[t * sx_stride + g] (sx_stride 0 broadcasts a
// static scale). sg == nullptr: no per-row scales (SCALAR mode).
__global__ void gather_fp8_rows(const uint4* __restrict__ xq, int64_t words, const int32_t* __restrict__ row_slot,
                                int k, const float* __restrict__ sx, int64_t sx_stride, int G,
                                const int32_t* __restrict__ soff, const int32_t* __restrict__ sld,
                                uint4* __restrict__ xg, float* __restrict__ sg) {
  const int64_t r = blockIdx.x;
  const int64_t t = row_slot[r] / k;
  const uint4* src = xq + t * words;
  uint4* dst = xg + r * words;
  for (int64_t c = threadIdx.x; c < words; c += blockDim.x) dst[c] = src[c];
  if (sg == nullptr) return;
  for (int g = threadIdx.x; g < G; g += blockDim.x) sg[soff[r] + int64_t(g) * sld[r]] = sx[t * sx_stride + g];
}

// a[i] of gathered row hr (= [g | u] or g): act(w * g) * (w * u), or act(w * g) for g1u0.
template <class T>
__device__ __forceinline__ void act4(const T* hr, int64_t i, int64_t I, bool g1u1, int act, float w, float (&v)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float g = activate(act, w * to_f32(hr[i + q]));
    v[q] = g1u1 ? g * (w * to_f32(hr[I + i + q])) : g;
  }
}

__device__ __forceinline__ float finite_amax4(const float (&v)[4]) {
  float m = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) m = isfinite(v[q]) ? fmaxf(m, fabsf(v[q])) : m;
  return m;
}

// Same numerics as quantize_fp8 (SPEC 5): s = max(amax, floor) / 448, q = fp8(v / s), IEEE divisions.
__device__ __forceinline__ float fp8_scale(float amax) {
  return __fdiv_rn(fmaxf(amax, kFp8AmaxFloor), kFp8E4m3fnMax);
}
__device__ __forceinline__ uint32_t quant4(float (&v)[4], float s) {
#pragma unroll
  for (int q = 0; q < 4; ++q) v[q] = __fdiv_rn(v[q], s);
  return encode4_e4m3fn(v);
}

// Step 4: one CTA of kThreads per gathered row r: a = act(g) * u (f32, SPEC 3.1; weight_on_input
// multiplies g and u by the slot's router weight, SPEC 3.4), quantized to e4m3fn codes aq[r, 0..I)
// with dynamic scales written in cuBLASLt's layout: group gi at sa[soff[r] + gi * sld[r]].
// group == 0: one group per row (fp8_row; amax over the whole row, a CTA reduction, the values
// computed twice rather than kept); group == 128: a warp per 1 x 128 group (fp8_block; the last
// group of a row may be partial). I % 4 == 0 (the caller requires I % 16), so a lane's 4 values
// are all in or all out of the row.
template <class T>
__global__ void act_quant(const T* __restrict__ h, int64_t N1, int64_t I, bool g1u1, int act,
                          const float* __restrict__ topk_w, const int32_t* __restrict__ row_slot, bool weight_on_input,
                          int group, uint8_t* __restrict__ aq, float* __restrict__ sa,
                          const int32_t* __restrict__ soff, const int32_t* __restrict__ sld) {
  const int64_t r = blockIdx.x;
  const float w = weight_on_input ? topk_w[row_slot[r]] : 1.0f;
  const T* hr = h + r * N1;
  uint32_t* qr = reinterpret_cast<uint32_t*>(aq + r * I);  // r * I % 4 == 0
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (group == 0) {
    __shared__ float warp_amax[kThreads / 32];
    float amax = 0.0f;
    for (int64_t i = int64_t(threadIdx.x) * 4; i < I; i += int64_t(blockDim.x) * 4) {
      float v[4];
      act4(hr, i, I, g1u1, act, w, v);
      amax = fmaxf(amax, finite_amax4(v));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) warp_amax[warp] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int j = 0; j < int(blockDim.x) / 32; ++j) amax = fmaxf(amax, warp_amax[j]);
    const float s = fp8_scale(amax);
    for (int64_t i = int64_t(threadIdx.x) * 4; i < I; i += int64_t(blockDim.x) * 4) {
      float v[4];
      act4(hr, i, I, g1u1, act, w, v);
      qr[i / 4] = quant4(v, s);
    }
    if (threadIdx.x == 0) sa[soff[r]] = s;
    return;
  }
  const int64_t groups = (I + group - 1) / group;
  for (int64_t gi = warp; gi < groups; gi += int64_t(blockDim.x) / 32) {
    const int64_t i = gi * group + lane * 4;
    const bool in = lane * 4 < group && i < I;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in) act4(hr, i, I, g1u1, act, w, v);
    float amax = finite_amax4(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = fp8_scale(amax);
    if (in) qr[i / 4] = quant4(v, s);
    if (lane == 0) sa[soff[r] + gi * sld[r]] = s;
  }
}

// OUTER_VEC weight scales: dst[e * ld + n] = s[e] (per-tensor) or s[e * N + n] (per-row), n < N.
__global__ void expand_row_scales(const float* __restrict__ s, bool per_tensor, int64_t E, int64_t N, int64_t ld,
                                  float* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < E * N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / N, n = i % N;
    dst[e * ld + n] = per_tensor ? s[e] : s[i];
  }
}

// BLK128x128 weight scales: rows = E * Nb rows of Kb scales -> rows of Kbp (Kb rounded up to 4),
// padding 0 (never read).
__global__ void pad_block_scales(const float* __restrict__ src, int64_t rows, int64_t Kb, int64_t Kbp,
                                 float* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * Kbp;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / Kbp, kb = i % Kbp;
    dst[i] = kb < Kb ? src[row * Kb + kb] : 0.0f;
  }
}

// ---------------------------------------------------------------- host side
// The routing with each expert's rows padded to a multiple of `pad` (pad 1: unchanged). A padding
// row takes the slot of the expert's first row, so every kernel reads a real token for it; no slot
// maps to a padding row, so its results are never read.
MoeBaselineRouting pad_rows(const MoeBaselineRouting& r, int64_t pad) {
  if (pad <= 1) return r;
  MoeBaselineRouting p = r;
  const size_t E = size_t(r.E);
  p.expert_begin.assign(E + 1, 0);
  p.row_slot.clear();
  std::vector<int32_t> new_row(r.row_slot.size(), -1);
  for (size_t e = 0; e < E; ++e) {
    const int64_t b = r.expert_begin[e], rows = r.expert_begin[e + 1] - b;
    const int64_t padded = (rows + pad - 1) / pad * pad;
    p.expert_begin[e + 1] = p.expert_begin[e] + padded;
    for (int64_t i = 0; i < padded; ++i) {
      if (i < rows) new_row[size_t(b + i)] = int32_t(p.row_slot.size());
      p.row_slot.push_back(r.row_slot[size_t(b + (i < rows ? i : 0))]);
    }
  }
  for (int32_t& row : p.slot_row) {
    if (row >= 0) row = new_row[size_t(row)];
  }
  return p;
}

const char* scale_mode_name(int32_t m) {
  switch (m) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return "OUTER_VEC_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
    default: return "?";
  }
}

// The scale granularity of a weight scale tensor (the variant's shape rules, SPEC 3.2 / 3.3).
enum class WScale : uint8_t { per_tensor, per_row, block };

// Checks one weight scale of expert count E for weights [E, N, K]; *kind gets its granularity.
Status check_w_scale(const TensorView& s, const char* name, bool block, int64_t E, int64_t N, int64_t K,
                     WScale* kind) {
  if (!s.present() || s.dtype != DType::f32 || !s.is_contiguous()) {
    return InvalidArgument("moe_baseline_cublas: ", name, " must be a contiguous f32 tensor, got ", s.describe());
  }
  MOEKIT_RETURN_IF_ERROR(require_cuda(s, name));
  const int64_t expect = block ? E * ((N + kBlock - 1) / kBlock) * ((K + kBlock - 1) / kBlock)
                               : (s.ndim == 1 ? E : E * N);
  if (s.numel() != expect || (block && s.ndim != 3)) {
    return InvalidArgument("moe_baseline_cublas: ", name, " has ", s.numel(), " scales (", s.describe(), "), expected ",
                           expect);
  }
  *kind = block ? WScale::block : (s.ndim == 1 ? WScale::per_tensor : WScale::per_row);
  return Status::Ok();
}

// What the fp8 path computes (the header lists the refusals). Shapes are checked here because the
// front door's validation is not run on the baseline's params.
Status params_supported(const FusedMoeParams& p, WScale* w1k, WScale* w2k) {
  const DType dt = p.x.dtype;
  if (dt != DType::bf16 && dt != DType::f16) {
    return Unsupported("moe_baseline_cublas: fp8 path: x must be bf16 or f16 (cuBLASLt's output type), got ",
                       dtype_name(dt));
  }
  if (p.w1.dtype != DType::fp8_e4m3fn || p.w2.dtype != DType::fp8_e4m3fn) {
    return Unsupported("moe_baseline_cublas: fp8 path: w1 and w2 must be fp8_e4m3fn, got ", dtype_name(p.w1.dtype),
                       ", ", dtype_name(p.w2.dtype));
  }
  if (p.out.dtype != dt) {
    return Unsupported("moe_baseline_cublas: out must have x's dtype ", dtype_name(dt), ", got ", dtype_name(p.out.dtype));
  }
  MOEKIT_RETURN_IF_ERROR(check_weight_layout(p));
  if (!p.x.is_contiguous() || !p.out.is_row_strided_2d()) {
    return Unsupported("moe_baseline_cublas: fp8 path: x must be contiguous (quantize_fp8's input) and out must have "
                       "a unit last-dimension stride");
  }
  MOEKIT_RETURN_IF_ERROR(check_shapes(p));
  const MoeDims d = moe_dims(p);
  if (p.weight_on_input && d.k != 1) {
    return InvalidArgument("moe_baseline_cublas: weight_on_input needs k == 1, got k = ", d.k);
  }
  const bool block = p.scale_block_n > 0 || p.scale_block_k > 0;
  if (block && (p.scale_block_n != kBlock || p.scale_block_k != kBlock)) {
    return Unsupported("moe_baseline_cublas: cuBLASLt's fp8 block scaling is 128 x 128 (weights) / 1 x 128 "
                       "(activations), got scale_block_n x scale_block_k = ",
                       p.scale_block_n, " x ", p.scale_block_k);
  }
  if (block && p.a1_scale.present()) {
    return InvalidArgument("moe_baseline_cublas: a1_scale is for fp8_row only, got ", p.a1_scale.describe(),
                           " with block scales");
  }
  if (p.a1_scale.present() && (p.a1_scale.dtype != DType::f32 || p.a1_scale.numel() != 1)) {
    return InvalidArgument("moe_baseline_cublas: a1_scale must be [1] f32, got ", p.a1_scale.describe());
  }
  if (d.H % 16 != 0 || d.I % 16 != 0) {
    return Unsupported("moe_baseline_cublas: fp8 path: H and I must be multiples of 16 (16-byte fp8 rows for "
                       "cuBLASLt and the gather), got H = ",
                       d.H, ", I = ", d.I);
  }
  if (!aligned16(p.w1.data) || !aligned16(p.w2.data)) {
    return Unsupported("moe_baseline_cublas: fp8 path: w1 and w2 must start on a 16-byte boundary");
  }
  MOEKIT_RETURN_IF_ERROR(check_w_scale(p.w1_scale, "w1_scale", block, d.E, d.N1, d.H, w1k));
  MOEKIT_RETURN_IF_ERROR(check_w_scale(p.w2_scale, "w2_scale", block, d.E, d.H, d.I, w2k));
  MOEKIT_RETURN_IF_ERROR(require_cuda_operands(p));
  if (p.a1_scale.present()) MOEKIT_RETURN_IF_ERROR(require_cuda(p.a1_scale, "a1_scale"));
  return Status::Ok();
}

// One GEMM of the baseline (gate/up or down) for every expert with rows: the descriptors and the
// algorithm cuBLASLt's heuristic picked per expert.
struct GemmPlan {
  const char* name = "";
  int64_t N = 0, K = 0;                              // D = [rows, N] row-major, K the reduction
  int32_t mode_a = 0, mode_b = 0;                    // weight / activation scale modes
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;                // the weights, shared by every expert
  std::vector<cublasLtMatrixLayout_t> b, d;          // [E], nullptr for experts without rows
  std::vector<cublasLtMatmulAlgo_t> algo;            // [E]
  std::vector<int64_t> chunk;                        // [E + 1] float offsets of the activation scales
  size_t a_stride = 0;                               // floats between two experts' prepared weight scales
};

// Per input set: the weight scales in cuBLASLt's layout (expanded / repacked in setup, like a
// checkpoint loader would), or nullptr where the set's own tensor is used as is (SCALAR).
struct SetScales {
  float* w1 = nullptr;
  float* w2 = nullptr;
};

class Fp8Baseline {
 public:
  Fp8Baseline() = default;
  Fp8Baseline(const Fp8Baseline&) = delete;
  Fp8Baseline& operator=(const Fp8Baseline&) = delete;
  ~Fp8Baseline() {
    for (GemmPlan* g : {&g1_, &g2_}) {
      for (cublasLtMatrixLayout_t l : g->b) {
        if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
      }
      for (cublasLtMatrixLayout_t l : g->d) {
        if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
      }
      if (g->a != nullptr) cublasLtMatrixLayoutDestroy(g->a);
      if (g->desc != nullptr) cublasLtMatmulDescDestroy(g->desc);
    }
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    for (void* p : allocs_) cudaFree(p);
  }

  Status setup(const std::vector<FusedMoeParams>& sets, const MoeBaselineRouting& routing);
  Status enqueue(int set, cudaStream_t stream);

 private:
  Status alloc(size_t bytes, void** out) {
    *out = nullptr;
    if (bytes == 0) return Status::Ok();
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMalloc(out, bytes), "cudaMalloc (moe_baseline_cublas fp8)"));
    allocs_.push_back(*out);
    return Status::Ok();
  }
  template <class V>
  Status upload(const std::vector<V>& v, V** out) {
    MOEKIT_RETURN_IF_ERROR(alloc(v.size() * sizeof(V), reinterpret_cast<void**>(out)));
    if (v.empty()) return Status::Ok();
    return check_cuda(cudaMemcpy(*out, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice),
                      "cudaMemcpy (moe_baseline_cublas fp8)");
  }
  Status prepare_scales(const FusedMoeParams& p, SetScales* s);
  Status plan_gemm(GemmPlan* g, const char* name, int64_t N, int64_t K, int32_t mode_a, int32_t mode_b);
  // Step 1's call of quantize_fp8 for input set p (x -> xq_ and its scales).
  QuantizeFp8Params x_quant_params(const FusedMoeParams& p) const;
  // Scale pointers of expert e in GEMM g for input set `set`.
  const void* weight_scale(const GemmPlan& g, int set, int64_t e) const;
  // The alignment of expert e's weights in GEMM g, over every input set.
  uint32_t min_align_a(const GemmPlan& g, int64_t e) const;
  const void* act_scale(const GemmPlan& g, int set, int64_t e) const;
  Status run_gemm(const GemmPlan& g, int set, const void* w, const void* in, void* out, cudaStream_t stream);

  std::vector<FusedMoeParams> sets_;
  std::vector<SetScales> scales_;
  MoeDims d_{};
  bool block_ = false, gemm1_scalar_ = false;
  WScale w1k_ = WScale::per_row, w2k_ = WScale::per_row;
  DType dt_ = DType::bf16;
  std::vector<int64_t> begin_;
  int64_t M_ = 0;
  Kernel quant_{};                     // quantize_fp8_sm90's row
  cublasLtHandle_t lt_ = nullptr;
  GemmPlan g1_, g2_;
  std::vector<void*> allocs_;
  void *ws_ = nullptr, *h_ = nullptr, *y_ = nullptr;
  uint8_t *xq_ = nullptr, *xg_ = nullptr, *aq_ = nullptr;
  float *sx_ = nullptr, *sg1_ = nullptr, *sg2_ = nullptr;
  float* a1_ = nullptr;                // a1_scale, copied to a 16-byte aligned float (SCALAR mode)
  int32_t *slot_row_ = nullptr, *row_slot_ = nullptr, *soff1_ = nullptr, *soff2_ = nullptr, *sld_ = nullptr;
};

Status Fp8Baseline::setup(const std::vector<FusedMoeParams>& sets, const MoeBaselineRouting& routing) {
  if (sets.empty()) return InvalidArgument("moe_baseline_cublas: no input set");
  const FusedMoeParams& p0 = sets.front();
  MOEKIT_RETURN_IF_ERROR(params_supported(p0, &w1k_, &w2k_));
  MOEKIT_RETURN_IF_ERROR(routing_matches(p0, routing));
  d_ = moe_dims(p0);
  for (const FusedMoeParams& p : sets) {
    WScale k1, k2;
    MOEKIT_RETURN_IF_ERROR(params_supported(p, &k1, &k2));
    const MoeDims d = moe_dims(p);
    if (d.T != d_.T || d.k != d_.k || d.E != d_.E || d.H != d_.H || d.I != d_.I || d.N1 != d_.N1 || k1 != w1k_ ||
        k2 != w2k_ || p.a1_scale.present() != p0.a1_scale.present() || p.x.dtype != p0.x.dtype ||
        p.weight_on_input != p0.weight_on_input || p.activation != p0.activation) {
      return InvalidArgument("moe_baseline_cublas: input sets differ in shape or scheme");
    }
  }
  sets_ = sets;
  dt_ = p0.x.dtype;
  block_ = w1k_ == WScale::block;
  gemm1_scalar_ = !block_ && p0.a1_scale.present() && w1k_ == WScale::per_tensor;
  const MoeBaselineRouting r = pad_rows(routing, block_ ? kBlockRowPad : 1);
  begin_ = r.expert_begin;
  M_ = r.rows();
  if (d_.T == 0) return Status::Ok();
  const int64_t T = d_.T, H = d_.H, I = d_.I, N1 = d_.N1, E = d_.E;
  const int64_t Hb = (H + kBlock - 1) / kBlock, Ib = (I + kBlock - 1) / kBlock;
  const size_t es = size_t(dtype_size(dt_));

  // x's quantizer: moekit's own op, kernel quantize_fp8_sm90, taken from a private registry that
  // holds only its row. NOTE: not registry() nor the quantize_fp8 front door: both live in the op
  // library, which depends on this one, not the other way round. Its supports() checks the params.
  Registry own;
  register_quantize_fp8_sm90(own);
  const Kernel* qk = own.find("quantize_fp8_sm90");
  if (qk == nullptr) return Unsupported("moe_baseline_cublas: kernel quantize_fp8_sm90 is not registered");
  quant_ = *qk;

  MOEKIT_RETURN_IF_ERROR(upload(r.slot_row, &slot_row_));
  MOEKIT_RETURN_IF_ERROR(upload(r.row_slot, &row_slot_));
  MOEKIT_RETURN_IF_ERROR(alloc(kCublasWorkspace, &ws_));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(T * H), reinterpret_cast<void**>(&xq_)));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(T * (block_ ? Hb : 1)) * sizeof(float), reinterpret_cast<void**>(&sx_)));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * H), reinterpret_cast<void**>(&xg_)));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * N1) * es, &h_));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * I), reinterpret_cast<void**>(&aq_)));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(M_ * H) * es, &y_));

  MOEKIT_RETURN_IF_ERROR(check_cublas(cublasLtCreate(&lt_), "cublasLtCreate"));
  const int32_t vec = block_ ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const int32_t wmode = block_ ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  // Activation scale chunks (per expert, 16-byte aligned) and each gathered row's place in them.
  for (GemmPlan* g : {&g1_, &g2_}) {
    const int64_t groups = block_ ? (g == &g1_ ? Hb : Ib) : 1;
    g->chunk.assign(size_t(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) {
      g->chunk[size_t(e + 1)] = g->chunk[size_t(e)] + round_up4((begin_[size_t(e + 1)] - begin_[size_t(e)]) * groups);
    }
  }
  std::vector<int32_t> soff1(static_cast<size_t>(M_)), soff2(static_cast<size_t>(M_)), sld(static_cast<size_t>(M_));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t row = begin_[size_t(e)]; row < begin_[size_t(e + 1)]; ++row) {
      soff1[size_t(row)] = int32_t(g1_.chunk[size_t(e)] + row - begin_[size_t(e)]);
      soff2[size_t(row)] = int32_t(g2_.chunk[size_t(e)] + row - begin_[size_t(e)]);
      sld[size_t(row)] = int32_t(begin_[size_t(e + 1)] - begin_[size_t(e)]);
    }
  }
  MOEKIT_RETURN_IF_ERROR(upload(soff1, &soff1_));
  MOEKIT_RETURN_IF_ERROR(upload(soff2, &soff2_));
  MOEKIT_RETURN_IF_ERROR(upload(sld, &sld_));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(g1_.chunk.back()) * sizeof(float), reinterpret_cast<void**>(&sg1_)));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(g2_.chunk.back()) * sizeof(float), reinterpret_cast<void**>(&sg2_)));
  g1_.a_stride = size_t(block_ ? ((N1 + kBlock - 1) / kBlock) * round_up4(Hb)
                                : (gemm1_scalar_ ? kScalarStride : round_up4(N1)));
  if (gemm1_scalar_) MOEKIT_RETURN_IF_ERROR(alloc(kScalarStride * sizeof(float), reinterpret_cast<void**>(&a1_)));
  g2_.a_stride = size_t(block_ ? Hb * round_up4(Ib) : round_up4(H));

  scales_.resize(sets_.size());
  for (size_t s = 0; s < sets_.size(); ++s) MOEKIT_RETURN_IF_ERROR(prepare_scales(sets_[s], &scales_[s]));
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaDeviceSynchronize(), "moe_baseline_cublas fp8: scale preparation"));

  MOEKIT_RETURN_IF_ERROR(
      plan_gemm(&g1_, "gate/up", N1, H, gemm1_scalar_ ? scalar : wmode, gemm1_scalar_ ? scalar : vec));
  MOEKIT_RETURN_IF_ERROR(plan_gemm(&g2_, "down", H, I, wmode, vec));
  for (const FusedMoeParams& p : sets_) {  // the quantizer must accept every set's x (it says why not)
    const QuantizeFp8Params q = x_quant_params(p);
    MOEKIT_RETURN_IF_ERROR(quant_.supports(&q));
  }
  return Status::Ok();
}

QuantizeFp8Params Fp8Baseline::x_quant_params(const FusedMoeParams& p) const {
  const int64_t T = d_.T, H = d_.H, Hb = (H + kBlock - 1) / kBlock;
  QuantizeFp8Params q;
  q.in = p.x;
  q.out = TensorView::contiguous(xq_, DType::fp8_e4m3fn, {T, H}, Device::cuda, p.x.device_index);
  q.group_k = kBlock;
  q.block_n = kBlock;
  if (block_) {
    q.granularity = QuantGranularity::per_token_group;
    q.scale = TensorView::contiguous(sx_, DType::f32, {T, Hb}, Device::cuda, p.x.device_index);
  } else if (p.a1_scale.present()) {
    q.granularity = QuantGranularity::per_tensor;
    q.static_scale = true;
    q.scale = p.a1_scale;
  } else {
    q.granularity = QuantGranularity::per_row;
    q.scale = TensorView::contiguous(sx_, DType::f32, {T}, Device::cuda, p.x.device_index);
  }
  return q;
}

Status Fp8Baseline::prepare_scales(const FusedMoeParams& p, SetScales* s) {
  const int64_t E = d_.E;
  const int grid = 1024;
  if (block_) {
    const int64_t Hb = (d_.H + kBlock - 1) / kBlock, Ib = (d_.I + kBlock - 1) / kBlock;
    const int64_t N1b = (d_.N1 + kBlock - 1) / kBlock;
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(E) * g1_.a_stride * sizeof(float), reinterpret_cast<void**>(&s->w1)));
    MOEKIT_RETURN_IF_ERROR(alloc(size_t(E) * g2_.a_stride * sizeof(float), reinterpret_cast<void**>(&s->w2)));
    if (E == 0) return Status::Ok();
    pad_block_scales<<<grid, kThreads>>>(p.w1_scale.ptr<const float>(), E * N1b, Hb, round_up4(Hb), s->w1);
    MOEKIT_RETURN_IF_ERROR(last_launch("moe_baseline_cublas: pad_block_scales (w1)"));
    pad_block_scales<<<grid, kThreads>>>(p.w2_scale.ptr<const float>(), E * Hb, Ib, round_up4(Ib), s->w2);
    return last_launch("moe_baseline_cublas: pad_block_scales (w2)");
  }
  if (E == 0) return Status::Ok();
  // SCALAR: expert e's scale alone at s->w1[e * kScalarStride] (an OUTER_VEC row of length 1).
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(E) * g1_.a_stride * sizeof(float), reinterpret_cast<void**>(&s->w1)));
  expand_row_scales<<<grid, kThreads>>>(p.w1_scale.ptr<const float>(), w1k_ == WScale::per_tensor, E,
                                        gemm1_scalar_ ? 1 : d_.N1, int64_t(g1_.a_stride), s->w1);
  MOEKIT_RETURN_IF_ERROR(last_launch("moe_baseline_cublas: expand_row_scales (w1)"));
  MOEKIT_RETURN_IF_ERROR(alloc(size_t(E) * g2_.a_stride * sizeof(float), reinterpret_cast<void**>(&s->w2)));
  expand_row_scales<<<grid, kThreads>>>(p.w2_scale.ptr<const float>(), w2k_ == WScale::per_tensor, E, d_.H,
                                        int64_t(g2_.a_stride), s->w2);
  return last_launch("moe_baseline_cublas: expand_row_scales (w2)");
}

const void* Fp8Baseline::weight_scale(const GemmPlan& g, int set, int64_t e) const {
  const float* base = &g == &g1_ ? scales_[size_t(set)].w1 : scales_[size_t(set)].w2;
  return base + size_t(e) * g.a_stride;
}

uint32_t Fp8Baseline::min_align_a(const GemmPlan& g, int64_t e) const {
  uint32_t a = 256;
  for (const FusedMoeParams& p : sets_) {
    const TensorView& w = &g == &g1_ ? p.w1 : p.w2;
    a = std::min(a, align_of(reinterpret_cast<uintptr_t>(w.data) + uint64_t(e * g.N * g.K)));
  }
  return a;
}

const void* Fp8Baseline::act_scale(const GemmPlan& g, int set, int64_t e) const {
  if (&g == &g1_ && gemm1_scalar_) return a1_;
  return (&g == &g1_ ? sg1_ : sg2_) + g.chunk[size_t(e)];
}

Status Fp8Baseline::plan_gemm(GemmPlan* g, const char* name, int64_t N, int64_t K, int32_t mode_a, int32_t mode_b) {
  g->name = name;
  g->N = N;
  g->K = K;
  g->mode_a = mode_a;
  g->mode_b = mode_b;
  const size_t E = size_t(d_.E);
  g->b.assign(E, nullptr);
  g->d.assign(E, nullptr);
  g->algo.assign(E, cublasLtMatmulAlgo_t{});
  const std::string what = std::string("moe_baseline_cublas: cuBLASLt (") + name + ")";
  MOEKIT_RETURN_IF_ERROR(check_cublas(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                      (what + " cublasLtMatmulDescCreate").c_str()));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const auto set_attr = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t n) -> Status {
    const cublasStatus_t st = cublasLtMatmulDescSetAttribute(g->desc, attr, v, n);
    if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    return Unsupported(what, ": cublasLtMatmulDescSetAttribute(", int(attr), ") refused: ", cublasGetStatusString(st));
  };
  MOEKIT_RETURN_IF_ERROR(set_attr(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MOEKIT_RETURN_IF_ERROR(set_attr(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MOEKIT_RETURN_IF_ERROR(set_attr(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
  MOEKIT_RETURN_IF_ERROR(set_attr(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
  const cudaDataType out_t = dt_ == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  MOEKIT_RETURN_IF_ERROR(check_cublas(cublasLtMatrixLayoutCreate(&g->a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K),
                                      (what + " cublasLtMatrixLayoutCreate (A)").c_str()));
  cublasLtMatmulPreference_t raw = nullptr;
  MOEKIT_RETURN_IF_ERROR(check_cublas(cublasLtMatmulPreferenceCreate(&raw), (what + " preference").c_str()));
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> pref(
      raw, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = kCublasWorkspace;
  MOEKIT_RETURN_IF_ERROR(check_cublas(
      cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
      (what + " preference workspace").c_str()));
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, uint32_t v) {
    return check_cublas(cublasLtMatmulPreferenceSetAttribute(raw, attr, &v, sizeof(v)),
                        (what + " preference alignment").c_str());
  };
  for (size_t e = 0; e < E; ++e) {
    const int64_t rows = begin_[e + 1] - begin_[e];
    if (rows == 0) continue;
    MOEKIT_RETURN_IF_ERROR(
        check_cublas(cublasLtMatrixLayoutCreate(&g->b[e], CUDA_R_8F_E4M3, uint64_t(K), uint64_t(rows), K),
                     (what + " cublasLtMatrixLayoutCreate (B)").c_str()));
    MOEKIT_RETURN_IF_ERROR(check_cublas(cublasLtMatrixLayoutCreate(&g->d[e], out_t, uint64_t(N), uint64_t(rows), N),
                                        (what + " cublasLtMatrixLayoutCreate (D)").c_str()));
    // NOTE: the heuristic assumes 256-byte aligned operands unless told otherwise, and the matmul
    // then fails on a less aligned one; an expert's rows start anywhere in the gathered buffers.
    const uint32_t al_a = min_align_a(*g, int64_t(e)), al_b = align_of(g->K * begin_[e]),
                   al_d = align_of(g->N * begin_[e] * dtype_size(dt_));
    MOEKIT_RETURN_IF_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a));
    MOEKIT_RETURN_IF_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b));
    MOEKIT_RETURN_IF_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d));
    MOEKIT_RETURN_IF_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d));
    // The heuristic sees expert e's real scale pointers (set 0), as the matmul will.
    const void* sa = weight_scale(*g, 0, int64_t(e));
    const void* sb = act_scale(*g, 0, int64_t(e));
    MOEKIT_RETURN_IF_ERROR(set_attr(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    MOEKIT_RETURN_IF_ERROR(set_attr(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(lt_, g->desc, g->a, g->b[e], g->d[e], g->d[e], raw, 1, &res, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
      return Unsupported(what, ": no fp8 algorithm on this device for A (weights) ", scale_mode_name(mode_a),
                         " x B (activations) ", scale_mode_name(mode_b), ", m = ", N, " n = ", rows, " k = ", K,
                         " (e4m3 x e4m3 -> ", dtype_name(dt_), ", cublasLtMatmulAlgoGetHeuristic: ",
                         hs == CUBLAS_STATUS_SUCCESS ? "0 results" : cublasGetStatusString(hs), ")");
    }
    g->algo[e] = res.algo;
  }
  return Status::Ok();
}

Status Fp8Baseline::run_gemm(const GemmPlan& g, int set, const void* w, const void* in, void* out,
                             cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  const int64_t es = dtype_size(dt_);
  for (int64_t e = 0; e < d_.E; ++e) {
    const int64_t r0 = begin_[size_t(e)], rows = begin_[size_t(e) + 1] - r0;
    if (rows == 0) continue;
    const void* sa = weight_scale(g, set, e);
    const void* sb = act_scale(g, set, e);
    MOEKIT_RETURN_IF_ERROR(check_cublas(
        cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), g.name));
    MOEKIT_RETURN_IF_ERROR(check_cublas(
        cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), g.name));
    const auto* we = static_cast<const uint8_t*>(w) + e * g.N * g.K;
    const auto* ie = static_cast<const uint8_t*>(in) + r0 * g.K;
    auto* oe = static_cast<char*>(out) + r0 * g.N * es;
    const std::string what = std::string("moe_baseline_cublas: cublasLtMatmul (") + g.name + ")";
    MOEKIT_RETURN_IF_ERROR(check_cublas(cublasLtMatmul(lt_, g.desc, &alpha, we, g.a, ie, g.b[size_t(e)], &beta, oe,
                                                       g.d[size_t(e)], oe, g.d[size_t(e)], &g.algo[size_t(e)], ws_,
                                                       kCublasWorkspace, stream),
                                        what.c_str()));
  }
  return Status::Ok();
}

Status Fp8Baseline::enqueue(int set, cudaStream_t stream) {
  if (set < 0 || set >= int(sets_.size())) return InvalidArgument("moe_baseline_cublas: set ", set, " out of range");
  const FusedMoeParams& p = sets_[size_t(set)];
  if (d_.T == 0) return Status::Ok();
  const int64_t T = d_.T, H = d_.H, I = d_.I, Hb = (H + kBlock - 1) / kBlock;
  const int k = int(d_.k);
  const auto* tw = p.topk_weights.ptr<const float>();
  if (M_ > 0) {
    // 1. quantize x: per token (fp8_row), per 1 x 128 group (fp8_block) or with the static a1_scale
    const bool stat = p.a1_scale.present();
    const QuantizeFp8Params q = x_quant_params(p);
    RunContext ctx;
    ctx.stream = stream;
    MOEKIT_RETURN_IF_ERROR(quant_.run(&q, ctx));
    // 2. gather the fp8 rows and their scales (none with SCALAR: the static scale is used as is)
    const float* sx = stat ? p.a1_scale.ptr<const float>() : sx_;
    gather_fp8_rows<<<unsigned(M_), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(xq_), H / 16, row_slot_, k, sx, stat ? 0 : (block_ ? Hb : 1),
        int(block_ ? Hb : 1), soff1_, sld_, reinterpret_cast<uint4*>(xg_), gemm1_scalar_ ? nullptr : sg1_);
    MOEKIT_RETURN_IF_ERROR(last_launch("moe_baseline_cublas: gather_fp8_rows"));
    if (gemm1_scalar_) {  // the static scale, where cuBLASLt can read it (16-byte aligned)
      MOEKIT_RETURN_IF_ERROR(check_cuda(
          cudaMemcpyAsync(a1_, p.a1_scale.data, sizeof(float), cudaMemcpyDeviceToDevice, stream),
          "moe_baseline_cublas: a1_scale copy"));
    }
    // 3. h_e [rows, N1] = dequant(xg_e) . dequant(w1[e])^T
    MOEKIT_RETURN_IF_ERROR(run_gemm(g1_, set, p.w1.data, xg_, h_, stream));
    // 4. a = act(g) * u, re-quantized per row / per 1 x 128 group
    const int group = block_ ? kBlock : 0;
    if (dt_ == DType::bf16) {
      act_quant<__nv_bfloat16><<<unsigned(M_), kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(h_), d_.N1, I, d_.g1u1, int(p.activation), tw, row_slot_,
          p.weight_on_input, group, aq_, sg2_, soff2_, sld_);
    } else {
      act_quant<__half><<<unsigned(M_), kThreads, 0, stream>>>(static_cast<const __half*>(h_), d_.N1, I, d_.g1u1,
                                                               int(p.activation), tw, row_slot_, p.weight_on_input,
                                                               group, aq_, sg2_, soff2_, sld_);
    }
    MOEKIT_RETURN_IF_ERROR(last_launch("moe_baseline_cublas: act_quant"));
    // 5. y_e [rows, H] = dequant(aq_e) . dequant(w2[e])^T
    MOEKIT_RETURN_IF_ERROR(run_gemm(g2_, set, p.w2.data, aq_, y_, stream));
  }
  // 6. weighted sum over k (also writes the zero rows of tokens without a local expert)
  if (dt_ == DType::bf16) {
    weighted_sum<__nv_bfloat16><<<unsigned(T), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(y_), H, slot_row_, tw, k, p.weight_on_input, p.out.ptr<__nv_bfloat16>(),
        p.out.stride[0]);
  } else {
    weighted_sum<__half><<<unsigned(T), kThreads, 0, stream>>>(static_cast<const __half*>(y_), H, slot_row_, tw, k,
                                                               p.weight_on_input, p.out.ptr<__half>(), p.out.stride[0]);
  }
  return last_launch("moe_baseline_cublas: weighted_sum");
}

}  // namespace

Status run_moe_baseline_cublas_fp8(const FusedMoeParams& device_params, const MoeBaselineRouting& routing) {
  Fp8Baseline b;
  MOEKIT_RETURN_IF_ERROR(b.setup({device_params}, routing));
  MOEKIT_RETURN_IF_ERROR(b.enqueue(0, nullptr));
  return check_cuda(cudaDeviceSynchronize(), "moe_baseline_cublas fp8: cudaDeviceSynchronize");
}

Status time_moe_baseline_cublas_fp8(const std::vector<FusedMoeParams>& device_sets, const MoeBaselineRouting& routing,
                                    int warmup, int iters, std::vector<double>* us, double* median_us, L2Flush l2) {
  Fp8Baseline b;
  MOEKIT_RETURN_IF_ERROR(b.setup(device_sets, routing));
  std::vector<double> samples;
  MOEKIT_RETURN_IF_ERROR(time_graph(
      [&](void* stream, int set) { return b.enqueue(set, static_cast<cudaStream_t>(stream)); },
      int(device_sets.size()), warmup, iters, l2, "moe_baseline_cublas_fp8", &samples));
  if (median_us != nullptr) *median_us = median_of(samples);
  if (us != nullptr) *us = std::move(samples);
  return Status::Ok();
}

}  // namespace moekit::cuda
