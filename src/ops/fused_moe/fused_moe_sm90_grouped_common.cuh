// Shared by the grouped fused_moe kernels (fused_moe_sm90_grouped.cu: bf16 / f16;
// fused_moe_sm90_grouped_fp8.cu: fp8 W8A8): the routing kernel that lays out expert-contiguous rows
// and the M tile list, the activations (f32, the reference's formulas; silu on the hardware exp2),
// and the per-token reduction over k (fixed slot order, optional two K-range partials). Internal
// linkage: each .cu gets its own copy.
// SPEC 3.1-3.5. Tests: tests/test_fused_moe_sm90_grouped.cpp, tests/test_fused_moe_sm90_grouped_fp8.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/block_scan.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "cuda/pdl.cuh"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_sm90_grouped.h"

namespace moekit::cuda::grouped {
namespace {

constexpr int kRouteThreads = 1024;  // one block; also the largest E (one expert per thread in scans)
static_assert(kRouteThreads == 1024, "the routing scans use block_inclusive_sum_1024");
constexpr int kMaxE = kRouteThreads;
constexpr int kMaxK = 32;
constexpr int kReduceThreads = 256;

// ---------------------------------------------------------------- activations (f32)
template <Activation A>
__device__ __forceinline__ float act(float z) {
  if constexpr (A == Activation::silu) {
    // The hardware exp2 and reciprocal (__expf, __fdividef): a few ulp from expf and an IEEE
    // divide, far below the bf16 / fp8 rounding of a that follows (z very negative gives -0 as
    // z / inf does); expf and the division subroutine bloated the gemm1 epilogues
    // (docs/experiments.md E25). exp2 with denormal results flushed to zero is __expf without its
    // denormal fix-up (three instructions a value, E116): 1 + e is 1 wherever e is denormal, so
    // the result is the same bit for bit.
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * -1.4426950408889634f));
    return __fdividef(z, 1.0f + e);
  } else if constexpr (A == Activation::gelu) {
    return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
  } else {
    const float c = 0.79788456080286536f;  // sqrt(2 / pi)
    return 0.5f * z * (1.0f + tanhf(c * (z + 0.044715f * z * z * z)));
  }
}

// N = 4 or 8 consecutive elements of a bf16 / f16 / f32 row (one 8- / 16-byte vector of 16-bit
// values, N / 4 float4 of f32; p aligned to that) as f32: the fp8 activation quantizers' loads.
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
template <int N, class T>
__device__ __forceinline__ void load_f32(const T* p, float (&f)[N]) {
  static_assert(N == 4 || N == 8, "4 or 8 elements");
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = v.x, f[4 * i + 1] = v.y, f[4 * i + 2] = v.z, f[4 * i + 3] = v.w;
    }
  } else {
    using Vec = std::conditional_t<N == 8, uint4, uint2>;
    using Pair = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
    const Vec v = *reinterpret_cast<const Vec*>(p);
    const Pair* h = reinterpret_cast<const Pair*>(&v);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 t = to_float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
}

__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_out(__half* p, float v) { *p = __float2half_rn(v); }

// ---------------------------------------------------------------- 1. routing
struct RouteArgs {
  const int32_t* ids;       // [T*k]
  const int32_t* mask;      // [Eg] or nullptr
  const int32_t* map;       // [Eg] or nullptr
  int32_t* local;           // [Eg] out: local expert of each global id, -1 = remote
  int32_t* offsets;         // [E + 1] out: first row of each expert (rows not padded)
  int32_t* row_entry;       // [Tk] out: entry t*k + j of each row, rows grouped by expert
  int32_t* slot_row;        // [Tk] out: row of entry t*k + j, -1 = not computed here
  int32_t* tile_expert;     // [tiles_max] out: expert of each M tile, -1 = unused tile
  int32_t* tile_row0;       // [tiles_max] out: first row of each M tile
  int32_t* num_tiles;       // [1] out: M tiles in use (a prefix of the list)
  int tk, E, Eg, tiles_max;
  int bm;                   // M tile rows (64, 128 or 192)
  int32_t* zero;            // [n_zero] out: zeros (gemm1's row amaxes of a, Fp8GemmArgs::amax), or nullptr
  int n_zero;
};

