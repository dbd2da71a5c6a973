// The fp8 W8A8 stages of fused_moe_sm90_small_m (SPEC 3.2 fp8 per-tensor / per-row weights, 3.4
// router weight on the input), decode-sized T: e4m3fn weights streamed once with 16-byte loads (16
// codes each) and decoded in registers (cvt.rn.f16x2.e4m3x2), activations quantized exactly as the
// reference does (fused_moe_ref_fp8.cpp, run_row):
//   s_t = max(amax(x_t), 1e-12) / 448 (or the static a1_scale), xq = e4m3fn(x_t / s_t);
//   h[n] = (xq . w1q[e, n]) * s_t * w1_scale[e, n]   ([E] scales: per tensor); tkw1: h *= w;
//   a = act(g) * u in f32 (workspace), re-quantized per slot row: s_a, aq = e4m3fn(a / s_a);
//   y[c] = (aq . w2q[e, c]) * s_a * w2_scale[e, c]; then the combine stage of the bf16 path.
// The 128 x 128 block variant (SPEC 3.3, kBlock = true) quantizes x and a per 1 x 128 group instead
// (one warp per group: s_g = max(amax_g, 1e-12) / 448) and promotes each 16-code partial dot with
// (s_g of the row x the weight block's scale) into the f32 sum, as fused_moe_ref_fp8_block does
// per group (same products, the sum split finer).
// The quantized rows are staged in shared memory as f16 (every e4m3fn value is exact in f16), each
// dot accumulates exact fp8 x fp8 products in f32.
// NOTE: these dots are ALU-bound at T=1, decoding e4m3 -> f16 -> f32 (docs/experiments.md E79).
// Tensor-core dots (codes decoded to f16x2, mma.sync m16n8k16 with each lane's chunk on the MMA's
// diagonal) measured slower everywhere (E61). Included by fused_moe_sm90_small_m.cu inside its
// anonymous namespace (uses its Args, tables, helpers and constants).
// Tests: tests/test_fused_moe_sm90_small_m_fp8.cpp (FusedMoeSm90SmallMFp8*), against the reference.
#pragma once

// Decodes 16 e4m3fn codes (one 16-byte vector) to f32.
__device__ __forceinline__ void unpack16_e4m3(const uint4& v, float (&f)[16]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint16_t pair = uint16_t(w[q] >> (16 * h));
      uint32_t hh;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hh) : "h"(pair));
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&hh));
      f[4 * q + 2 * h] = p.x;
      f[4 * q + 2 * h + 1] = p.y;
    }
  }
}

constexpr int kFp8Group = 128;  // the block variant's group / block edge (scale_block_n = scale_block_k)

// The block variant's scales for one warp_dots_fp8 call: weight row r's block scales along K
// (w[r][g], g = K group) and the staged rows' group scales (x[m * kb + g]).
template <int RP>
struct BlockScales {
  const float* w[RP];
  const float* x;
  int kb;  // K / kFp8Group
};

