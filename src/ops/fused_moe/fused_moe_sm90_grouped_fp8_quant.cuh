// The activation quantizers of the grouped fp8 paths (fused_moe_sm90_grouped_fp8 and
// fused_moe_sm90_grouped_fp8_block): x before the gate/up GEMM, a between the two GEMMs. x at many
// rows: one block per token, its codes written to each of its rows (quant_tokens_kernel, below).
// Otherwise one block per expert-ordered row r < offsets[E]: the source row (x[row_entry[r] / k]
// when row_entry is given, else src row r) -> n e4m3fn codes q[r] and its scales, as the reference
// quantizes (fused_moe_ref_fp8.cpp): s = max(amax, kFp8AmaxFloor) / 448, code = e4m3fn(v / s) (bit-identical to
// f32_to_e4m3fn_bits, cuda/fp8_encode.cuh).
// Two launch shapes (launch_quant_rows / launch_quant_groups):
// - up to kQuantFewRows rows (a row's latency is the time) that the other shape would not cover in
//   one pass (more than 256 chunks or 8 groups): as many threads as the row has 8-value chunks (or
//   warps as it has groups; up to 1024 threads), each loading all of its (up to 2 chunks or 4 groups)
//   before it reduces or encodes any: one memory round trip per row, and the per-row quantizer reads
//   its row once (from registers while n <= threads * 16).
// - otherwise: 256 threads, a chunk (or a warp's group) at a time, per-row amax then codes in two
//   passes over the row; few registers, so that many blocks share an SM and hide each other's latency.
// NOTE: on a few long rows the 256-thread loop is a chain of dependent round trips; the latency
// shape everywhere lost where rows are many (fewer blocks fit an SM, each doing one short round
// trip) and on rows one 256-thread pass covers (docs/experiments.md E45).
// CUDA-only header: include from the .cu files of those paths, inside namespace grouped.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/fp8_encode.cuh"
#include "cuda/fp8_quotient.h"
#include "cuda/pdl.cuh"
#include "moekit/ops/quant.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_common.cuh"

namespace moekit::cuda::grouped {
namespace {

constexpr int kQuantMaxThreads = 1024;
constexpr int kQuantManyThreads = 256;   // block size for many rows
constexpr int kQuantFewRows = 128;       // up to this many rows: the latency shape (a row count, E45)
constexpr int kQuantGroup = 128;         // values per scale group of quant_groups_kernel

template <class S>
__device__ __forceinline__ const S* quant_src_row(const S* src, int64_t ld, const int32_t* row_entry, int k, int r) {
  return src + (row_entry != nullptr ? int64_t(row_entry[r] / k) : int64_t(r)) * ld;
}

// This thread's max |v| over the chunks v[tid * 8 + nt * 8 j ..] < n of a block of nt threads.
template <class S>
__device__ __forceinline__ float row_amax_strided(const S* v, int n, int tid, int nt) {
  float amax = 0.0f;
  for (int c = tid * 8; c < n; c += nt * 8) {
    float g[8];
    load_f32<8>(v + c, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(g[i]));
  }
  return amax;
}
// The maximum of amax over a block of nt threads (red: nt / 32 floats of shared memory); every
// thread gets it.
__device__ __forceinline__ float block_amax(float amax, float* red, int nt) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = red[0];
  for (int w = 1; w < nt / 32; ++w) amax = fmaxf(amax, red[w]);
  return amax;
}

// Per row: one scale s[r] (or *fixed, a static scale). n % 8 == 0, rows 16-byte aligned. kC: chunks
// a thread holds (0: none, two passes over the row, kQuantManyThreads threads).
// amax_given: scale[r] holds the row's amax on entry (max |v|, NaN ignored as fmaxf does; written
// by the gemm before, Fp8GemmArgs::amax): no amax pass, one read of the row.
template <class S, int kC>
__global__ void __launch_bounds__(kC > 0 ? kQuantMaxThreads : kQuantManyThreads)
    quant_rows_kernel(const S* src, int64_t ld, const int32_t* row_entry, int k, const int32_t* offsets, int E, int n,
                      const float* fixed, uint8_t* q, float* scale, bool amax_given) {
  wait_for_predecessor();
  const int r = blockIdx.x;
  if (r >= offsets[E]) return;
  const S* v = quant_src_row(src, ld, row_entry, k, r);
  const int nt = kC > 0 ? int(blockDim.x) : kQuantManyThreads, tid = threadIdx.x;
  const bool held = kC > 0 && n <= nt * 8 * kC;  // else two passes over the row
  constexpr int kH = kC > 0 ? kC : 1;
  float f[kH][8];
  if constexpr (kC > 0) {
    if (held) {
#pragma unroll
      for (int ch = 0; ch < kH; ++ch) {
        const int c = (ch * nt + tid) * 8;
        if (c < n) {
          load_f32<8>(v + c, f[ch]);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) f[ch][i] = 0.0f;
        }
      }
    }
  }
  float s;
  if (fixed != nullptr) {
    s = *fixed;
  } else if (amax_given) {
    s = e4m3fn_scale_of(scale[r]);
    __syncthreads();  // every thread has read the amax before thread 0 overwrites it with s
  } else {
    float amax = 0.0f;
    if (held) {
#pragma unroll
      for (int ch = 0; ch < kH; ++ch) {
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[ch][i]));
      }
    } else {
      amax = row_amax_strided(v, n, tid, nt);
    }
    __shared__ float red[kQuantMaxThreads / 32];
    s = e4m3fn_scale_of(block_amax(amax, red, nt));
  }
  uint8_t* qr = q + int64_t(r) * n;
  auto put = [&](int c, float (&g)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = __fdiv_rn(g[i], s);
    *reinterpret_cast<uint2*>(qr + c) = make_uint2(encode4_e4m3fn(g), encode4_e4m3fn(g + 4));
  };
  if (held) {
#pragma unroll
    for (int ch = 0; ch < kH; ++ch) {
      const int c = (ch * nt + tid) * 8;
      if (c < n) put(c, f[ch]);
    }
  } else {
    for (int c = tid * 8; c < n; c += nt * 8) {
      float g[8];
      load_f32<8>(v + c, g);
      put(c, g);
    }
  }
  if (tid == 0) scale[r] = s;
}