// The local expert of global id `id` (-1: an unused slot, a bad id or a remote expert; never
// indexed), from the block's shared copy of the table (s_local) where Eg fits it.
constexpr int kRouteSmemTable = kMaxE;  // global experts whose table the routing keeps in shared memory
__device__ __forceinline__ int lookup_local(const RouteArgs& a, const int* s_local, int id) {
  if (id < 0 || id >= a.Eg) return -1;
  const int e = a.Eg <= kRouteSmemTable ? s_local[id] : a.local[id];
  return (e >= 0 && e < a.E) ? e : -1;
}

// The local experts of entries b + u * kRouteThreads + threadIdx.x (u < kRouteUnroll; -1 past tk),
// all ids loaded before any is looked up: one memory round trip per batch, not one per entry.
// Returns the batch's slots that hold entries for some thread (the same for the whole block): the
// callers skip the others, so a batch of a few entries costs one slot, not kRouteUnroll.
// NOTE: one entry at a time, the two passes over T * k = 32768 ids were a chain of dependent
// loads: 53 us of Qwen3-30B T=4096 under ncu (docs/experiments.md E123). Computing every slot at
// any T gave the routing of one token (8 entries) 2.7x the instructions (E125).
constexpr int kRouteUnroll = 8;
__device__ __forceinline__ int route_batch(const RouteArgs& a, const int* s_local, int b, int (&e)[kRouteUnroll]) {
  const int used = min(kRouteUnroll, (a.tk - b + kRouteThreads - 1) / kRouteThreads);
  int id[kRouteUnroll];
#pragma unroll
  for (int u = 0; u < kRouteUnroll; ++u) {
    const int i = b + u * kRouteThreads + int(threadIdx.x);
    id[u] = u < used && i < a.tk ? __ldg(a.ids + i) : -1;
  }
#pragma unroll
  for (int u = 0; u < kRouteUnroll; ++u) e[u] = u < used ? lookup_local(a, s_local, id[u]) : -1;
  return used;
}

