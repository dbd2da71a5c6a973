// quantize_fp8_sm90: the Hopper quantize_fp8 (SPEC 5, contract moekit/ops/quant.h): every granularity
// (per_tensor dynamic and static, per_row, per_token_group, block), f32 / bf16 / f16 in, e4m3fn or
// e4m3fnuz out. Codes and scales are bit-identical to quantize_fp8_ref. Deterministic always (max is
// exact; the one atomic is an integer max, whose result does not depend on the order). No workspace,
// no host synchronisation, CUDA-graph capturable. Test: tests/test_quantize_fp8_sm90.cpp (Cuda*
// cases) and every case of check_quantize_fp8 (src/testing/check_layout_quant.cpp) against the ref.
//
// Same block tiling as the reference: `in` seen as [B, R, C] in blocks of bn x bk, one scale per
// block at (b * ceil(R/bn) + rb) * ceil(C/bk) + cb, i.e. blocks are numbered in scale order.
//   per_row / per_token_group / block: group_kernel. A group (= block) is `tpg` threads (a power of
//     two, 1..256), 256 / tpg groups per CTA. A group's elements are cut into chunks of V elements
//     (V = 16: two / four 16-byte loads and one 16-byte store of codes; V = 1 when rows or pointers
//     are not 16-element aligned). Chunk j of a group is thread j % tpg's. With CPT > 0 each thread
//     keeps its <= CPT chunks in registers between the amax and the quantization (one read of the
//     input); groups of more than 4 * 256 chunks (CPT = 0) read their input twice (the second
//     read mostly hits L1 / L2). amax: shuffles inside a warp, shared memory across the warps of a
//     group.
//   per_tensor, dynamic: cudaMemsetAsync(scale, 0), amax_kernel (grid-stride; one atomicMax per CTA
//     on the f32 bit pattern of its amax, which orders non-negative floats exactly), finalize_kernel
//     (one thread: the amax bits in scale[0] become the scale), then flat_kernel quantizes with
//     scale[0]. Static: flat_kernel alone.
//
// Numerics (all equal to the reference): amax over the finite elements; scale =
// __fdiv_rn(max(amax, kFp8AmaxFloor), fp8_max) and q = __fdiv_rn(x, scale) (IEEE division whatever
// -prec-div says); q -> code with cvt.rn.satfinite.e4m3x2.f32 (round to nearest even, finite
// overflow to +-448). e4m3fnuz has no hardware format: its code of q is the e4m3fn code of 2q (same
// bits, half the value; 2q is exact), then |q| > 232 (which rounds to 240, past e4m3fn's 448 once
// doubled) becomes the largest code 0x7F | sign and the negative zero 0x80 becomes 0x00. A chunk
// with any |q| > 2^100 (NaN, inf, or a huge quotient of a static scale) or any f32-subnormal q is
// encoded by dtype.h's scalar encoder instead, the reference's own code, with a NaN input's sign
// taken from the input (the GPU's division returns a sign-less canonical NaN, the reference's
// keeps the input's). So the hardware conversion only ever sees zeros and normal finite floats.
//
// Device data is not readable by the front door: a static scale that is not finite and > 0 (the
// reference's error) makes flat_kernel return without writing anything (out keeps its contents).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "cuda/fp8_encode.cuh"
#include "moekit/core/dtype.h"
#include "moekit/ops/quant.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 256;            // every kernel's CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCachedChunks = 4;      // CPT of the register-cached group kernel
constexpr int64_t kMaxGrid = 1 << 20;    // grid-stride beyond this many CTAs
constexpr int64_t kFlatCtasPerSm = 8;     // per_tensor kernels: at most 8 CTAs per SM of the device

// ---------------------------------------------------------------- loads
// Exact scalar decode of element i (the slow path's, and the source of a NaN's sign).
template <DType D>
__device__ __forceinline__ float load_exact(const void* in, int64_t i) {
  if constexpr (D == DType::f32) {
    return static_cast<const float*>(in)[i];
  } else if constexpr (D == DType::bf16) {
    return bf16_bits_to_f32(static_cast<const uint16_t*>(in)[i]);
  } else {
    return f16_bits_to_f32(static_cast<const uint16_t*>(in)[i]);
  }
}

