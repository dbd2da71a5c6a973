// fused_moe_sm90_small_m: unquantized fused MoE for small token counts (decode), bf16 / f16, on
// Hopper (SPEC 3.1, 3.4, 3.5). Memory-bound design: each touched expert's weights are streamed from
// HBM exactly once with 16-byte coalesced loads, spread over all SMs; tensor cores are not used
// (at T <= 8 a CUDA-core dot keeps up with HBM). Correct for any T (slower at large T: each CTA
// loops over its expert's slots in chunks of MC, re-reading its weight tile from L2).
//
// Four launches on ctx.stream, all stream-ordered (no host sync, no allocation):
//   0. route (1 CTA): global -> local expert table (identity / cumsum(mask)-1 / map), the local
//      expert of every slot t*k+j (-1 for -1 ids, remote experts and ids outside [-1, Eg)), the
//      slots of each expert (counts, offsets, list) and the ascending list of touched experts.
//   1. gate_up: grid (I / 8, min(E, T*k)); CTA y takes the y-th touched expert (exits at once when
//      y >= number touched), stages the x rows of up to MC of its slots in shared memory, and each
//      warp dots one gate row i and its up row I+i (g1u1; g1u0: one row) with them, then writes
//      a = act(w*g) * (w*u) (w = router weight with weight_on_input, else 1) rounded to x's dtype
//      (round_intermediate; else kept in f32) to a[slot, i].
//   2. down: grid (H / 16, min(E, T*k)); each warp dots two rows of w2[e] with the a rows of the
//      slots, writing y_slot[slot, h] in f32.
//   3. combine: out[t] = sum over j (in order) of w_tj * y_slot[t*k+j] (w = 1 with
//      weight_on_input), one rounding to x's dtype; tokens without a local expert get zeros.
// Each dot: a lane accumulates 8-element chunks lane, lane+32, ... in f32, then a fixed butterfly
// over the warp. Slot order inside an expert's list comes from shared atomics, but every slot's
// result is computed by the same instruction sequence wherever it sits: outputs are deterministic.
// Tests: tests/test_fused_moe_sm90_small_m.cpp (FusedMoeSm90SmallM.*), against fused_moe_ref.
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_kernels.h"
#include "cuda/block_scan.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/fp8_quotient.h"
#include "cuda/pdl.cuh"
#include "moekit/ops/quant.h"

namespace moekit::cuda {

namespace {

constexpr int kWarps = 8;                      // warps per CTA of stages 1 and 2
constexpr int kThreads = kWarps * 32;
constexpr int kRouteThreads = 1024;            // the single routing CTA
static_assert(kRouteThreads == 1024, "the routing scans use block_inclusive_sum_1024");
constexpr int kMaxExperts = kRouteThreads;     // local experts (one scan chunk)
constexpr int kUnroll = 4;                     // 16-byte loads in flight per weight row and lane
constexpr int kRows1 = kWarps;                 // intermediate rows i per stage-1 CTA (1 per warp)
constexpr int kRows2 = 2 * kWarps;             // output rows h per stage-2 CTA (2 per warp)
constexpr size_t kStageBudget = 96 * 1024;     // shared bytes for the staged x / a rows
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// ---------------------------------------------------------------- workspace layout
struct WsLayout {
  size_t local, counts, offsets, active, n_active, slot_expert, slot_list, a, y, total;
};

WsLayout layout_of(const MoeDims& d, size_t a_elem) {
  const size_t slots = size_t(d.T * d.k);
  WsLayout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l.local = take(size_t(d.Eg) * 4);
  l.counts = take(size_t(d.E) * 4);
  l.offsets = take(size_t(d.E) * 4);
  l.active = take(size_t(d.E) * 4);
  l.n_active = take(4);
  l.slot_expert = take(slots * 4);
  l.slot_list = take(slots * 4);
  l.a = take(slots * size_t(d.I) * a_elem);
  l.y = take(slots * size_t(d.H) * 4);
  l.total = off + kAlign;  // the caller's workspace need not be aligned: run() aligns its start
  return l;
}

// ---------------------------------------------------------------- element helpers
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }

// 8 consecutive 16-bit values (one 16-byte vector) as f32.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      // bf16 -> f32 is a 16-bit shift: exact and cheaper than the intrinsic pair.
      f[2 * q] = __uint_as_float(w[q] << 16);
      f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    } else {
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w[q]));
      f[2 * q] = p.x;
      f[2 * q + 1] = p.y;
    }
  }
}

// Streaming 16-byte weight load: read-only path, no L1 allocation (each byte is read once).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The 16-byte vectors c0 + 32 u (u < kUnroll) of each of the RP weight rows (zeros at and past
// nvec), all loads issued before any is used: warp_dots' and warp_dots_fp8's memory stream.
template <int RP, class W>
__device__ __forceinline__ void load_weight_vecs(const W* const (&wrow)[RP], int c0, int nvec,
                                                 uint4 (&wv)[RP][kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int c = c0 + 32 * u;
#pragma unroll
    for (int r = 0; r < RP; ++r) {
      wv[r][u] = c < nvec ? load_stream(reinterpret_cast<const uint4*>(wrow[r]) + c) : make_uint4(0, 0, 0, 0);
    }
  }
}