// Per (row, 128-value group): n / 128 scales scale[r, g]. Warp w takes groups w, w + W, ... (W warps),
// each lane 4 consecutive values of a group, kG groups loaded at a time (1: kQuantManyThreads threads).
// n % 128 == 0.
template <class S, int kG>
__global__ void __launch_bounds__(kG > 1 ? kQuantMaxThreads : kQuantManyThreads)
    quant_groups_kernel(const S* src, int64_t ld, const int32_t* row_entry, int k, const int32_t* offsets, int E,
                        int n, uint8_t* q, float* scale) {
  wait_for_predecessor();
  const int r = blockIdx.x;
  if (r >= offsets[E]) return;
  const S* v = quant_src_row(src, ld, row_entry, k, r);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (kG > 1 ? int(blockDim.x) : kQuantManyThreads) >> 5;
  const int G = n / kQuantGroup;
  for (int g0 = warp; g0 < G; g0 += nw * kG) {
    float f[kG][4];
#pragma unroll
    for (int ch = 0; ch < kG; ++ch) {
      const int g = g0 + ch * nw;
      if (g < G) load_f32<4>(v + g * kQuantGroup + lane * 4, f[ch]);
    }
#pragma unroll
    for (int ch = 0; ch < kG; ++ch) {
      const int g = g0 + ch * nw;
      if (g >= G) break;  // warp-uniform
      const float s = warp_group_scale(f[ch]);
#pragma unroll
      for (int i = 0; i < 4; ++i) f[ch][i] = __fdiv_rn(f[ch][i], s);
      *reinterpret_cast<uint32_t*>(q + int64_t(r) * n + g * kQuantGroup + lane * 4) = encode4_e4m3fn(f[ch]);
      if (lane == 0) scale[int64_t(r) * G + g] = s;
    }
  }
}

// x quantized once per token and written to each of its k expert-ordered rows (launch_quant_x's
// shape at many rows): block t quantizes x[t] and stores the codes and scales at every row
// slot_row[t k + j] >= 0. kGroups: a scale per 128-value group (warp w takes groups w, w + 8, ..., a
// lane 4 values), else one per row (fixed: a static scale) over two passes of the row. Dynamic
// scales divide by fp8_quotient_finite and the hardware convert (the codes of the IEEE quotient for
// finite x; a row holding an inf gets NaN codes where the reference has some zeros, and the same
// all-NaN output row); a static scale keeps the checked encoder, whose codes above 448 are NaN.
// NOTE: one block per row quantized each token k times with __fdiv_rn and the checked encoder:
// 112 us of Qwen3-30B T=4096 under ncu, issue-bound (docs/experiments.md E123).
__device__ __forceinline__ uint32_t quant_codes4(const float (&f)[4], float s, float ri) {
  return e4m3fn_quotient_codes2(f[0], f[1], s, ri) | (e4m3fn_quotient_codes2(f[2], f[3], s, ri) << 16);
}
constexpr int kQuantTokenThreads = 256;
template <class S, bool kGroups>
__global__ void __launch_bounds__(kQuantTokenThreads)
    quant_tokens_kernel(const S* x, int64_t ld, const int32_t* slot_row, int k, int n, const float* fixed,
                        uint8_t* q, float* scale) {
  wait_for_predecessor();
  const int t = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const S* v = x + int64_t(t) * ld;
  const int32_t* rows = slot_row + int64_t(t) * k;
  // The token's rows (-1: not computed here), read once (k <= kMaxE: launch_quant_x).
  __shared__ int s_rows[kMaxE];
  for (int j = tid; j < k; j += kQuantTokenThreads) s_rows[j] = rows[j];
  __syncthreads();
  if constexpr (kGroups) {
    const int G = n / kQuantGroup;
    for (int g = warp; g < G; g += kQuantTokenThreads / 32) {
      float f[4];
      load_f32<4>(v + g * kQuantGroup + lane * 4, f);
      const float s = warp_group_scale(f);
      const uint32_t c = quant_codes4(f, s, __frcp_rn(s));
      uint8_t* qg = q + g * kQuantGroup + lane * 4;
      for (int j = 0; j < k; ++j) {
        const int r = s_rows[j];
        if (r < 0) continue;
        *reinterpret_cast<uint32_t*>(qg + int64_t(r) * n) = c;
        if (lane == 0) scale[int64_t(r) * G + g] = s;
      }
    }
  } else {
    float s;
    if (fixed != nullptr) {
      s = *fixed;
    } else {
      __shared__ float red[kQuantTokenThreads / 32];
      s = e4m3fn_scale_of(block_amax(row_amax_strided(v, n, tid, kQuantTokenThreads), red, kQuantTokenThreads));
    }
    const float ri = __frcp_rn(s);
    for (int c = tid * 8; c < n; c += kQuantTokenThreads * 8) {
      float g[8];
      load_f32<8>(v + c, g);
      uint2 w;
      if (fixed != nullptr) {
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] = __fdiv_rn(g[i], s);
        w = make_uint2(encode4_e4m3fn(g), encode4_e4m3fn(g + 4));
      } else {
        const float lo[4] = {g[0], g[1], g[2], g[3]}, hi[4] = {g[4], g[5], g[6], g[7]};
        w = make_uint2(quant_codes4(lo, s, ri), quant_codes4(hi, s, ri));
      }
      for (int j = 0; j < k; ++j) {
        const int r = s_rows[j];
        if (r >= 0) *reinterpret_cast<uint2*>(q + int64_t(r) * n + c) = w;
      }
    }
    for (int j = tid; j < k; j += kQuantTokenThreads) {
      if (s_rows[j] >= 0) scale[s_rows[j]] = s;
    }
  }
}