__device__ __forceinline__ void bf16x2(uint32_t w, float* v) {
  v[0] = __uint_as_float(w << 16);
  v[1] = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ void f16x2(uint32_t w, float* v) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));  // exact for finite values
  v[0] = f.x;
  v[1] = f.y;
}

// Elements [i, i + V) as floats: V = 16 with 16-byte loads (i a multiple of 16, the pointer 16-byte
// aligned), V = 1 a scalar load. Non-finite values may lose their NaN sign here (f16); they are
// re-read by load_exact on the slow path.
template <DType D, int V>
__device__ __forceinline__ void load_chunk(const void* in, int64_t i, float (&v)[V]) {
  if constexpr (V == 1) {
    if constexpr (D == DType::f16) {
      v[0] = __half2float(__ushort_as_half(static_cast<const uint16_t*>(in)[i]));
    } else {
      v[0] = load_exact<D>(in, i);
    }
  } else if constexpr (D == DType::f32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(in) + i);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = p[k];
      v[4 * k] = f.x;
      v[4 * k + 1] = f.y;
      v[4 * k + 2] = f.z;
      v[4 * k + 3] = f.w;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(in) + i);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint4 u = p[k];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        if constexpr (D == DType::bf16) {
          bf16x2(w[h], &v[8 * k + 2 * h]);
        } else {
          f16x2(w[h], &v[8 * k + 2 * h]);
        }
      }
    }
  }
}

// max |v| over the finite values, folded into m.
template <int V>
__device__ __forceinline__ float finite_amax(float m, const float (&v)[V]) {
  const float inf = __int_as_float(0x7F800000);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float a = fabsf(v[k]);
    m = a < inf ? fmaxf(m, a) : m;  // NaN and inf fail the compare
  }
  return m;
}

// ---------------------------------------------------------------- encoding
// The reference's code of x / s (dtype.h's encoder); a NaN x keeps its sign (e4m3fn: 0xFF if negative).
__device__ __forceinline__ uint32_t encode_exact(float x, float s, bool fnuz) {
  const float q = isnan(x) ? x : __fdiv_rn(x, s);
  return fnuz ? f32_to_e4m3fnuz_bits(q) : f32_to_e4m3fn_bits(q);
}

// out[i, i + V) = codes of in[i, i + V) / s, where v holds those inputs (load_chunk).
template <DType D, int V>
__device__ __forceinline__ void quantize_chunk(const void* in, uint8_t* out, int64_t i, const float (&v)[V],
                                               float s, bool fnuz) {
  float q[V];
  bool fast = true;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    q[k] = __fdiv_rn(v[k], s);
    fast = fast && fp8_fast_ok(q[k]);
  }
  if constexpr (V == 1) {
    const float q4[4] = {q[0], 0.0f, 0.0f, 0.0f};
    out[i] = uint8_t(fast ? encode4(q4, fnuz) & 0xFFu : encode_exact(load_exact<D>(in, i), s, fnuz));
  } else if (fast) {
    *reinterpret_cast<uint4*>(out + i) = make_uint4(encode4(&q[0], fnuz), encode4(&q[4], fnuz),
                                                    encode4(&q[8], fnuz), encode4(&q[12], fnuz));
  } else {
    for (int k = 0; k < V; ++k) out[i + k] = uint8_t(encode_exact(load_exact<D>(in, i + k), s, fnuz));
  }
}

__device__ __forceinline__ float scale_of(float amax, float qmax) {
  return __fdiv_rn(fmaxf(amax, kFp8AmaxFloor), qmax);
}

// a / b for non-negative a, b > 0, in 32 bits when both fit.
__device__ __forceinline__ int64_t div64(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) return int64_t(uint32_t(a) / uint32_t(b));
  return a / b;
}

// ---------------------------------------------------------------- per_row / per_token_group / block
struct GroupArgs {
  const void* in;
  uint8_t* out;
  float* scale;
  int64_t R, C;    // rows per matrix, columns
  int64_t bn, bk;  // block height (rows), width (columns)
  int64_t RB, CB;  // blocks per matrix column / row
  int64_t groups;  // B * RB * CB
  int tpg;         // threads per group: a power of two in [1, kThreads]
  float qmax;      // 448 or 240
  bool fnuz;
};