// Elements 8c .. 8c+7 of a staged shared-memory row as f32 (XT: 16-bit type or f32).
template <class XT>
__device__ __forceinline__ void load_staged8(const XT* row, int c, float (&f)[8]) {
  if constexpr (std::is_same_v<XT, float>) {
    const float4 lo = reinterpret_cast<const float4*>(row)[2 * c];
    const float4 hi = reinterpret_cast<const float4*>(row)[2 * c + 1];
    f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
  } else {
    unpack8<XT>(reinterpret_cast<const uint4*>(row)[c], f);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc[r][m] += sum over K of row r of the weights (T, K elements, 16-byte aligned) times staged
// row m (shared memory, XT). K % 8 == 0. Lane-partial sums only: the caller reduces over the warp.
template <class T, class XT, int RP, int MC>
__device__ __forceinline__ void warp_dots(const T* const (&wrow)[RP], const XT* xs, int K, int lane,
                                          float (&acc)[RP][MC]) {
  const int nvec = K / 8;
  for (int c0 = lane; c0 < nvec; c0 += 32 * kUnroll) {
    uint4 wv[RP][kUnroll];
    load_weight_vecs<RP>(wrow, c0, nvec, wv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + 32 * u;
      if (c >= nvec) break;
      float wf[RP][8];
#pragma unroll
      for (int r = 0; r < RP; ++r) unpack8<T>(wv[r][u], wf[r]);
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        float xf[8];
        load_staged8<XT>(xs + size_t(m) * K, c, xf);
#pragma unroll
        for (int r = 0; r < RP; ++r) {
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[r][m] = fmaf(wf[r][q], xf[q], acc[r][m]);
        }
      }
    }
  }
}

// Copies n elements (n % 8 == 0) from global src to shared dst (16-byte aligned) with 16-byte loads
// when src is aligned, element by element otherwise (row-strided x).
// NOTE: plain (coherent) loads, not the read-only path: under PDL the down kernel is already
// running while the gate_up kernel writes its a rows, so they are not read-only for its lifetime.
template <class XT>
__device__ __forceinline__ void stage_row(XT* dst, const XT* src, int n) {
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    constexpr int per = 16 / sizeof(XT);
    for (int v = threadIdx.x; v < n / per; v += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
    }
  } else {
    for (int v = threadIdx.x; v < n; v += blockDim.x) dst[v] = src[v];
  }
}