// Up to this many entries the rows' entries are gathered in shared memory (dynamic, 4 bytes an
// entry) and written out in order: one SM issues one request per scattered 4-byte store, and those
// stores bounded the routing of T k = 32768 entries (E123).
constexpr int kRouteStagedEntries = 48 * 1024;
// At most kRouteThreads entries (one a thread) nothing is staged: route_kernel keeps each thread's
// entry in registers between the passes and stores its row directly (E125).
inline int route_smem_bytes(int64_t tk) {
  return tk > kRouteThreads && tk <= kRouteStagedEntries ? int(tk) * 4 : 0;
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(RouteArgs a) {
  wait_for_predecessor();
  extern __shared__ int s_row_entry[];  // [tk] where route_smem_bytes(tk) > 0
  const bool one = a.tk <= kRouteThreads;  // one entry a thread, held in registers
  const bool staged = !one && a.tk <= kRouteStagedEntries;
  // Entry tid's id where one, loaded first: its round trip overlaps the table's.
  const int id1 = one && int(threadIdx.x) < a.tk ? __ldg(a.ids + threadIdx.x) : -1;
  __shared__ int s_cnt[kMaxE];
  __shared__ int s_off[kMaxE + 1];
  __shared__ int s_toff[kMaxE + 1];
  __shared__ int s_local[kRouteSmemTable];
  const int tid = threadIdx.x;
  for (int i = tid; i < a.n_zero; i += kRouteThreads) a.zero[i] = 0;

  // Global -> local table. Mask: local id = number of set entries before g (a set entry beyond E is
  // treated as remote); map: entries outside [-1, E) are remote; neither: identity.
  if (a.mask != nullptr) {
    const int chunk = (a.Eg + kRouteThreads - 1) / kRouteThreads;
    const int beg = min(a.Eg, tid * chunk), end = min(a.Eg, beg + chunk);
    int ones = 0;
    for (int g = beg; g < end; ++g) ones += a.mask[g] != 0;
    int next = block_exclusive_sum_1024(ones);
    for (int g = beg; g < end; ++g) {
      int l = -1;
      if (a.mask[g] != 0) {
        l = next < a.E ? next : -1;
        ++next;
      }
      a.local[g] = l;
      if (g < kRouteSmemTable) s_local[g] = l;
    }
  } else {
    for (int g = tid; g < a.Eg; g += kRouteThreads) {
      const int v = a.map != nullptr ? a.map[g] : g;
      const int l = (v >= 0 && v < a.E) ? v : -1;
      a.local[g] = l;
      if (g < kRouteSmemTable) s_local[g] = l;
    }
  }
  for (int e = tid; e < kMaxE; e += kRouteThreads) s_cnt[e] = 0;
  __syncthreads();  // also publishes a.local (global writes) to the block

  // Entry tid where one: its local expert and its place among the expert's rows.
  int e1 = -1, slot1 = -1;
  if (one) {
    e1 = lookup_local(a, s_local, id1);
    if (e1 >= 0) slot1 = atomicAdd(&s_cnt[e1], 1);
  }
  for (int b = 0; !one && b < a.tk; b += kRouteThreads * kRouteUnroll) {
    int e[kRouteUnroll];
    const int used = route_batch(a, s_local, b, e);
#pragma unroll
    for (int u = 0; u < kRouteUnroll; ++u) {
      if (u >= used) break;  // block-uniform
      // The entry's place among its expert's rows, kept in slot_row until the offsets are known.
      const int i = b + u * kRouteThreads + tid;
      if (e[u] >= 0) a.slot_row[i] = atomicAdd(&s_cnt[e[u]], 1);
    }
  }
  __syncthreads();

  const int cnt = tid < a.E ? s_cnt[tid] : 0;
  const int tiles = (cnt + a.bm - 1) / a.bm;
  const int off = block_exclusive_sum_1024(cnt);
  const int toff = block_exclusive_sum_1024(tiles);
  if (tid < a.E) {
    s_off[tid] = off;
    s_toff[tid] = toff;
    if (tid == a.E - 1) {
      s_off[a.E] = off + cnt;
      s_toff[a.E] = toff + tiles;
    }
  }
  __syncthreads();
  for (int e = tid; e <= a.E; e += kRouteThreads) a.offsets[e] = s_off[e];

  // Rows: the order inside an expert follows the atomics (it changes no value, see the top).
  if (one) {
    const int row = e1 >= 0 ? s_off[e1] + slot1 : -1;
    if (row >= 0) a.row_entry[row] = tid;
    if (tid < a.tk) a.slot_row[tid] = row;
  }
  for (int b = 0; !one && b < a.tk; b += kRouteThreads * kRouteUnroll) {
    int e[kRouteUnroll];
    const int used = route_batch(a, s_local, b, e);
    int row[kRouteUnroll];
#pragma unroll
    for (int u = 0; u < kRouteUnroll; ++u) {  // this thread's own writes of the first pass
      const int i = b + u * kRouteThreads + tid;
      row[u] = e[u] >= 0 ? s_off[e[u]] + a.slot_row[i] : -1;
    }
#pragma unroll
    for (int u = 0; u < kRouteUnroll; ++u) {
      if (u >= used) break;  // block-uniform
      const int i = b + u * kRouteThreads + tid;
      if (row[u] >= 0) {
        if (staged) {
          s_row_entry[row[u]] = i;
        } else {
          a.row_entry[row[u]] = i;
        }
      }
      if (i < a.tk) a.slot_row[i] = row[u];
    }
  }
  if (staged) {
    __syncthreads();
    for (int r = tid; r < s_off[a.E]; r += kRouteThreads) a.row_entry[r] = s_row_entry[r];
  }
  for (int e = tid; e < a.E; e += kRouteThreads) {
    for (int t = s_toff[e]; t < s_toff[e + 1]; ++t) {
      a.tile_expert[t] = e;
      a.tile_row0[t] = s_off[e] + (t - s_toff[e]) * a.bm;
    }
  }
  for (int t = s_toff[a.E] + tid; t < a.tiles_max; t += kRouteThreads) a.tile_expert[t] = -1;
  if (tid == 0) *a.num_tiles = s_toff[a.E];
}

// ---------------------------------------------------------------- 4. reduction over k
struct ReduceArgs {
  const float* y;           // [splits, Tk, H]: K-range partials at y + ks * y_split
  int64_t y_split;
  const int32_t* slot_row;  // [Tk]
  const float* weights;     // [Tk]
  void* out;                // [T, H] row stride os
  int64_t os;
  int H, k;
  int splits;               // K ranges (1 .. kTma64Gemm2MaxSplits)
  bool weight_on_input;
};

// Block (t, g) per token t and 1024-column chunk g: out[t, c] = round(sum_j w_tj * y[row(t, j), c]),
// j ascending; a token with no computed slot gets a zero row.
// NOTE: one block per token was latency-bound on a whole row set (k x H f32 partials); the chunks
// give T x H / 1024 blocks (E24).
// NOTE: loading 8 partials a thread before adding any measured no faster: at one token this
// kernel's time is its launch and wait, not its loads (E28).
constexpr int kReduceChunk = kReduceThreads * 4;  // columns per block
template <class TT>
__global__ void __launch_bounds__(kReduceThreads) reduce_kernel(ReduceArgs p) {
  wait_for_predecessor();
  __shared__ int s_row[kMaxK];
  __shared__ float s_w[kMaxK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < p.k) {
    s_row[threadIdx.x] = p.slot_row[t * p.k + threadIdx.x];
    s_w[threadIdx.x] = p.weight_on_input ? 1.0f : p.weights[t * p.k + threadIdx.x];
  }
  __syncthreads();
  TT* out = static_cast<TT*>(p.out) + t * p.os;
  for (int c = blockIdx.y * kReduceChunk + threadIdx.x * 4; c < p.H; c += gridDim.y * kReduceChunk) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < p.k; ++j) {
      const int r = s_row[j];
      if (r < 0) continue;
      const float w = s_w[j];
      float4 v = *reinterpret_cast<const float4*>(p.y + int64_t(r) * p.H + c);
      for (int sp = 1; sp < p.splits; ++sp) {  // range 0 + range 1 + ..., in that order
        const float4 v1 = *reinterpret_cast<const float4*>(p.y + sp * p.y_split + int64_t(r) * p.H + c);
        v.x += v1.x;
        v.y += v1.y;
        v.z += v1.z;
        v.w += v1.w;
      }
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    store_out(out + c, acc.x);
    store_out(out + c + 1, acc.y);
    store_out(out + c + 2, acc.z);
    store_out(out + c + 3, acc.w);
  }
}