// One group's place: chunk j (of V elements) starts at element base + (j / cpr) * C + (j % cpr) * V.
struct GroupPos {
  int64_t base = 0;
  int64_t nch = 0;  // chunks in the group (0 for a CTA's idle group slots)
  int64_t cpr = 1;  // chunks per row
  bool one_row = true;
};

template <int V>
__device__ __forceinline__ GroupPos group_pos(const GroupArgs& a, int64_t g) {
  const int64_t w = div64(g, a.CB), cb = g - w * a.CB;  // w = b * RB + rb
  const int64_t b = div64(w, a.RB), rb = w - b * a.RB;
  const int64_t r0 = rb * a.bn, c0 = cb * a.bk;
  const int64_t rows = min(a.R - r0, a.bn), cols = min(a.C - c0, a.bk);
  GroupPos p;
  p.base = (b * a.R + r0) * a.C + c0;
  p.cpr = (cols + V - 1) / V;  // exact for V = 16: the host picks V = 16 only when cols % 16 == 0
  p.nch = rows * p.cpr;
  p.one_row = rows == 1;
  return p;
}

template <int V>
__device__ __forceinline__ int64_t chunk_at(const GroupPos& p, int64_t C, int64_t j) {
  if (p.one_row) return p.base + j * V;
  const int64_t r = div64(j, p.cpr);
  return p.base + r * C + (j - r * p.cpr) * V;
}

// max of m over the tpg threads of each group (every thread of the CTA must call it).
__device__ __forceinline__ float group_max(float m, int tpg, float* red) {
  const int width = tpg < 32 ? tpg : 32;
  for (int o = 1; o < width; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if (tpg > 32) {
    const int warp = int(threadIdx.x) / 32, wpg = tpg / 32, first = warp / wpg * wpg;
    if ((threadIdx.x & 31) == 0) red[warp] = m;
    __syncthreads();
    m = red[first];
    for (int k = 1; k < wpg; ++k) m = fmaxf(m, red[first + k]);
    __syncthreads();  // red is reused by the next group of this CTA
  }
  return m;
}

// CPT > 0: a thread's chunks stay in registers (group of <= CPT * tpg chunks). CPT = 0: two reads.
template <DType D, int V, int CPT>
__global__ void __launch_bounds__(kThreads) group_kernel(const GroupArgs a) {
  __shared__ float red[kWarps];
  const int tpg = a.tpg;
  const int lane = int(threadIdx.x) & (tpg - 1);
  const int64_t per_cta = kThreads / tpg;
  for (int64_t first = int64_t(blockIdx.x) * per_cta; first < a.groups; first += int64_t(gridDim.x) * per_cta) {
    const int64_t g = first + int(threadIdx.x) / tpg;
    const GroupPos p = g < a.groups ? group_pos<V>(a, g) : GroupPos{};
    float amax = 0.0f;
    if constexpr (CPT > 0) {
      float v[CPT][V];
#pragma unroll
      for (int t = 0; t < CPT; ++t) {
        const int64_t j = lane + int64_t(t) * tpg;
        if (j < p.nch) {
          load_chunk<D, V>(a.in, chunk_at<V>(p, a.C, j), v[t]);
          amax = finite_amax<V>(amax, v[t]);
        }
      }
      amax = group_max(amax, tpg, red);
      const float s = scale_of(amax, a.qmax);
      if (g < a.groups && lane == 0) a.scale[g] = s;
#pragma unroll
      for (int t = 0; t < CPT; ++t) {
        const int64_t j = lane + int64_t(t) * tpg;
        if (j < p.nch) quantize_chunk<D, V>(a.in, a.out, chunk_at<V>(p, a.C, j), v[t], s, a.fnuz);
      }
    } else {
      for (int64_t j = lane; j < p.nch; j += tpg) {
        float v[V];
        load_chunk<D, V>(a.in, chunk_at<V>(p, a.C, j), v);
        amax = finite_amax<V>(amax, v);
      }
      amax = group_max(amax, tpg, red);
      const float s = scale_of(amax, a.qmax);
      if (g < a.groups && lane == 0) a.scale[g] = s;
      for (int64_t j = lane; j < p.nch; j += tpg) {
        const int64_t i = chunk_at<V>(p, a.C, j);
        float v[V];
        load_chunk<D, V>(a.in, i, v);
        quantize_chunk<D, V>(a.in, a.out, i, v, s, a.fnuz);
      }
    }
  }
}

// ---------------------------------------------------------------- per_tensor
struct FlatArgs {
  const void* in;
  uint8_t* out;
  float* scale;   // [1]: the amax accumulator (bits), then the scale
  int64_t n;      // elements
  int64_t nvec;   // leading chunks of V elements; elements [nvec * V, n) go one by one
  float qmax;
  bool fnuz;
};

template <DType D, int V>
__global__ void __launch_bounds__(kThreads) amax_kernel(const FlatArgs a) {
  __shared__ float red[kWarps];
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float m = 0.0f;
  for (int64_t c = tid; c < a.nvec; c += stride) {
    float v[V];
    load_chunk<D, V>(a.in, c * V, v);
    m = finite_amax<V>(m, v);
  }
  for (int64_t i = a.nvec * V + tid; i < a.n; i += stride) {
    float v[1];
    load_chunk<D, 1>(a.in, i, v);
    m = finite_amax<1>(m, v);
  }
  m = group_max(m, kThreads, red);
  // Non-negative floats order like their bit patterns: an unsigned max is the float max, exactly.
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(a.scale), __float_as_uint(m));
}