template <class XT>
__device__ __forceinline__ void zero_row(XT* dst, int n) {
  constexpr int per = 16 / sizeof(XT);
  for (int v = threadIdx.x; v < n / per; v += blockDim.x) reinterpret_cast<uint4*>(dst)[v] = make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ float activate(int act, float z) {
  switch (act) {
    case int(Activation::gelu): return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
    case int(Activation::gelu_tanh): {
      const float c = 0.79788456080286536f;  // sqrt(2 / pi)
      return 0.5f * z * (1.0f + tanhf(c * (z + 0.044715f * z * z * z)));
    }
    default: return z / (1.0f + expf(-z));  // silu
  }
}

// ---------------------------------------------------------------- kernel arguments
struct Tables {
  int32_t* local;        // [Eg] local expert of each global id, -1 = remote
  int32_t* counts;       // [E] slots routed to each local expert
  int32_t* offsets;      // [E] start of each expert's slots in slot_list
  int32_t* active;       // [E] touched experts, ascending; the first *n_active are valid
  int32_t* n_active;     // [1]
  int32_t* slot_expert;  // [T*k] local expert of slot t*k+j, -1 = skipped
  int32_t* slot_list;    // [T*k] slots grouped by expert
};

struct Args {
  Tables tb;
  const void* x;          // [T, H] row stride x_stride
  const void* w1;         // [E, N1, H]
  const void* w2;         // [E, H, I]
  const int32_t* ids;     // [T, k]
  const float* wts;       // [T, k]
  const int32_t* mask;    // [Eg] or null
  const int32_t* map;     // [Eg] or null
  void* out;              // [T, H] row stride out_stride
  void* a;                // [T*k, I] in x's dtype (round_intermediate) or f32
  float* y;               // [T*k, H] f32
  int64_t x_stride, out_stride;
  int T, H, I, E, Eg, k;
  int act;                // Activation
  bool g1u1, weight_on_input;
  // fp8 variants (fused_moe_sm90_small_m_fp8.cuh): weight scales [E] or [E, N] (ws_rows), the
  // optional static activation scale (device [1], null = dynamic per token).
  const float* w1s = nullptr;
  const float* w2s = nullptr;
  const float* a1s = nullptr;
  bool ws_rows = false;
};

// ---------------------------------------------------------------- stage 0: routing tables
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const Args p) {
  __shared__ int cursor[kMaxExperts];
  wait_for_predecessor();  // ids / mask / map come from earlier work; the tables are reused
  const Tables& tb = p.tb;
  const int tid = threadIdx.x;
  // Global -> local table. NOTE: bad mask / map values (device data is not validated on the host)
  // become -1 here, so no later index can leave [0, E).
  int carry = 0;
  for (int base = 0; base < p.Eg; base += kRouteThreads) {  // uniform trip count: scans stay in step
    const int g = base + tid;
    if (p.mask != nullptr) {
      const int on = g < p.Eg && p.mask[g] != 0;
      int total = 0;
      const int local = carry + block_inclusive_sum_1024(on, &total) - 1;
      if (g < p.Eg) tb.local[g] = on && local < p.E ? local : -1;
      carry += total;
    } else if (g < p.Eg) {
      const int m = p.map != nullptr ? p.map[g] : g;
      tb.local[g] = m >= 0 && m < p.E ? m : -1;
    }
  }
  for (int e = tid; e < p.E; e += kRouteThreads) cursor[e] = 0;
  __syncthreads();  // local[] (global memory) and cursor[] visible to the whole block
  const int slots = p.T * p.k;
  for (int s = tid; s < slots; s += kRouteThreads) {
    const int id = p.ids[s];
    const int e = id >= 0 && id < p.Eg ? tb.local[id] : -1;
    tb.slot_expert[s] = e;
    if (e >= 0) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  // Offsets (exclusive scan of the counts) and the ascending list of touched experts.
  const int c = tid < p.E ? cursor[tid] : 0;
  int total_slots = 0, total_active = 0;
  const int off = block_inclusive_sum_1024(c, &total_slots) - c;
  const int rank = block_inclusive_sum_1024(c > 0, &total_active) - 1;
  if (tid < p.E) {
    tb.counts[tid] = c;
    tb.offsets[tid] = off;
    cursor[tid] = off;
    if (c > 0) tb.active[rank] = tid;
  }
  if (tid == 0) *tb.n_active = total_active;
  __syncthreads();
  for (int s = tid; s < slots; s += kRouteThreads) {
    const int e = tb.slot_expert[s];  // written by this same thread above
    if (e >= 0) tb.slot_list[atomicAdd(&cursor[e], 1)] = s;
  }
}

// ---------------------------------------------------------------- stage 1: gate/up + activation
// Dynamic shared memory: MC staged x rows [MC][H] of T.
template <class T, class AT, int MC>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(const Args p) {
  wait_for_predecessor();
  const Tables& tb = p.tb;
  if (int(blockIdx.y) >= *tb.n_active) return;  // fewer touched experts than the grid allows
  const int e = tb.active[blockIdx.y];
  const int count = tb.counts[e], first = tb.offsets[e];
  extern __shared__ uint4 smem_raw[];
  T* xs = reinterpret_cast<T*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * kRows1 + warp;  // this warp's intermediate row
  const int64_t N1 = p.g1u1 ? 2 * int64_t(p.I) : p.I;
  const T* w1e = static_cast<const T*>(p.w1) + int64_t(e) * N1 * p.H;
  for (int c0 = 0; c0 < count; c0 += MC) {
    const int mc = min(MC, count - c0);
    __syncthreads();  // the previous chunk's readers are done with xs
    for (int m = 0; m < MC; ++m) {
      if (m < mc) {
        const int t = tb.slot_list[first + c0 + m] / p.k;
        stage_row<T>(xs + size_t(m) * p.H, static_cast<const T*>(p.x) + t * p.x_stride, p.H);
      } else {
        zero_row<T>(xs + size_t(m) * p.H, p.H);
      }
    }
    __syncthreads();
    if (i >= p.I) continue;  // warp-uniform; the loop's barrier is still reached by every warp
    if (p.g1u1) {
      const T* rows[2] = {w1e + int64_t(i) * p.H, w1e + (int64_t(p.I) + i) * p.H};
      float acc[2][MC] = {};
      warp_dots<T, T, 2, MC>(rows, xs, p.H, lane, acc);
      float g = 0.0f, u = 0.0f;  // lane m keeps slot m's sums: one activation per lane
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        const float gm = warp_sum(acc[0][m]), um = warp_sum(acc[1][m]);
        if (lane == m) g = gm, u = um;
      }
      if (lane < mc) {
        const int slot = tb.slot_list[first + c0 + lane];
        const float w = p.weight_on_input ? p.wts[slot] : 1.0f;
        const float a = activate(p.act, g * w) * (u * w);
        static_cast<AT*>(p.a)[int64_t(slot) * p.I + i] = from_f32<AT>(a);
      }
    } else {
      const T* rows[1] = {w1e + int64_t(i) * p.H};
      float acc[1][MC] = {};
      warp_dots<T, T, 1, MC>(rows, xs, p.H, lane, acc);
      float h = 0.0f;
#pragma unroll
      for (int m = 0; m < MC; ++m) {
        const float hm = warp_sum(acc[0][m]);
        if (lane == m) h = hm;
      }
      if (lane < mc) {
        const int slot = tb.slot_list[first + c0 + lane];
        const float w = p.weight_on_input ? p.wts[slot] : 1.0f;
        static_cast<AT*>(p.a)[int64_t(slot) * p.I + i] = from_f32<AT>(activate(p.act, h * w));
      }
    }
  }
}