// acc[r][m] += sum over K of fp8 weight row r times staged f16 row m. K % 16 == 0. Lane-partial sums.
// kBlock: each 16-code partial dot is scaled by bs.x[m][g] * bs.w[r][g] before it joins acc.
template <int RP, int MC, bool kBlock = false>
__device__ __forceinline__ void warp_dots_fp8(const uint8_t* const (&wrow)[RP], const __half* xs, int K, int lane,
                                              float (&acc)[RP][MC], const BlockScales<RP>& bs = {}) {
  const int nvec = K / 16;
  for (int c0 = lane; c0 < nvec; c0 += 32 * kUnroll) {
    uint4 wv[RP][kUnroll];
    load_weight_vecs<RP>(wrow, c0, nvec, wv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + 32 * u;
      if (c >= nvec) break;
      float wf[RP][16];
#pragma unroll
      for (int r = 0; r < RP; ++r) unpack16_e4m3(wv[r][u], wf[r]);
      [[maybe_unused]] float sw[RP];
      [[maybe_unused]] const int g = c / (kFp8Group / 16);  // the K group of these 16 codes
      if constexpr (kBlock) {
#pragma unroll
        for (int r = 0; r < RP; ++r) sw[r] = __ldg(bs.w[r] + g);
      }
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        float xlo[8], xhi[8];
        unpack8<__half>(reinterpret_cast<const uint4*>(xs + size_t(m) * K)[2 * c], xlo);
        unpack8<__half>(reinterpret_cast<const uint4*>(xs + size_t(m) * K)[2 * c + 1], xhi);
#pragma unroll
        for (int r = 0; r < RP; ++r) {
          if constexpr (kBlock) {
            float part = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; ++q) part = fmaf(wf[r][q], xlo[q], part);
#pragma unroll
            for (int q = 0; q < 8; ++q) part = fmaf(wf[r][8 + q], xhi[q], part);
            acc[r][m] = fmaf(part, bs.x[m * bs.kb + g] * sw[r], acc[r][m]);
          } else {
#pragma unroll
            for (int q = 0; q < 8; ++q) acc[r][m] = fmaf(wf[r][q], xlo[q], acc[r][m]);
#pragma unroll
            for (int q = 0; q < 8; ++q) acc[r][m] = fmaf(wf[r][8 + q], xhi[q], acc[r][m]);
          }
        }
      }
    }
  }
}

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

// Block-wide max over the CTA (kThreads threads); every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // red is free (previous readers done)
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
  return m;
}

// Quantizes src[0..n) (global, XT) into dst (shared, f16 values of the codes) with the dynamic
// scale max(amax, 1e-12) / 448, or `fixed` when > 0; returns the scale. Whole CTA.
template <class XT>
__device__ __forceinline__ float stage_quantized(__half* dst, const XT* src, int n, float fixed, float* red) {
  float s = fixed;
  if (!(fixed > 0.0f)) {
    float amax = 0.0f;
    for (int c = threadIdx.x; c < n; c += kThreads) amax = fmaxf(amax, fabsf(to_f32(src[c])));
    s = e4m3fn_scale_of(block_max(amax, red));
  }
  for (int c = threadIdx.x; c < n; c += kThreads) {
    dst[c] = __float2half_rn(e4m3fn_bits_to_f32(f32_to_e4m3fn_bits(to_f32(src[c]) / s)));
  }
  return s;
}