__global__ void finalize_kernel(float* scale, float qmax) { scale[0] = scale_of(scale[0], qmax); }

template <DType D, int V>
__global__ void __launch_bounds__(kThreads) flat_kernel(const FlatArgs a) {
  const float s = a.scale[0];
  if (!(isfinite(s) && s > 0.0f)) return;  // an invalid static scale: write nothing
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t c = tid; c < a.nvec; c += stride) {
    float v[V];
    load_chunk<D, V>(a.in, c * V, v);
    quantize_chunk<D, V>(a.in, a.out, c * V, v, s, a.fnuz);
  }
  for (int64_t i = a.nvec * V + tid; i < a.n; i += stride) {
    float v[1];
    load_chunk<D, 1>(a.in, i, v);
    quantize_chunk<D, 1>(a.in, a.out, i, v, s, a.fnuz);
  }
}

// ---------------------------------------------------------------- host side
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

Status supports(const QuantizeFp8Params& p) {
  return require_device({{"in", &p.in}, {"out", &p.out}, {"scale", &p.scale}});
}

template <DType D>
Status run_per_tensor(const QuantizeFp8Params& p, cudaStream_t stream) {
  FlatArgs a;
  a.in = p.in.data;
  a.out = p.out.ptr<uint8_t>();
  a.scale = p.scale.ptr<float>();
  a.n = p.in.numel();
  a.qmax = fp8_max(p.out.dtype);
  a.fnuz = p.out.dtype == DType::fp8_e4m3fnuz;
  const bool vec = aligned16(a.in) && aligned16(a.out);
  a.nvec = vec ? a.n / 16 : 0;
  const int64_t work = vec ? a.nvec + (a.n - a.nvec * 16) : a.n;
  DeviceFacts dev;
  MOEKIT_RETURN_IF_ERROR(current_device_facts(&dev));
  const int grid = int(std::min<int64_t>(kFlatCtasPerSm * dev.sm_count, (work + kThreads - 1) / kThreads));
  if (!p.static_scale) {
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemsetAsync(a.scale, 0, sizeof(float), stream),
                                      "quantize_fp8_sm90: cudaMemsetAsync (amax)"));
    if (vec) {
      amax_kernel<D, 16><<<grid, kThreads, 0, stream>>>(a);
    } else {
      amax_kernel<D, 1><<<grid, kThreads, 0, stream>>>(a);
    }
    MOEKIT_RETURN_IF_ERROR(last_launch("quantize_fp8_sm90: amax_kernel"));
    finalize_kernel<<<1, 1, 0, stream>>>(a.scale, a.qmax);
    MOEKIT_RETURN_IF_ERROR(last_launch("quantize_fp8_sm90: finalize_kernel"));
  }
  if (vec) {
    flat_kernel<D, 16><<<grid, kThreads, 0, stream>>>(a);
  } else {
    flat_kernel<D, 1><<<grid, kThreads, 0, stream>>>(a);
  }
  return last_launch("quantize_fp8_sm90: flat_kernel");
}