// ---------------------------------------------------------------- stage 2: down projection
// Dynamic shared memory: MC staged a rows [MC][I] of AT.
template <class T, class AT, int MC>
__global__ void __launch_bounds__(kThreads) down_kernel(const Args p) {
  wait_for_predecessor();
  const Tables& tb = p.tb;
  if (int(blockIdx.y) >= *tb.n_active) return;
  const int e = tb.active[blockIdx.y];
  const int count = tb.counts[e], first = tb.offsets[e];
  extern __shared__ uint4 smem_raw[];
  AT* as = reinterpret_cast<AT*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h0 = blockIdx.x * kRows2 + 2 * warp;  // this warp's rows h0, h0 + 1 (H % 8 == 0)
  const T* w2e = static_cast<const T*>(p.w2) + int64_t(e) * p.H * p.I;
  for (int c0 = 0; c0 < count; c0 += MC) {
    const int mc = min(MC, count - c0);
    __syncthreads();
    for (int m = 0; m < MC; ++m) {
      if (m < mc) {
        const int slot = tb.slot_list[first + c0 + m];
        stage_row<AT>(as + size_t(m) * p.I, static_cast<const AT*>(p.a) + int64_t(slot) * p.I, p.I);
      } else {
        zero_row<AT>(as + size_t(m) * p.I, p.I);
      }
    }
    __syncthreads();
    if (h0 >= p.H) continue;
    const T* rows[2] = {w2e + int64_t(h0) * p.I, w2e + int64_t(h0 + 1) * p.I};
    float acc[2][MC] = {};
    warp_dots<T, AT, 2, MC>(rows, as, p.I, lane, acc);
    float y0 = 0.0f, y1 = 0.0f;  // lane m keeps slot m's sums
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      const float s0 = warp_sum(acc[0][m]), s1 = warp_sum(acc[1][m]);
      if (lane == m) y0 = s0, y1 = s1;
    }
    if (lane < mc) {
      const int slot = tb.slot_list[first + c0 + lane];
      *reinterpret_cast<float2*>(p.y + int64_t(slot) * p.H + h0) = make_float2(y0, y1);
    }
  }
}

// ---------------------------------------------------------------- stage 3: weighted sum over k
// Grid (T, ceil(H / 8 / 128)); each thread makes 8 outputs of one token.
template <class T>
__global__ void __launch_bounds__(128) combine_kernel(const Args p) {
  wait_for_predecessor();
  const int t = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;  // 8-element chunk of the row
  if (c * 8 >= p.H) return;
  float acc[8] = {};
  for (int j = 0; j < p.k; ++j) {
    const int s = t * p.k + j;
    if (p.tb.slot_expert[s] < 0) continue;  // -1 id, remote expert or bad id: contributes nothing
    const float w = p.weight_on_input ? 1.0f : p.wts[s];
    const float4* y = reinterpret_cast<const float4*>(p.y + int64_t(s) * p.H + c * 8);
    const float4 lo = y[0], hi = y[1];
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int q = 0; q < 8; ++q) acc[q] += w * v[q];
  }
  T* o = static_cast<T*>(p.out) + t * p.out_stride + c * 8;
  if ((reinterpret_cast<uintptr_t>(o) & 15) == 0) {
    union {
      uint4 v;
      T e[8];
    } pack;
#pragma unroll
    for (int q = 0; q < 8; ++q) pack.e[q] = from_f32<T>(acc[q]);
    *reinterpret_cast<uint4*>(o) = pack.v;
  } else {
#pragma unroll
    for (int q = 0; q < 8; ++q) o[q] = from_f32<T>(acc[q]);
  }
}

#include "ops/fused_moe/fused_moe_sm90_small_m_fp8.cuh"

// ---------------------------------------------------------------- host side
size_t elem_bytes(DType t) { return t == DType::f32 ? 4 : 2; }
size_t a_elem_bytes(const FusedMoeParams& p) { return p.round_intermediate ? elem_bytes(p.x.dtype) : 4; }

// Slots staged per pass (a performance choice only: any count is correct, an expert with more
// slots takes several passes over its weight tile). The expected slots of a touched expert are
// about max(1, T*k/E); staging twice that (at least 2, at most T and 8) keeps a second pass rare
// without dotting many all-zero rows. Rounded up to a power of two, then halved while the rows
// exceed the shared-memory budget (0: not even one row fits).
int pick_mc(int64_t T, int64_t k, int64_t E, size_t row_bytes) {
  const int64_t expected = (T * k + E - 1) / std::max<int64_t>(E, 1);
  const int64_t want = std::min<int64_t>(T, std::max<int64_t>(2, 2 * expected));
  int mc = 1;
  while (mc < want && mc < 8) mc *= 2;
  while (mc > 0 && size_t(mc) * row_bytes > kStageBudget) mc /= 2;
  return mc;
}

// Launches kernel(a) with the PDL attribute (cuda/pdl.cuh).
Status launch(void (*kernel)(Args), dim3 grid, dim3 block, size_t smem, cudaStream_t st, const Args& a,
              const char* name) {
  if (smem > 48 * 1024) {
    MOEKIT_RETURN_IF_ERROR(
        check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), name));
  }
  return launch_pdl(kernel, grid, block, smem, st, name, a);
}