// Launchers: one block per possible row (rows = T * k; the blocks past offsets[E] return), PDL; the
// launch shape at the top.
inline unsigned quant_warps_threads(int64_t t) {
  return unsigned(std::clamp<int64_t>((t + 31) / 32 * 32, 32, kQuantMaxThreads));
}
template <class S>
Status launch_quant_rows(const S* src, int64_t ld, const int32_t* row_entry, int k, const int32_t* offsets, int E,
                         int n, const float* fixed, uint8_t* q, float* scale, int64_t rows, cudaStream_t s,
                         const char* what, bool amax_given = false) {
  if (rows <= kQuantFewRows && n / 8 > kQuantManyThreads) {
    return launch_pdl(quant_rows_kernel<S, 2>, dim3(unsigned(rows)), dim3(quant_warps_threads(n / 8)), 0, s, what,
                      src, ld, row_entry, k, offsets, E, n, fixed, q, scale, amax_given);
  }
  return launch_pdl(quant_rows_kernel<S, 0>, dim3(unsigned(rows)), dim3(kQuantManyThreads), 0, s, what, src, ld,
                    row_entry, k, offsets, E, n, fixed, q, scale, amax_given);
}
template <class S>
Status launch_quant_groups(const S* src, int64_t ld, const int32_t* row_entry, int k, const int32_t* offsets, int E,
                           int n, uint8_t* q, float* scale, int64_t rows, cudaStream_t s, const char* what) {
  if (rows <= kQuantFewRows && n / kQuantGroup > kQuantManyThreads / 32) {
    return launch_pdl(quant_groups_kernel<S, 4>, dim3(unsigned(rows)), dim3(quant_warps_threads(n / kQuantGroup * 32)),
                      0, s, what, src, ld, row_entry, k, offsets, E, n, q, scale);
  }
  return launch_pdl(quant_groups_kernel<S, 1>, dim3(unsigned(rows)), dim3(kQuantManyThreads), 0, s, what, src, ld,
                    row_entry, k, offsets, E, n, q, scale);
}

// x [T, ld] -> the codes and scales (per 128-group where `groups`, else per row) of the expert-ordered
// rows: the per-token kernel where the rows are many, else the per-row launch shapes (their latency
// shape at few rows, E45).
template <class S>
Status launch_quant_x(const S* x, int64_t ld, const int32_t* slot_row, const int32_t* row_entry, int T, int k,
                      const int32_t* offsets, int E, int n, bool groups, const float* fixed, uint8_t* q, float* scale,
                      int64_t rows, cudaStream_t s, const char* what) {
  if (rows > kQuantFewRows && k <= kMaxE) {
    if (groups) {
      return launch_pdl(quant_tokens_kernel<S, true>, dim3(unsigned(T)), dim3(kQuantTokenThreads), 0, s, what, x, ld,
                        slot_row, k, n, fixed, q, scale);
    }
    return launch_pdl(quant_tokens_kernel<S, false>, dim3(unsigned(T)), dim3(kQuantTokenThreads), 0, s, what, x, ld,
                      slot_row, k, n, fixed, q, scale);
  }
  if (groups) return launch_quant_groups(x, ld, row_entry, k, offsets, E, n, q, scale, rows, s, what);
  return launch_quant_rows(x, ld, row_entry, k, offsets, E, n, fixed, q, scale, rows, s, what);
}

}  // namespace
}  // namespace moekit::cuda::grouped