template <DType D, int V>
Status launch_groups(const GroupArgs& a, int cpt, cudaStream_t stream) {
  const int64_t per_cta = kThreads / a.tpg;
  const int grid = int(std::min<int64_t>(kMaxGrid, (a.groups + per_cta - 1) / per_cta));
  switch (cpt) {
    case 1: group_kernel<D, V, 1><<<grid, kThreads, 0, stream>>>(a); break;
    case kMaxCachedChunks: group_kernel<D, V, kMaxCachedChunks><<<grid, kThreads, 0, stream>>>(a); break;
    default: group_kernel<D, V, 0><<<grid, kThreads, 0, stream>>>(a); break;
  }
  return last_launch("quantize_fp8_sm90: group_kernel");
}

template <DType D>
Status run_groups(const QuantizeFp8Params& p, cudaStream_t stream) {
  GroupArgs a;
  a.in = p.in.data;
  a.out = p.out.ptr<uint8_t>();
  a.scale = p.scale.ptr<float>();
  const int64_t numel = p.in.numel(), K = p.in.size(-1);
  a.C = K;
  switch (p.granularity) {
    case QuantGranularity::per_row: a.R = numel / K, a.bn = 1, a.bk = K; break;
    case QuantGranularity::per_token_group: a.R = numel / K, a.bn = 1, a.bk = p.group_k; break;
    default: a.R = p.in.size(-2), a.bn = p.block_n, a.bk = p.group_k; break;
  }
  const int64_t B = numel / (a.R * a.C);
  a.RB = (a.R + a.bn - 1) / a.bn;
  a.CB = (a.C + a.bk - 1) / a.bk;
  a.groups = B * a.RB * a.CB;
  a.qmax = fp8_max(p.out.dtype);
  a.fnuz = p.out.dtype == DType::fp8_e4m3fnuz;
  // 16-element chunks need every group's column range on multiples of 16 and aligned pointers.
  const bool vec = a.C % 16 == 0 && (a.CB == 1 || a.bk % 16 == 0) && aligned16(a.in) && aligned16(a.out);
  const int V = vec ? 16 : 1;
  const int64_t chunks = std::min(a.R, a.bn) * ((std::min(a.C, a.bk) + V - 1) / V);  // of a full group
  int cpt = 0;
  if (chunks <= kThreads) {
    cpt = 1;
    a.tpg = pow2_at_least(chunks);
  } else if (chunks <= int64_t(kMaxCachedChunks) * kThreads) {
    cpt = kMaxCachedChunks;
    a.tpg = pow2_at_least((chunks + kMaxCachedChunks - 1) / kMaxCachedChunks);
  } else {
    a.tpg = kThreads;
  }
  return vec ? launch_groups<D, 16>(a, cpt, stream) : launch_groups<D, 1>(a, cpt, stream);
}

template <DType D>
Status run_typed(const QuantizeFp8Params& p, cudaStream_t stream) {
  if (p.granularity == QuantGranularity::per_tensor) return run_per_tensor<D>(p, stream);
  return run_groups<D>(p, stream);
}

Status run(const QuantizeFp8Params& p, const RunContext& ctx) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  switch (p.in.dtype) {
    case DType::bf16: return run_typed<DType::bf16>(p, stream);
    case DType::f16: return run_typed<DType::f16>(p, stream);
    default: return run_typed<DType::f32>(p, stream);
  }
}

}  // namespace

void register_quantize_fp8_sm90(Registry& r) {
  r.add({"quantize_fp8_sm90", OpKind::quantize_fp8, MoeVariant::none, Backend::cuda,
         "in f32|bf16|f16 -> fp8 e4m3fn|e4m3fnuz + f32 scales; codes and scales bit-identical to the ref", 100,
         erase_supports<QuantizeFp8Params, supports>, nullptr, erase_run<QuantizeFp8Params, run>});
}

}  // namespace moekit::cuda