template <class T, class AT>
Status run_typed(const Args& a, int mc1, int mc2, cudaStream_t st) {
  const int slots = a.T * a.k;
  const int ey = std::min(a.E, slots);  // most experts a call can touch
  MOEKIT_RETURN_IF_ERROR(launch(route_kernel, dim3(1), dim3(kRouteThreads), 0, st, a, "fused_moe_small_m route"));
  const dim3 g1(unsigned(ceil_div(a.I, kRows1)), unsigned(ey));
  const size_t s1 = size_t(mc1) * size_t(a.H) * sizeof(T);
  const char* n1 = "fused_moe_small_m gate_up";
  switch (mc1) {
    case 1: MOEKIT_RETURN_IF_ERROR(launch(gate_up_kernel<T, AT, 1>, g1, dim3(kThreads), s1, st, a, n1)); break;
    case 2: MOEKIT_RETURN_IF_ERROR(launch(gate_up_kernel<T, AT, 2>, g1, dim3(kThreads), s1, st, a, n1)); break;
    case 4: MOEKIT_RETURN_IF_ERROR(launch(gate_up_kernel<T, AT, 4>, g1, dim3(kThreads), s1, st, a, n1)); break;
    default: MOEKIT_RETURN_IF_ERROR(launch(gate_up_kernel<T, AT, 8>, g1, dim3(kThreads), s1, st, a, n1)); break;
  }
  const dim3 g2(unsigned(ceil_div(a.H, kRows2)), unsigned(ey));
  const size_t s2 = size_t(mc2) * size_t(a.I) * sizeof(AT);
  const char* n2 = "fused_moe_small_m down";
  switch (mc2) {
    case 1: MOEKIT_RETURN_IF_ERROR(launch(down_kernel<T, AT, 1>, g2, dim3(kThreads), s2, st, a, n2)); break;
    case 2: MOEKIT_RETURN_IF_ERROR(launch(down_kernel<T, AT, 2>, g2, dim3(kThreads), s2, st, a, n2)); break;
    case 4: MOEKIT_RETURN_IF_ERROR(launch(down_kernel<T, AT, 4>, g2, dim3(kThreads), s2, st, a, n2)); break;
    default: MOEKIT_RETURN_IF_ERROR(launch(down_kernel<T, AT, 8>, g2, dim3(kThreads), s2, st, a, n2)); break;
  }
  const dim3 g3(unsigned(a.T), unsigned(ceil_div(a.H / 8, 128)));
  return launch(combine_kernel<T>, g3, dim3(128), 0, st, a, "fused_moe_small_m combine");
}

// Shared bytes of one staged fp8 row of n codes (f16 values), plus its group scales (block variant).
size_t fp8_row_bytes(int64_t n, bool block) { return size_t(n) * 2 + (block ? size_t(n / kFp8Group) * 4 : 0); }

template <class T, bool kBlock>
Status run_fp8_typed(const Args& a, int mc1, int mc2, cudaStream_t st) {
  const int slots = a.T * a.k;
  const int ey = std::min(a.E, slots);
  MOEKIT_RETURN_IF_ERROR(launch(route_kernel, dim3(1), dim3(kRouteThreads), 0, st, a, "fused_moe_small_m route"));
  const dim3 g1(unsigned(ceil_div(a.I, kRows1)), unsigned(ey));
  const size_t s1 = size_t(mc1) * fp8_row_bytes(a.H, kBlock);
  const char* n1 = kBlock ? "fused_moe_small_m gate_up_fp8_block" : "fused_moe_small_m gate_up_fp8";
  switch (mc1) {
    case 1: MOEKIT_RETURN_IF_ERROR(launch(gate_up_fp8_kernel<T, 1, kBlock>, g1, dim3(kThreads), s1, st, a, n1)); break;
    case 2: MOEKIT_RETURN_IF_ERROR(launch(gate_up_fp8_kernel<T, 2, kBlock>, g1, dim3(kThreads), s1, st, a, n1)); break;
    case 4: MOEKIT_RETURN_IF_ERROR(launch(gate_up_fp8_kernel<T, 4, kBlock>, g1, dim3(kThreads), s1, st, a, n1)); break;
    default: MOEKIT_RETURN_IF_ERROR(launch(gate_up_fp8_kernel<T, 8, kBlock>, g1, dim3(kThreads), s1, st, a, n1)); break;
  }
  const dim3 g2(unsigned(ceil_div(a.H, kRows2)), unsigned(ey));
  const size_t s2 = size_t(mc2) * fp8_row_bytes(a.I, kBlock);
  const char* n2 = kBlock ? "fused_moe_small_m down_fp8_block" : "fused_moe_small_m down_fp8";
  switch (mc2) {
    case 1: MOEKIT_RETURN_IF_ERROR(launch(down_fp8_kernel<1, kBlock>, g2, dim3(kThreads), s2, st, a, n2)); break;
    case 2: MOEKIT_RETURN_IF_ERROR(launch(down_fp8_kernel<2, kBlock>, g2, dim3(kThreads), s2, st, a, n2)); break;
    case 4: MOEKIT_RETURN_IF_ERROR(launch(down_fp8_kernel<4, kBlock>, g2, dim3(kThreads), s2, st, a, n2)); break;
    default: MOEKIT_RETURN_IF_ERROR(launch(down_fp8_kernel<8, kBlock>, g2, dim3(kThreads), s2, st, a, n2)); break;
  }
  const dim3 g3(unsigned(a.T), unsigned(ceil_div(a.H / 8, 128)));
  return launch(combine_kernel<T>, g3, dim3(128), 0, st, a, "fused_moe_small_m combine");
}