// Launches reduce_kernel over T tokens x ceil(H / kReduceChunk) column chunks.
template <class TT>
inline Status launch_reduce(const ReduceArgs& rd, int64_t T, cudaStream_t s, const char* what) {
  return launch_pdl(reduce_kernel<TT>, dim3(unsigned(T), unsigned((rd.H + kReduceChunk - 1) / kReduceChunk)),
                    dim3(kReduceThreads), 0, s, what, rd);
}

// Workspace of the fp8 grouped kernels (byte offsets from a 256-byte aligned base): the routing lists,
// x codes [Tk, H] + x_scales per row, a in f32 [Tk, I], a codes [Tk, I] + a_scales per row (then the
// work counters, kFp8WsCounters, at `counters`), and `splits` f32 partials y [Tk, H].
// fused_moe_sm90_grouped_fp8 (1 scale per row, split K) and fused_moe_sm90_grouped_fp8_block (one
// per 128-group; split K on its 64 x 256 tiles).
struct Fp8Workspace {
  size_t local, offsets, row_entry, slot_row, tile_expert, tile_row0, num_tiles, xq, sx, a, aq, sa, counters, y,
      total;
  int64_t tk, tiles_max;
  int splits;
};
constexpr size_t kFp8WsAlign = 256;
// int32 words after the scales of a (Fp8Workspace::counters): the work counters of the 128- and
// 192-row per-row gemms (one per gemm, ws_run's dynamic schedule), zeroed by the routing kernel.
constexpr int kFp8WsCounters = 2;