// Quantizes src[0..n) (global, XT; n % 128 == 0) into dst (shared, f16 values of the codes) per
// group of 128 with s_g = max(amax_g, 1e-12) / 448 written to scales[g] (shared). One warp per
// group, 4 elements per lane; the caller synchronizes before reading dst / scales.
template <class XT>
__device__ __forceinline__ void stage_quantized_groups(__half* dst, float* scales, const XT* src, int n) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int g = warp; g < n / kFp8Group; g += kWarps) {
    const int c0 = g * kFp8Group + 4 * lane;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[q] = to_f32(src[c0 + q]);
      amax = fmaxf(amax, fabsf(v[q]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sg = e4m3fn_scale_of(amax);
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[c0 + q] = __float2half_rn(e4m3fn_bits_to_f32(f32_to_e4m3fn_bits(v[q] / sg)));
    if (lane == 0) scales[g] = sg;
  }
}

// Zero row (codes) and zero group scales for an unused staging slot of the block variant.
__device__ __forceinline__ void zero_groups(__half* dst, float* scales, int n) {
  zero_row<__half>(dst, n);
  for (int g = threadIdx.x; g < n / kFp8Group; g += kThreads) scales[g] = 0.0f;
}

// Stages slot m of a chunk into rows[m] (f16 values of the codes), or zeros when src is null (a
// slot past the chunk's count), with its scales: kBlock one per 1 x 128 group into
// group_scales[m][n / 128], else one per row (dynamic, or `fixed` when > 0) into s_scale[m]. Whole
// CTA; src null or not is uniform over the CTA.
template <bool kBlock, class XT>
__device__ __forceinline__ void stage_slot(__half* rows, float* group_scales, float* s_scale, float* s_red, int m,
                                           const XT* src, int n, float fixed) {
  __half* dst = rows + size_t(m) * n;
  if constexpr (kBlock) {
    float* gs = group_scales + m * (n / kFp8Group);
    if (src != nullptr) {
      stage_quantized_groups<XT>(dst, gs, src, n);
    } else {
      zero_groups(dst, gs, n);
    }
  } else {
    float s = 0.0f;
    if (src != nullptr) {
      s = stage_quantized<XT>(dst, src, n, fixed, s_red);
    } else {
      zero_row<__half>(dst, n);
    }
    if (threadIdx.x == 0) s_scale[m] = s;
  }
}

__device__ __forceinline__ float weight_scale(const float* s, bool per_row, int e, int64_t n, int64_t N) {
  return per_row ? s[int64_t(e) * N + n] : s[e];
}

// Stage 1 (fp8): grid as gate_up_kernel; a[slot, i] in f32. Dynamic shared memory: MC x H f16
// (kBlock: then MC x H / 128 f32 group scales).
template <class T, int MC, bool kBlock>
__global__ void __launch_bounds__(kThreads) gate_up_fp8_kernel(const Args p) {
  wait_for_predecessor();
  const Tables& tb = p.tb;
  if (int(blockIdx.y) >= *tb.n_active) return;
  const int e = tb.active[blockIdx.y];
  const int count = tb.counts[e], first = tb.offsets[e];
  extern __shared__ uint4 smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  __shared__ float s_scale[MC];
  // 16-byte aligned: block_max reads red[] with LDS.128, which must not cover s_scale (thread 0
  // writes s_scale[m] while the other warps may still read red; racecheck flags the overlap).
  __shared__ __align__(16) float s_red[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * kRows1 + warp;
  const int64_t N1 = p.g1u1 ? 2 * int64_t(p.I) : p.I;
  const uint8_t* w1e = static_cast<const uint8_t*>(p.w1) + int64_t(e) * N1 * p.H;
  const float fixed = p.a1s != nullptr ? *p.a1s : 0.0f;
  const int kb = p.H / kFp8Group;
  float* xsc = reinterpret_cast<float*>(xs + size_t(MC) * p.H);  // kBlock: [MC][kb] group scales
  for (int c0 = 0; c0 < count; c0 += MC) {
    const int mc = min(MC, count - c0);
    __syncthreads();
    for (int m = 0; m < MC; ++m) {
      const T* src = m < mc ? static_cast<const T*>(p.x) + (tb.slot_list[first + c0 + m] / p.k) * p.x_stride : nullptr;
      stage_slot<kBlock, T>(xs, xsc, s_scale, s_red, m, src, p.H, fixed);
    }
    __syncthreads();
    if (i >= p.I) continue;
    const int nr = p.g1u1 ? 2 : 1;
    const uint8_t* rows[2] = {w1e + int64_t(i) * p.H, w1e + (int64_t(p.I) + i) * p.H};
    // kBlock: the [E, N1 / 128, H / 128] scales of the blocks holding the gate row i and up row I + i.
    const int64_t nb1 = N1 / kFp8Group;
    const float* ws_gate = p.w1s + (int64_t(e) * nb1 + i / kFp8Group) * kb;
    const float* ws_up = nr == 2 ? p.w1s + (int64_t(e) * nb1 + (int64_t(p.I) + i) / kFp8Group) * kb : ws_gate;
    float acc[2][MC] = {};
    if (nr == 2) {
      warp_dots_fp8<2, MC, kBlock>(rows, xs, p.H, lane, acc, BlockScales<2>{{ws_gate, ws_up}, xsc, kb});
    } else {
      const uint8_t* one[1] = {rows[0]};
      float acc1[1][MC] = {};
      warp_dots_fp8<1, MC, kBlock>(one, xs, p.H, lane, acc1, BlockScales<1>{{ws_gate}, xsc, kb});
#pragma unroll
      for (int m = 0; m < MC; ++m) acc[0][m] = acc1[0][m];
    }
    float g = 0.0f, u = 0.0f;
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      const float gm = warp_sum(acc[0][m]), um = nr == 2 ? warp_sum(acc[1][m]) : 0.0f;
      if (lane == m) g = gm, u = um;
    }
    if (lane < mc) {
      const int slot = tb.slot_list[first + c0 + lane];
      const float w = p.weight_on_input ? p.wts[slot] : 1.0f;
      if constexpr (kBlock) {  // the scales are already in the sums
        g *= w;
        u *= w;
      } else {
        const float sx = s_scale[lane];
        g = g * sx * weight_scale(p.w1s, p.ws_rows, e, i, N1) * w;
        if (nr == 2) u = u * sx * weight_scale(p.w1s, p.ws_rows, e, int64_t(p.I) + i, N1) * w;
      }
      const float a = nr == 2 ? activate(p.act, g) * u : activate(p.act, g);
      static_cast<float*>(p.a)[int64_t(slot) * p.I + i] = a;
    }
  }
}

// Stage 2 (fp8): grid as down_kernel; the a rows (f32) re-quantized per slot (kBlock: per 1 x 128
// group) while staged.
template <int MC, bool kBlock>
__global__ void __launch_bounds__(kThreads) down_fp8_kernel(const Args p) {
  wait_for_predecessor();
  const Tables& tb = p.tb;
  if (int(blockIdx.y) >= *tb.n_active) return;
  const int e = tb.active[blockIdx.y];
  const int count = tb.counts[e], first = tb.offsets[e];
  extern __shared__ uint4 smem_raw[];
  __half* as = reinterpret_cast<__half*>(smem_raw);
  __shared__ float s_scale[MC];
  // 16-byte aligned: block_max reads red[] with LDS.128, which must not cover s_scale (thread 0
  // writes s_scale[m] while the other warps may still read red; racecheck flags the overlap).
  __shared__ __align__(16) float s_red[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h0 = blockIdx.x * kRows2 + 2 * warp;
  const uint8_t* w2e = static_cast<const uint8_t*>(p.w2) + int64_t(e) * p.H * p.I;
  const int kb = p.I / kFp8Group;
  float* asc = reinterpret_cast<float*>(as + size_t(MC) * p.I);  // kBlock: [MC][kb] group scales
  for (int c0 = 0; c0 < count; c0 += MC) {
    const int mc = min(MC, count - c0);
    __syncthreads();
    for (int m = 0; m < MC; ++m) {
      const float* src = m < mc ? static_cast<const float*>(p.a) + int64_t(tb.slot_list[first + c0 + m]) * p.I : nullptr;
      stage_slot<kBlock, float>(as, asc, s_scale, s_red, m, src, p.I, 0.0f);
    }
    __syncthreads();
    if (h0 >= p.H) continue;
    const uint8_t* rows[2] = {w2e + int64_t(h0) * p.I, w2e + int64_t(h0 + 1) * p.I};
    // kBlock: the [E, H / 128, I / 128] scales of the blocks holding rows h0 and h0 + 1.
    const int64_t nb2 = p.H / kFp8Group;
    const float* ws0 = p.w2s + (int64_t(e) * nb2 + h0 / kFp8Group) * kb;
    const float* ws1 = p.w2s + (int64_t(e) * nb2 + (h0 + 1) / kFp8Group) * kb;
    float acc[2][MC] = {};
    warp_dots_fp8<2, MC, kBlock>(rows, as, p.I, lane, acc, BlockScales<2>{{ws0, ws1}, asc, kb});
    float y0 = 0.0f, y1 = 0.0f;
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      const float s0 = warp_sum(acc[0][m]), s1 = warp_sum(acc[1][m]);
      if (lane == m) y0 = s0, y1 = s1;
    }
    if (lane < mc) {
      const int slot = tb.slot_list[first + c0 + lane];
      if constexpr (!kBlock) {  // kBlock: the scales are already in the sums
        const float sa = s_scale[lane];
        y0 *= sa * weight_scale(p.w2s, p.ws_rows, e, h0, p.H);
        y1 *= sa * weight_scale(p.w2s, p.ws_rows, e, h0 + 1, p.H);
      }
      *reinterpret_cast<float2*>(p.y + int64_t(slot) * p.H + h0) = make_float2(y0, y1);
    }
  }
}