// Scale tensors of the fp8 variants: [E] (per tensor) or [E, N] / [E, N, 1] (per row), f32, device.
Status supports_fp8_impl(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(check_fp8_operands(p));
  if (p.scale_block_n != 0 || p.scale_block_k != 0) {
    return Unsupported("scale_block_n/k: block scales are not supported here, got ", p.scale_block_n, "x",
                       p.scale_block_k);
  }
  const MoeDims d = moe_dims(p);
  bool r1 = false, r2 = false;
  MOEKIT_RETURN_IF_ERROR(check_fp8_weight_scale(p.w1_scale, "w1_scale", d.E, d.N1, &r1));
  MOEKIT_RETURN_IF_ERROR(check_fp8_weight_scale(p.w2_scale, "w2_scale", d.E, d.H, &r2));
  if (r1 != r2) return Unsupported("w1_scale/w2_scale: both per-tensor or both per-row");
  if (d.H % 16 != 0 || d.I % 16 != 0) {
    return Unsupported("H = ", d.H, ", I = ", d.I, ": both must be multiples of 16 (16 fp8 codes per vector)");
  }
  if (reinterpret_cast<uintptr_t>(p.w1.data) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w2.data) % 16 != 0) {
    return Unsupported("w1/w2: data must be 16-byte aligned");
  }
  if (d.E > kMaxExperts) return Unsupported("E = ", d.E, ": at most ", kMaxExperts, " local experts");
  if (d.T * d.k > (int64_t(1) << 30) || d.Eg > (int64_t(1) << 30) || d.H > (1 << 30) || d.I > (1 << 30)) {
    return Unsupported("T*k = ", d.T * d.k, ", Eg = ", d.Eg, ": sizes must fit 32-bit indices");
  }
  if (pick_mc(1, 1, 1, size_t(d.H) * 2) == 0 || pick_mc(1, 1, 1, size_t(d.I) * 2) == 0) {
    return Unsupported("H = ", d.H, ", I = ", d.I, ": one staged row exceeds the ", kStageBudget,
                       "-byte shared-memory stage");
  }
  return Status::Ok();
}

// The 128 x 128 block variant: scales [E, N1 / 128, H / 128] and [E, H / 128, I / 128], H and I
// multiples of 128, no static activation scale (x is quantized per 1 x 128 group).
Status supports_fp8_block_impl(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(check_fp8_operands(p));
  if (p.scale_block_n != kFp8Group || p.scale_block_k != kFp8Group) {
    return Unsupported("scale_block_n/k: 128 x 128 block scales only, got ", p.scale_block_n, "x", p.scale_block_k);
  }
  if (p.a1_scale.present()) return Unsupported("a1_scale: the block variant quantizes x per 1 x 128 group");
  const MoeDims d = moe_dims(p);
  if (d.H % kFp8Group != 0 || d.I % kFp8Group != 0) {
    return Unsupported("H = ", d.H, ", I = ", d.I, ": both must be multiples of 128 (the scale blocks)");
  }
  MOEKIT_RETURN_IF_ERROR(check_fp8_block_scale(p.w1_scale, "w1_scale", d.E, d.N1, d.H));
  MOEKIT_RETURN_IF_ERROR(check_fp8_block_scale(p.w2_scale, "w2_scale", d.E, d.H, d.I));
  if (reinterpret_cast<uintptr_t>(p.w1.data) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w2.data) % 16 != 0) {
    return Unsupported("w1/w2: data must be 16-byte aligned");
  }
  if (d.E > kMaxExperts) return Unsupported("E = ", d.E, ": at most ", kMaxExperts, " local experts");
  if (d.T * d.k > (int64_t(1) << 30) || d.Eg > (int64_t(1) << 30) || d.H > (1 << 30) || d.I > (1 << 30)) {
    return Unsupported("T*k = ", d.T * d.k, ", Eg = ", d.Eg, ": sizes must fit 32-bit indices");
  }
  if (pick_mc(1, 1, 1, fp8_row_bytes(d.H, true)) == 0 || pick_mc(1, 1, 1, fp8_row_bytes(d.I, true)) == 0) {
    return Unsupported("H = ", d.H, ", I = ", d.I, ": one staged row exceeds the ", kStageBudget,
                       "-byte shared-memory stage");
  }
  return Status::Ok();
}

size_t workspace_fp8_impl(const FusedMoeParams& p) { return layout_of(moe_dims(p), 4).total; }