// a_f32 = false: no f32 a (a gemm1 that quantizes a itself; the region is empty, l.a == l.aq).
inline Fp8Workspace fp8_workspace(const FusedMoeParams& p, int64_t x_scales, int64_t a_scales, int splits,
                                  int bm = 128, bool a_f32 = true) {
  const MoeDims d = moe_dims(p);
  Fp8Workspace l{};
  l.tk = d.T * d.k;
  l.tiles_max = fused_moe_sm90_grouped_tiles_max(l.tk, d.E, bm);
  l.splits = splits;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + kFp8WsAlign - 1) / kFp8WsAlign * kFp8WsAlign;
    return at;
  };
  const size_t tk = size_t(l.tk);
  l.local = take(size_t(d.Eg) * 4);
  l.offsets = take(size_t(d.E + 1) * 4);
  l.row_entry = take(tk * 4);
  l.slot_row = take(tk * 4);
  l.tile_expert = take(size_t(l.tiles_max) * 4);
  l.tile_row0 = take(size_t(l.tiles_max) * 4);
  l.num_tiles = take(4);
  l.xq = take(tk * size_t(d.H));
  l.sx = take(tk * size_t(x_scales) * 4);
  l.a = take(a_f32 ? tk * size_t(d.I) * 4 : 0);
  l.aq = take(tk * size_t(d.I));
  l.sa = take(tk * size_t(a_scales) * 4 + kFp8WsCounters * 4);
  l.counters = l.sa + tk * size_t(a_scales) * 4;
  l.y = take(size_t(splits) * tk * size_t(d.H) * 4);
  l.total = off + kFp8WsAlign;  // the caller's workspace need not be aligned
  return l;
}

// The routing lists of the workspace (RouteArgs' outputs).
struct RouteLists {
  int32_t *local, *offsets, *row_entry, *slot_row, *tile_expert, *tile_row0, *num_tiles;
  int32_t* zero = nullptr;  // [n_zero] set to 0 (RouteArgs::zero)
  int n_zero = 0;
};

// Launches route_kernel for p with bm-row M tiles (at most tiles_max) into `r`.
inline Status launch_route(const FusedMoeParams& p, const RouteLists& r, int64_t tk, int64_t tiles_max, int bm,
                           cudaStream_t s, const char* what) {
  const MoeDims d = moe_dims(p);
  RouteArgs ra{p.topk_ids.ptr<const int32_t>(),
               p.expert_mask.present() ? p.expert_mask.ptr<const int32_t>() : nullptr,
               p.expert_map.present() ? p.expert_map.ptr<const int32_t>() : nullptr,
               r.local, r.offsets, r.row_entry, r.slot_row, r.tile_expert, r.tile_row0, r.num_tiles,
               int(tk), int(d.E), int(d.Eg), int(tiles_max), bm, r.zero, r.n_zero};
  // Beside 18 KiB of static shared memory, above 48 KiB in all a launch needs the opt-in; always the
  // largest, so that concurrent launches never lower it under one another.
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         route_smem_bytes(kRouteStagedEntries)),
                                    what));
  const int smem = route_smem_bytes(tk);
  return launch_pdl(route_kernel, dim3(1), dim3(kRouteThreads), size_t(smem), s, what, ra);
}

// SMs of the current device (the persistent kernels launch at most one CTA per SM): the cached
// DeviceFacts the rules read too, so the grids and the rules see one count.
inline Status device_sm_count(int* sms, const char* what) {
  DeviceFacts f;
  const Status s = current_device_facts(&f);
  if (!s.ok()) return Status(s.code(), std::string(what) + ": " + s.message());
  *sms = f.sm_count;
  return Status::Ok();
}

// The run entry of an fp8 grouped kernel: nothing for T = 0, the workspace checked against `need`
// bytes, then typed(__nv_bfloat16{}) or typed(__half{}) by x's dtype (typed: a generic lambda that
// calls the kernel's typed host runner).
template <class Typed>
Status run_fp8_entry(const FusedMoeParams& p, const RunContext& ctx, size_t need, const char* name, Typed typed) {
  if (moe_dims(p).T == 0) return Status::Ok();
  if (ctx.workspace == nullptr || ctx.workspace_bytes < need) {
    return InvalidArgument("workspace: ", name, " needs ", need, " device bytes, got ", ctx.workspace_bytes);
  }
  if (p.x.dtype == DType::bf16) return typed(__nv_bfloat16{});
  return typed(__half{});
}

}  // namespace
}  // namespace moekit::cuda::grouped