Status supports_impl(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_device({{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2}, {"topk_ids", &p.topk_ids},
                                         {"topk_weights", &p.topk_weights}, {"out", &p.out},
                                         {"expert_mask", &p.expert_mask}, {"expert_map", &p.expert_map}}));
  if (p.x.dtype != DType::bf16 && p.x.dtype != DType::f16) {
    return Unsupported("x: dtype ", dtype_name(p.x.dtype), " (this kernel does bf16 and f16 only)");
  }
  if (p.w1.dtype != p.x.dtype || p.w2.dtype != p.x.dtype) {
    return Unsupported("w1/w2: dtype must be x's (", dtype_name(p.x.dtype), "), got ", dtype_name(p.w1.dtype), "/",
                       dtype_name(p.w2.dtype));
  }
  if (p.w1.layout != Layout::row_major || p.w2.layout != Layout::row_major) {
    return Unsupported("w1/w2: layout ", layout_name(p.w1.layout), "/", layout_name(p.w2.layout),
                       " (this kernel reads row_major weights only)");
  }
  const MoeDims d = moe_dims(p);
  if (d.H % 8 != 0 || d.I % 8 != 0) {
    return Unsupported("H = ", d.H, ", I = ", d.I, ": both must be multiples of 8 (16-byte vectors)");
  }
  if (reinterpret_cast<uintptr_t>(p.w1.data) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w2.data) % 16 != 0) {
    return Unsupported("w1/w2: data must be 16-byte aligned");
  }
  if (d.E > kMaxExperts) return Unsupported("E = ", d.E, ": at most ", kMaxExperts, " local experts");
  if (d.T * d.k > (int64_t(1) << 30) || d.Eg > (int64_t(1) << 30) || d.H > (1 << 30) || d.I > (1 << 30)) {
    return Unsupported("T*k = ", d.T * d.k, ", Eg = ", d.Eg, ": sizes must fit 32-bit indices");
  }
  if (pick_mc(1, 1, 1, size_t(d.H) * elem_bytes(p.x.dtype)) == 0) {
    return Unsupported("H = ", d.H, ": one x row exceeds the ", kStageBudget, "-byte shared-memory stage");
  }
  if (pick_mc(1, 1, 1, size_t(d.I) * a_elem_bytes(p)) == 0) {
    return Unsupported("I = ", d.I, ": one intermediate row exceeds the ", kStageBudget, "-byte shared-memory stage");
  }
  return Status::Ok();
}

size_t workspace_impl(const FusedMoeParams& p) { return layout_of(moe_dims(p), a_elem_bytes(p)).total; }

enum class Quant { none, fp8_row, fp8_block };

Status run_any(const FusedMoeParams& p, const RunContext& ctx, Quant quant) {
  const bool fp8 = quant != Quant::none;
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  const size_t ae = fp8 ? 4 : a_elem_bytes(p);
  const WsLayout l = layout_of(d, ae);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < l.total) {
    return InvalidArgument("workspace: fused_moe_sm90_small_m needs ", l.total, " bytes of device workspace, got ",
                           ctx.workspace_bytes);
  }
  auto* base = static_cast<unsigned char*>(ctx.workspace);
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  Args a{};
  a.tb.local = reinterpret_cast<int32_t*>(base + l.local);
  a.tb.counts = reinterpret_cast<int32_t*>(base + l.counts);
  a.tb.offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  a.tb.active = reinterpret_cast<int32_t*>(base + l.active);
  a.tb.n_active = reinterpret_cast<int32_t*>(base + l.n_active);
  a.tb.slot_expert = reinterpret_cast<int32_t*>(base + l.slot_expert);
  a.tb.slot_list = reinterpret_cast<int32_t*>(base + l.slot_list);
  a.a = base + l.a;
  a.y = reinterpret_cast<float*>(base + l.y);
  a.x = p.x.data;
  a.w1 = p.w1.data;
  a.w2 = p.w2.data;
  a.ids = p.topk_ids.ptr<const int32_t>();
  a.wts = p.topk_weights.ptr<const float>();
  a.mask = p.expert_mask.present() ? p.expert_mask.ptr<const int32_t>() : nullptr;
  a.map = p.expert_map.present() ? p.expert_map.ptr<const int32_t>() : nullptr;
  a.out = p.out.data;
  a.x_stride = p.x.stride[0];
  a.out_stride = p.out.stride[0];
  a.T = int(d.T), a.H = int(d.H), a.I = int(d.I), a.E = int(d.E), a.Eg = int(d.Eg), a.k = int(d.k);
  a.act = int(p.activation);
  a.g1u1 = d.g1u1;
  a.weight_on_input = p.weight_on_input;
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  if (fp8) {
    const bool block = quant == Quant::fp8_block;
    bool rows = false;
    if (!block) MOEKIT_RETURN_IF_ERROR(check_fp8_weight_scale(p.w1_scale, "w1_scale", d.E, d.N1, &rows));
    a.w1s = p.w1_scale.ptr<const float>();
    a.w2s = p.w2_scale.ptr<const float>();
    a.a1s = p.a1_scale.present() ? p.a1_scale.ptr<const float>() : nullptr;
    a.ws_rows = rows;
    const int mc1 = pick_mc(d.T, d.k, d.E, fp8_row_bytes(d.H, block));
    const int mc2 = pick_mc(d.T, d.k, d.E, fp8_row_bytes(d.I, block));
    if (block) {
      return p.x.dtype == DType::bf16 ? run_fp8_typed<__nv_bfloat16, true>(a, mc1, mc2, st)
                                      : run_fp8_typed<__half, true>(a, mc1, mc2, st);
    }
    return p.x.dtype == DType::bf16 ? run_fp8_typed<__nv_bfloat16, false>(a, mc1, mc2, st)
                                    : run_fp8_typed<__half, false>(a, mc1, mc2, st);
  }
  const int mc1 = pick_mc(d.T, d.k, d.E, size_t(d.H) * elem_bytes(p.x.dtype));
  const int mc2 = pick_mc(d.T, d.k, d.E, size_t(d.I) * ae);
  if (p.x.dtype == DType::bf16) {
    return p.round_intermediate ? run_typed<__nv_bfloat16, __nv_bfloat16>(a, mc1, mc2, st)
                                : run_typed<__nv_bfloat16, float>(a, mc1, mc2, st);
  }
  return p.round_intermediate ? run_typed<__half, __half>(a, mc1, mc2, st) : run_typed<__half, float>(a, mc1, mc2, st);
}

Status run_impl(const FusedMoeParams& p, const RunContext& ctx) { return run_any(p, ctx, Quant::none); }
Status run_fp8_impl(const FusedMoeParams& p, const RunContext& ctx) { return run_any(p, ctx, Quant::fp8_row); }
Status run_fp8_block_impl(const FusedMoeParams& p, const RunContext& ctx) {
  return run_any(p, ctx, Quant::fp8_block);
}

}  // namespace

Status check_fp8_weight_scale(const TensorView& s, const char* name, int64_t E, int64_t N, bool* per_row) {
  if (!s.present()) return Unsupported(name, ": required for fp8 weights");
  if (s.device != Device::cuda) return Unsupported(name, ": must be on the CUDA device");
  if (s.dtype != DType::f32 || !s.is_contiguous()) return Unsupported(name, ": must be contiguous f32");
  if (s.ndim == 1 && s.shape[0] == E) {
    *per_row = false;
    return Status::Ok();
  }
  if ((s.ndim == 2 || (s.ndim == 3 && s.shape[2] == 1)) && s.shape[0] == E && s.shape[1] == N) {
    *per_row = true;
    return Status::Ok();
  }
  return Unsupported(name, ": per-tensor [", E, "] or per-row [", E, ", ", N, "] scales only, got ", s.describe());
}

Status check_fp8_block_scale(const TensorView& s, const char* name, int64_t E, int64_t N, int64_t K) {
  if (!s.present()) return Unsupported(name, ": required for fp8 weights");
  if (s.device != Device::cuda) return Unsupported(name, ": must be on the CUDA device");
  if (s.dtype != DType::f32 || !s.is_contiguous()) return Unsupported(name, ": must be contiguous f32");
  if (s.ndim != 3 || s.shape[0] != E || s.shape[1] != N / kFp8Group || s.shape[2] != K / kFp8Group) {
    return Unsupported(name, ": block scales [", E, ", ", N / kFp8Group, ", ", K / kFp8Group, "] only, got ",
                       s.describe());
  }
  return Status::Ok();
}

Status check_fp8_operands(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(require_device({{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2}, {"topk_ids", &p.topk_ids},
                                         {"topk_weights", &p.topk_weights}, {"out", &p.out},
                                         {"expert_mask", &p.expert_mask}, {"expert_map", &p.expert_map},
                                         {"a1_scale", &p.a1_scale}}));
  if (p.x.dtype != DType::bf16 && p.x.dtype != DType::f16) {
    return Unsupported("x: dtype ", dtype_name(p.x.dtype), " (this kernel does bf16 and f16 only)");
  }
  if (p.w1.dtype != DType::fp8_e4m3fn || p.w2.dtype != DType::fp8_e4m3fn) {
    return Unsupported("w1/w2: fp8_e4m3fn weights only, got ", dtype_name(p.w1.dtype), "/", dtype_name(p.w2.dtype));
  }
  if (p.w1.layout != Layout::row_major || p.w2.layout != Layout::row_major) {
    return Unsupported("w1/w2: layout ", layout_name(p.w1.layout), "/", layout_name(p.w2.layout),
                       " (this kernel reads row_major weights only)");
  }
  return Status::Ok();
}

Status fused_moe_small_m_supports(const FusedMoeParams& p) { return supports_impl(p); }
Status fused_moe_small_m_fp8_supports(const FusedMoeParams& p) { return supports_fp8_impl(p); }
size_t fused_moe_small_m_fp8_workspace_bytes(const FusedMoeParams& p) { return workspace_fp8_impl(p); }
Status fused_moe_small_m_fp8_run(const FusedMoeParams& p, const RunContext& ctx) { return run_fp8_impl(p, ctx); }
Status fused_moe_small_m_fp8_block_supports(const FusedMoeParams& p) { return supports_fp8_block_impl(p); }
Status fused_moe_small_m_fp8_block_run(const FusedMoeParams& p, const RunContext& ctx) {
  return run_fp8_block_impl(p, ctx);
}
size_t fused_moe_small_m_workspace_bytes(const FusedMoeParams& p) { return workspace_impl(p); }
Status fused_moe_small_m_run(const FusedMoeParams& p, const RunContext& ctx) {
  const Status s = supports_impl(p);
  if (!s.ok()) return s;
  return run_impl(p, ctx);
}

}  // namespace moekit::cuda
