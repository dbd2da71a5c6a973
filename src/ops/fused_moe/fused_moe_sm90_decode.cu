// fused_moe_sm90_decode: the fp8 128 x 128 block-scaled fused_moe (SPEC 3.3) of T <= 8 tokens in one
// cooperative launch of one CTA per SM (docs/design/fused_moe_decode.md, 6.1), in place of the
// chain route / quant x / gemm1 / gemm2 / reduce. Phases, separated by grid barriers:
//   P0   every CTA builds the routing tables in shared memory (the same in all); CTA t < T quantizes
//        token t's x per 1 x 128 group (the reference's s = max(amax, 1e-12) / 448, IEEE quotient);
//        the producer already loads its first weight boxes (they depend on nothing).
//   P1   gate/up: units of (touched expert, 64 gate rows + the matching 64 up rows; g1u0: 128 rows)
//        x H / 128 K slices, the flattened slices split evenly over the CTAs (a unit may be cut
//        between CTAs). Per slice two 64-row boxes (TMA, 128-byte swizzle) times B = the T tokens'
//        codes (an 8-row box, rows >= T read as zeros): 2 x 4 wgmma m64n8k32 e4m3 (weights as A,
//        tokens as the 8 columns), promoted into f32 times the slice's weight and x scales. Each
//        CTA writes its partial sums of each unit it touches (slot unit + CTA: unique, as the CTAs'
//        ranges ascend).
//   P1.5 per (touched expert, 128-group of a): the unit's partials summed in CTA order, a =
//        act(w g) * (w u) for each slot routed to the expert (w: the router weight with
//        weight_on_input, else 1), quantized per (slot, group) to codes and scale in expert order.
//   P2   down: units of (touched expert, 128 rows of H, pass of <= 8 of its slots) x I / 128 slices,
//        the same engine with B = the pass's rows of a codes; promoted times w2's and a's scales.
//   P3   out[t, h] = round(sum over j in order of w_tj * y) with y the slot's partials summed in CTA
//        order (w = 1 with weight_on_input); tokens without a local expert get zeros.
// The consumers stage each window of 256 slices' scales in shared memory before using them: loaded
// per slice from global memory they waited on an L2 busy with the weight stream (E112).
// Performance: correct everywhere it runs, but 8-50% slower than the rules' configs on the H200
// (E112), so the rules never pick it; its fixed part (barriers, P1.5, P3) is what to cut next.
// Deterministic: no float atomics; every sum has a fixed order for a given SM count. The partials
// and a pass through the workspace (L2); the phases' writes reach the next phase's TMA reads through
// a proxy fence and the grid barrier. out may be x: x is read in P0 only, out written in P3 only.
// Requirements (fused_moe_sm90_decode_supports): fp8_block operands, T <= 8, T k <= 256, E and Eg
// <= 1024, cooperative launch with one CTA of kSmemBytes on every SM.
// Tests: tests/test_fused_moe_sm90_decode.cpp.
#include "ops/fused_moe/fused_moe_sm90_decode.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_utils.h"
#include "cuda/device_facts.h"
#include "cuda/fp8_encode.cuh"
#include "cuda/fp8_quotient.h"
#include "cuda/sm90/mbarrier.cuh"
#include "cuda/sm90/ring.cuh"
#include "cuda/sm90/smem.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/tensor_map.h"
#include "moekit/ops/quant.h"
#include "ops/fused_moe/fused_moe_sm90_grouped_common.cuh"
#include "ops/fused_moe/fused_moe_sm90_grouped_fp8_block.h"
#include "ops/fused_moe/fused_moe_sm90_small_m.h"

namespace moekit::cuda {

namespace {

using namespace sm90;
namespace cg = cooperative_groups;
using grouped::act;
using grouped::load_f32;
using grouped::store_out;

constexpr int kThreads = 256;            // warpgroup 0: consumer; warp 4 lane 0: producer
constexpr int kConsumerWarps = 4;
constexpr int kBlk = 128;                // codes per K slice = the block of the scales
constexpr int kStages = 10;              // E109: >= 8 stages of 64-row boxes stream at 4.0 TB/s
constexpr int kWin = 256;                // slices whose scales the consumers stage at a time
constexpr uint32_t kBoxBytes = 64 * kBlk;                 // one 64-row box of a slice
constexpr uint32_t kBBytes = 8 * kBlk;                    // the 8 columns' codes of a slice
constexpr uint32_t kStageBytes = 2 * kBoxBytes + 1024;    // two boxes + B (one 1 KiB swizzle atom)
using Smem = WsSmemT<kStages, kStageBytes, 2 * kBoxBytes>;
constexpr int kMaxT = int(kDecodeMaxTokens);
constexpr int kMaxSlots = int(kDecodeMaxSlots);
constexpr int kMaxE = 1024;              // local and global experts
constexpr int kPartFloats = 2 * 64 * 8;  // a unit's partial sums: 2 boxes x 64 rows x 8 columns
static_assert(kMaxSlots == kThreads, "P0 gives every slot a thread");

// Routing tables, built by every CTA in P0 (dynamic shared memory behind the ring).
struct Tables {
  int n_touched, n_rows, u1, u2;
  int touched[kMaxSlots];        // local experts with a slot, ascending
  int off[kMaxSlots + 1];        // first expert-ordered row of touched expert j
  int u2_base[kMaxSlots + 1];    // first P2 unit of touched expert j
  int slot_row[kMaxSlots];       // expert-ordered row of slot s, -1 skipped
  int row_slot[kMaxSlots];       // slot of row r
  int row_touched[kMaxSlots];    // touched index of row r's expert
  int se[kMaxSlots];             // local expert of slot s, -1 skipped
  int first[kMaxSlots];          // slot s is its expert's first
  int local[kMaxE];              // global id -> local expert, -1 remote
  float red[8];                  // P1.5: amax per warp
  float win[kWin][10];           // a window of slices' scales: box 0, box 1, then the 8 columns'
};
constexpr int kSmemBytes = ws_smem_bytes<Smem>() + int(sizeof(Tables));
static_assert(kSmemBytes <= kSm90SmemOptinBytes, "one CTA per SM within the opt-in shared memory");

struct Args {
  const void* x;             // [T, H] x_stride
  void* out;                 // [T, H] out_stride
  const int32_t* ids;        // [T, k]
  const float* wts;          // [T, k]
  const int32_t* mask;       // [Eg] or null
  const int32_t* map;        // [Eg] or null
  const float* w1s;          // [E, N1 / 128, H / 128]
  const float* w2s;          // [E, H / 128, I / 128]
  uint8_t* xq;               // [T, H] codes
  float* sx;                 // [T, H / 128]
  float* part1;              // [u1 max + G] partials of P1
  uint8_t* aq;               // [T k, I] codes, expert-ordered rows
  float* sa;                 // [T k, I / 128]
  float* part2;              // [u2 max + G] partials of P2
  int64_t x_stride, out_stride;
  int T, H, I, E, Eg, k, N1;
  bool g1u1, weight_on_input;
};

// The slices [start(c), start(c + 1)) of CTA c among S over G CTAs, and the CTA whose range holds s.
__device__ __forceinline__ int64_t range_start(int c, int64_t S, int G) { return int64_t(c) * S / G; }
__device__ __forceinline__ int owner(int64_t s, int64_t S, int G) { return int(((s + 1) * G - 1) / S); }

// P0 part 1, every CTA: global -> local table, each slot's local expert, the touched experts in
// ascending order, the expert-ordered rows (slots of an expert in slot order) and the P2 units.
__device__ void build_tables(const Args& a, Tables& t) {
  const int tid = threadIdx.x, tk = a.T * a.k;
  // Global -> local: mask (local id = set entries before g; past E: remote), map, or identity.
  if (a.mask != nullptr) {
    constexpr int kPer = kMaxE / kThreads;
    int ones = 0;
    for (int i = 0; i < kPer; ++i) {
      const int g = tid * kPer + i;
      ones += g < a.Eg && a.mask[g] != 0;
    }
    // Exclusive prefix of `ones` over the block (warp scan, then the warps' totals).
    int incl = ones;
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if ((tid & 31) >= o) incl += v;
    }
    if ((tid & 31) == 31) t.off[tid >> 5] = incl;  // off[] is scratch until the scan below
    __syncthreads();
    int base = 0;
    for (int w = 0; w < (tid >> 5); ++w) base += t.off[w];
    int next = base + incl - ones;
    for (int i = 0; i < kPer; ++i) {
      const int g = tid * kPer + i;
      if (g < a.Eg) {
        const bool on = a.mask[g] != 0;
        t.local[g] = on && next < a.E ? next : -1;
        next += on;
      }
    }
  } else {
    for (int g = tid; g < a.Eg; g += kThreads) {
      const int v = a.map != nullptr ? a.map[g] : g;
      t.local[g] = v >= 0 && v < a.E ? v : -1;
    }
  }
  __syncthreads();
  const int s = tid;
  int e = -1;
  if (s < tk) {
    const int id = a.ids[s];
    e = id >= 0 && id < a.Eg ? t.local[id] : -1;  // -1 ids, bad ids and remote experts: skipped
    t.se[s] = e;
  }
  __syncthreads();
  // Per slot: first slot of its expert?, slots of smaller experts, its place among its expert's.
  bool first = e >= 0;
  int below_slots = 0, place = 0, count = 0;
  for (int s2 = 0; s2 < tk; ++s2) {
    const int e2 = t.se[s2];
    if (e2 < 0) continue;
    if (e2 == e) {
      ++count;
      if (s2 < s) first = false, ++place;
    }
    if (e2 < e) ++below_slots;
  }
  if (s < tk) t.first[s] = first;
  __syncthreads();
  int below_experts = 0;  // touched experts below e: first slots of smaller experts
  for (int s2 = 0; s2 < tk; ++s2) below_experts += t.first[s2] && t.se[s2] < e;
  const int n_touched = __syncthreads_count(first);
  const int n_rows = __syncthreads_count(e >= 0);
  if (s < tk) t.slot_row[s] = e >= 0 ? below_slots + place : -1;
  if (e >= 0) {
    t.row_slot[below_slots + place] = s;
    t.row_touched[below_slots + place] = below_experts;
  }
  if (first) {
    t.touched[below_experts] = e;
    t.off[below_experts] = below_slots;
    t.u2_base[below_experts] = (count + 7) / 8;  // passes; made a prefix below
  }
  if (tid == 0) {
    t.n_touched = n_touched;
    t.n_rows = n_rows;
  }
  __syncthreads();
  if (tid == 0) {
    const int hb = a.H / kBlk;
    int base = 0;
    for (int j = 0; j < n_touched; ++j) {
      const int passes = t.u2_base[j];
      t.u2_base[j] = base;
      base += passes * hb;
    }
    t.u2_base[n_touched] = base;
    t.off[n_touched] = n_rows;
    t.u1 = n_touched * (a.g1u1 ? a.I / 64 : a.I / kBlk);
    t.u2 = base;
  }
  __syncthreads();
}

// P0 part 2, CTA t < T: token t's x per 1 x 128 group: scale s = max(amax, floor) / 448, codes of
// v / s (quant_groups_kernel's formula).
template <class XT>
__device__ void quantize_x(const Args& a, int t) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = a.H / kBlk;
  const XT* row = static_cast<const XT*>(a.x) + int64_t(t) * a.x_stride;
  for (int g = warp; g < G; g += kThreads / 32) {
    float f[4];
    load_f32<4>(row + g * kBlk + lane * 4, f);
    const float sc = warp_group_scale(f);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __fdiv_rn(f[i], sc);
    *reinterpret_cast<uint32_t*>(a.xq + int64_t(t) * a.H + g * kBlk + lane * 4) = encode4_e4m3fn(f);
    if (lane == 0) a.sx[int64_t(t) * G + g] = sc;
  }
}

// What a unit of a phase reads: the two boxes' first rows (A map), the B map's first row, the weight
// scale rows of the boxes, and (P2) its expert-ordered rows [r0, r1) behind the columns.
struct Unit {
  int a0, a1, b0;
  const float* ws0;  // weight scales of box 0 / box 1 over the K slices
  const float* ws1;
  int r0, r1;        // P2: the pass's rows (column c = row r0 + c while < r1)
};

__device__ __forceinline__ Unit unit1(const Args& a, const Tables& t, int u) {
  const int upe = a.g1u1 ? a.I / 64 : a.I / kBlk, j = u / upe, it = u % upe, e = t.touched[j];
  const int KT = a.H / kBlk, NB = a.N1 / kBlk;
  const int l0 = a.g1u1 ? it * 64 : it * kBlk, l1 = a.g1u1 ? a.I + it * 64 : it * kBlk + 64;
  const float* w = a.w1s + int64_t(e) * NB * KT;
  return {e * a.N1 + l0, e * a.N1 + l1, 0, w + (l0 / kBlk) * KT, w + (l1 / kBlk) * KT, 0, 0};
}

// P2's units of one CTA ascend, so the touched expert of each is found by walking forward (j).
struct Unit2Of {
  const Args& a;
  const Tables& t;
  int j = 0;
  __device__ __forceinline__ Unit operator()(int u) {
    while (j + 1 < t.n_touched && t.u2_base[j + 1] <= u) ++j;
    const int hb_n = a.H / kBlk, local = u - t.u2_base[j], pass = local / hb_n, hb = local % hb_n, e = t.touched[j];
    const int KT = a.I / kBlk;
    const float* w = a.w2s + (int64_t(e) * hb_n + hb) * KT;
    const int r0 = t.off[j] + 8 * pass;
    return {e * a.H + hb * kBlk, e * a.H + hb * kBlk + 64, r0, w, w, r0, min(r0 + 8, t.off[j + 1])};
  }
};

// A position (unit, K slice) in a phase's flattened slices, stepped without divisions.
struct Cursor {
  int u, kt;
  __device__ __forceinline__ void next(int KT) {
    if (++kt == KT) kt = 0, ++u;
  }
};
__device__ __forceinline__ Cursor cursor_at(int64_t q, int KT) { return {int(q / KT), int(q % KT)}; }

// Producer (warp 4, lane 0) of a phase's slices [q0, q1): both boxes and B per stage. `pre` stages
// had their boxes issued before (P0) and need only B.
template <class UnitOf>
__device__ void produce(const Smem& sm, WsRingT<kStages>& ring, const CUtensorMap* ma, const CUtensorMap* mb,
                        int64_t q0, int64_t q1, int KT, int pre, UnitOf unit_of) {
  Cursor cur = cursor_at(q0, KT);
  int u_cur = -1;
  Unit un{};
  for (int64_t q = q0; q < q1; ++q, cur.next(KT)) {
    if (cur.u != u_cur) un = unit_of(cur.u), u_cur = cur.u;
    const uint32_t full = sm.full(ring.s);
    if (q - q0 >= pre) {
      mbar_wait(sm.empty(ring.s), ring.phase ^ 1u);
      mbar_arrive_expect_tx(full, 2 * kBoxBytes + kBBytes);
      tma_load_2d(sm.a(ring.s), ma, cur.kt * kBlk, un.a0, full);
      tma_load_2d(sm.a(ring.s) + kBoxBytes, ma, cur.kt * kBlk, un.a1, full);
    }
    tma_load_2d(sm.b(ring.s), mb, cur.kt * kBlk, un.b0, full);
    ring.next();
  }
}

// Consumer warpgroup of a phase's slices [q0, q1): per slice 2 x 4 wgmma into p0 / p1, promoted into
// acc0 / acc1 times the slice's scales (box b's weight scale times column c's: win[i][b] * win[i][2 + c]);
// at each unit's last slice in the range, acc goes to the unit's partial slot (unit + CTA) and
// restarts. The scales are staged kWin slices at a time by the warpgroup (fill(cursor, unit, dst[10]),
// dst[0..1] boxes, dst[2..9] columns): global loads per slice left the stream waiting on L2 (E112).
template <class UnitOf, class Fill>
__device__ void consume(const Smem& sm, WsRingT<kStages>& ring, Tables& t, float* part, int64_t q0, int64_t q1,
                        int KT, UnitOf unit_of, Fill fill) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int row = warp * 16 + (lane >> 2), col = 2 * (lane & 3);
  float acc0[4] = {0, 0, 0, 0}, acc1[4] = {0, 0, 0, 0}, p0[4], p1[4];
  Cursor cur = cursor_at(q0, KT);
  for (int64_t q = q0; q < q1; ++q) {
    const int i = int((q - q0) % kWin);
    if (i == 0) {  // the next window's scales (warpgroup barrier 1 around it)
      asm volatile("bar.sync 1, 128;" ::: "memory");
      UnitOf uo = unit_of;
      for (int w = tid; w < kWin && q + w < q1; w += 128) {
        const Cursor c = cursor_at(q + w, KT);
        fill(c, uo(c.u), t.win[w]);
      }
      asm volatile("bar.sync 1, 128;" ::: "memory");
    }
    const float* sc = t.win[i];
    const float s00 = sc[0] * sc[2 + col], s01 = sc[0] * sc[3 + col], s10 = sc[1] * sc[2 + col], s11 = sc[1] * sc[3 + col];
    mbar_wait(sm.full(ring.s), ring.phase);
    const uint64_t da0 = wgmma_desc_sw128(sm.a(ring.s)), da1 = wgmma_desc_sw128(sm.a(ring.s) + kBoxBytes);
    const uint64_t db = wgmma_desc_sw128(sm.b(ring.s));
    fence_regs(p0);
    fence_regs(p1);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n8(p0, da0 + uint64_t(2 * ks), db + uint64_t(2 * ks), ks > 0);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_fp8_n8(p1, da1 + uint64_t(2 * ks), db + uint64_t(2 * ks), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(p0);
    fence_regs(p1);
    if (lane == 0) mbar_arrive(sm.empty(ring.s));
    ring.next();
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // accumulator pairs (row, row + 8) x (col, col + 1)
      acc0[2 * h] = fmaf(p0[2 * h], s00, acc0[2 * h]);
      acc0[2 * h + 1] = fmaf(p0[2 * h + 1], s01, acc0[2 * h + 1]);
      acc1[2 * h] = fmaf(p1[2 * h], s10, acc1[2 * h]);
      acc1[2 * h + 1] = fmaf(p1[2 * h + 1], s11, acc1[2 * h + 1]);
    }
    Cursor nx = cur;
    nx.next(KT);
    if (nx.u != cur.u || q + 1 == q1) {  // the unit's last slice in this range: its partial sums out
      float* p = part + int64_t(cur.u + blockIdx.x) * kPartFloats;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(p + (row + 8 * h) * 8 + col) = make_float2(acc0[2 * h], acc0[2 * h + 1]);
        *reinterpret_cast<float2*>(p + 512 + (row + 8 * h) * 8 + col) = make_float2(acc1[2 * h], acc1[2 * h + 1]);
        acc0[2 * h] = acc0[2 * h + 1] = acc1[2 * h] = acc1[2 * h + 1] = 0.0f;
      }
    }
    cur = nx;
  }
}

// v[n] = sum over the CTAs whose ranges hold slices of unit u (in CTA order) of their partial at
// index i0 + n stride.
template <int N>
__device__ __forceinline__ void unit_sums(const float* part, int u, int KT, int64_t S, int G, int i0, int stride,
                                          float (&v)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) v[n] = 0.0f;
  const int64_t lo = int64_t(u) * KT, hi = lo + KT;
  const int c1 = owner(hi - 1, S, G);
  for (int c = owner(lo, S, G); c <= c1; ++c) {
    if (max(range_start(c, S, G), lo) >= min(range_start(c + 1, S, G), hi)) continue;  // an empty range
    const float* p = part + int64_t(u + c) * kPartFloats + i0;
#pragma unroll
    for (int n = 0; n < N; ++n) v[n] += p[n * stride];
  }
}

// P1.5, one task: touched expert j, 128-group gi of a. Thread (row r of the group, half): its
// tokens t = half, half + 2, ...; per slot of the expert (in row order) the half holding the slot's
// token computes a, the group's amax over its 128 threads, then codes and scale.
template <Activation A>
__device__ void finish_a(const Args& a, Tables& t, int j, int gi, int64_t S1, int G) {
  const int tid = threadIdx.x, r = tid & 127, half = tid >> 7, KT1 = a.H / kBlk, upe = a.g1u1 ? a.I / 64 : a.I / kBlk;
  const int u = j * upe + (a.g1u1 ? gi * 2 + r / 64 : gi), set = a.g1u1 ? 0 : r / 64, rr = r % 64;
  float g[kMaxT / 2], up[kMaxT / 2] = {};  // tokens half, half + 2, ... (columns >= T hold zeros)
  unit_sums(a.part1, u, KT1, S1, G, set * 512 + rr * 8 + half, 2, g);
  if (a.g1u1) unit_sums(a.part1, u, KT1, S1, G, 512 + rr * 8 + half, 2, up);
  const int G2 = a.I / kBlk;
  for (int row = t.off[j]; row < t.off[j + 1]; ++row) {
    const int s = t.row_slot[row], tok = s / a.k;
    const bool mine = (tok & 1) == half;
    float v = 0.0f;
    if (mine) {
      const float w = a.weight_on_input ? a.wts[s] : 1.0f;
      float gi_ = 0.0f, ui_ = 0.0f;  // this token's sums (a select: no local-memory array)
#pragma unroll
      for (int i = 0; i < kMaxT / 2; ++i) {
        if (i == (tok >> 1)) gi_ = g[i], ui_ = up[i];
      }
      v = a.g1u1 ? act<A>(gi_ * w) * (ui_ * w) : act<A>(gi_ * w);
    }
    float m = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((tid & 31) == 0) t.red[tid >> 5] = m;
    __syncthreads();
    if (mine) {
      const int w0 = half * 4;
      const float amax = fmaxf(fmaxf(t.red[w0], t.red[w0 + 1]), fmaxf(t.red[w0 + 2], t.red[w0 + 3]));
      const float sc = e4m3fn_scale_of(amax);
      a.aq[int64_t(row) * a.I + gi * kBlk + r] = uint8_t(encode2_e4m3fn(__fdiv_rn(v, sc), 0.0f) & 0xffu);
      if (r == 0) a.sa[int64_t(row) * G2 + gi] = sc;
    }
    __syncthreads();
  }
}

template <class XT, Activation A>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const __grid_constant__ CUtensorMap mw1, const __grid_constant__ CUtensorMap mxq,
                  const __grid_constant__ CUtensorMap mw2, const __grid_constant__ CUtensorMap maq, const Args a) {
  extern __shared__ unsigned char smem_raw[];
  const Smem sm{smem_addr(align_smem_1024(smem_raw))};
  Tables& t = *reinterpret_cast<Tables*>(ws_extra_smem_of<Smem>(smem_raw));
  cg::grid_group grid = cg::this_grid();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, G = int(gridDim.x), c = int(blockIdx.x);
  const bool producer = warp == kConsumerWarps && lane == 0, consumer = warp < kConsumerWarps;
  WsRingT<kStages> ring;  // producer and consumers walk the same sequence of stages

  // ---- P0
  if (tid == 0) {
    ws_init_barriers<kConsumerWarps>(sm);
    tma_prefetch_desc(&mw1);
    tma_prefetch_desc(&mxq);
    tma_prefetch_desc(&mw2);
    tma_prefetch_desc(&maq);
  }
  build_tables(a, t);  // its barriers also publish the mbarrier initialisation
  const int KT1 = a.H / kBlk, KT2 = a.I / kBlk;
  const int64_t S1 = int64_t(t.u1) * KT1, S2 = int64_t(t.u2) * KT2;
  const int64_t q1a = range_start(c, S1, G), q1b = range_start(c + 1, S1, G);
  const int pre = int(q1b - q1a < kStages ? q1b - q1a : int64_t(kStages));
  auto u1_of = [&](int u) { return unit1(a, t, u); };
  if (producer) {  // the first stages' weight boxes, before the barrier
    WsRingT<kStages> r = ring;
    for (int i = 0; i < pre; ++i) {
      const int64_t q = q1a + i;
      const Unit un = u1_of(int(q / KT1));
      const int kt = int(q % KT1);
      mbar_arrive_expect_tx(sm.full(r.s), 2 * kBoxBytes + kBBytes);
      tma_load_2d(sm.a(r.s), &mw1, kt * kBlk, un.a0, sm.full(r.s));
      tma_load_2d(sm.a(r.s) + kBoxBytes, &mw1, kt * kBlk, un.a1, sm.full(r.s));
      r.next();
    }
  }
  if (c < a.T) quantize_x<XT>(a, c);
  fence_proxy_async_global();
  grid.sync();

  // ---- P1
  if (producer) {
    fence_proxy_async_global();
    produce(sm, ring, &mw1, &mxq, q1a, q1b, KT1, pre, u1_of);
  } else if (consumer) {
    consume(sm, ring, t, a.part1, q1a, q1b, KT1, u1_of, [&](const Cursor& cu, const Unit& un, float* d) {
      d[0] = un.ws0[cu.kt];
      d[1] = un.ws1[cu.kt];
      for (int c2 = 0; c2 < 8; ++c2) d[2 + c2] = c2 < a.T ? a.sx[int64_t(c2) * KT1 + cu.kt] : 0.0f;
    });
  }
  grid.sync();

  // ---- P1.5
  const int groups = a.I / kBlk;
  for (int task = c; task < t.n_touched * groups; task += G) finish_a<A>(a, t, task / groups, task % groups, S1, G);
  fence_proxy_async_global();
  grid.sync();

  // ---- P2
  const int64_t q2a = range_start(c, S2, G), q2b = range_start(c + 1, S2, G);
  if (producer) {
    fence_proxy_async_global();
    produce(sm, ring, &mw2, &maq, q2a, q2b, KT2, 0, Unit2Of{a, t});
  } else if (consumer) {
    consume(sm, ring, t, a.part2, q2a, q2b, KT2, Unit2Of{a, t}, [&](const Cursor& cu, const Unit& un, float* d) {
      d[0] = d[1] = un.ws0[cu.kt];
      for (int c2 = 0; c2 < 8; ++c2) d[2 + c2] = un.r0 + c2 < un.r1 ? a.sa[int64_t(un.r0 + c2) * KT2 + cu.kt] : 0.0f;
    });
  }
  grid.sync();

  // ---- P3: one thread per (token, 8 consecutive h)
  const int chunks = a.T * (a.H / 8), hb_n = a.H / kBlk;
  for (int ch = c * kThreads + tid; ch < chunks; ch += G * kThreads) {
    const int tok = ch / (a.H / 8), h0 = (ch % (a.H / 8)) * 8;
    float y[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int jj = 0; jj < a.k; ++jj) {
      const int s = tok * a.k + jj, row = t.slot_row[s];
      if (row < 0) continue;
      const int j = t.row_touched[row], pass = (row - t.off[j]) / 8, colr = (row - t.off[j]) % 8;
      const int u = t.u2_base[j] + pass * hb_n + h0 / kBlk, base = ((h0 % kBlk) / 64) * 512 + (h0 % 64) * 8 + colr;
      const float w = a.weight_on_input ? 1.0f : a.wts[s];
      float ys[8];
      unit_sums(a.part2, u, KT2, S2, G, base, 8, ys);
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = fmaf(w, ys[i], y[i]);
    }
    XT* o = static_cast<XT*>(a.out) + int64_t(tok) * a.out_stride + h0;
#pragma unroll
    for (int i = 0; i < 8; ++i) store_out(o + i, y[i]);
  }
}

// Workspace layout (256-byte aligned parts), from the shape and the SM count only.
struct Layout {
  size_t xq, sx, part1, aq, sa, part2, total;
};
Layout layout_of(const MoeDims& d, int G) {
  const int64_t tk = d.T * d.k, touched = std::min(d.E, tk);
  const int64_t u1 = touched * (d.g1u1 ? d.I / 64 : d.I / kBlk), u2 = (touched + (tk + 7) / 8) * (d.H / kBlk);
  Layout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + 255) / 256 * 256;
    return at;
  };
  l.xq = take(size_t(d.T * d.H));
  l.sx = take(size_t(d.T * (d.H / kBlk)) * 4);
  l.part1 = take(size_t(u1 + G) * kPartFloats * 4);
  l.aq = take(size_t(tk * d.I));
  l.sa = take(size_t(tk * (d.I / kBlk)) * 4);
  l.part2 = take(size_t(u2 + G) * kPartFloats * 4);
  l.total = off + 256;  // the caller's workspace need not be aligned: run() aligns its start
  return l;
}

template <class XT, Activation A>
Status launch(const Args& a, const CUtensorMap (&maps)[4], int G, cudaStream_t st) {
  auto* k = decode_kernel<XT, A>;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                                    "fused_moe_sm90_decode: shared memory"));
  int per_sm = 0;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, kSmemBytes),
                                    "fused_moe_sm90_decode: occupancy"));
  if (per_sm < 1) return Unsupported("fused_moe_sm90_decode: no SM holds a CTA of ", kSmemBytes, " shared bytes");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(G));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(kSmemBytes);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return check_cuda(cudaLaunchKernelEx(&cfg, k, maps[0], maps[1], maps[2], maps[3], a), "fused_moe_sm90_decode");
}

template <class XT>
Status launch_act(const Args& a, const CUtensorMap (&maps)[4], int G, Activation act_kind, cudaStream_t st) {
  switch (act_kind) {
    case Activation::gelu: return launch<XT, Activation::gelu>(a, maps, G, st);
    case Activation::gelu_tanh: return launch<XT, Activation::gelu_tanh>(a, maps, G, st);
    default: return launch<XT, Activation::silu>(a, maps, G, st);
  }
}

}  // namespace

Status fused_moe_sm90_decode_supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(fused_moe_sm90_grouped_fp8_block_supports(p));
  const MoeDims d = moe_dims(p);
  if (d.T > kDecodeMaxTokens) return Unsupported("small_m/persistent: T must be <= ", kDecodeMaxTokens, ", got ", d.T);
  if (d.T * d.k > kMaxSlots) return Unsupported("small_m/persistent: T k must be <= ", kMaxSlots, ", got ", d.T * d.k);
  if (d.E > kMaxE || d.Eg > kMaxE) {
    return Unsupported("small_m/persistent: at most ", kMaxE, " local and global experts, got E = ", d.E, ", Eg = ", d.Eg);
  }
  DeviceFacts f;
  MOEKIT_RETURN_IF_ERROR(current_device_facts(&f));
  if (!f.cooperative_launch) return Unsupported("small_m/persistent: the device does not launch kernels cooperatively");
  if (f.smem_optin_bytes < kSmemBytes) {
    return Unsupported("small_m/persistent: needs ", kSmemBytes, " shared bytes per CTA, the device allows ",
                       f.smem_optin_bytes);
  }
  return Status::Ok();
}

size_t fused_moe_sm90_decode_workspace_bytes(const FusedMoeParams& p) {
  return layout_of(moe_dims(p), current_device_facts_or_zero().sm_count).total;
}

Status fused_moe_sm90_decode_run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  DeviceFacts f;
  MOEKIT_RETURN_IF_ERROR(current_device_facts(&f));
  const Layout l = layout_of(d, f.sm_count);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < l.total) {
    return InvalidArgument("workspace: fused_moe_sm90_decode needs ", l.total, " device bytes, got ", ctx.workspace_bytes);
  }
  auto* ws = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ctx.workspace) + 255) / 256 * 256);
  Args a{};
  a.x = p.x.data;
  a.out = p.out.data;
  a.ids = p.topk_ids.ptr<const int32_t>();
  a.wts = p.topk_weights.ptr<const float>();
  a.mask = p.expert_mask.present() ? p.expert_mask.ptr<const int32_t>() : nullptr;
  a.map = p.expert_map.present() ? p.expert_map.ptr<const int32_t>() : nullptr;
  a.w1s = p.w1_scale.ptr<const float>();
  a.w2s = p.w2_scale.ptr<const float>();
  a.xq = ws + l.xq;
  a.sx = reinterpret_cast<float*>(ws + l.sx);
  a.part1 = reinterpret_cast<float*>(ws + l.part1);
  a.aq = ws + l.aq;
  a.sa = reinterpret_cast<float*>(ws + l.sa);
  a.part2 = reinterpret_cast<float*>(ws + l.part2);
  a.x_stride = p.x.stride[0];
  a.out_stride = p.out.stride[0];
  a.T = int(d.T), a.H = int(d.H), a.I = int(d.I), a.E = int(d.E), a.Eg = int(d.Eg), a.k = int(d.k), a.N1 = int(d.N1);
  a.g1u1 = d.g1u1;
  a.weight_on_input = p.weight_on_input;
  constexpr CUtensorMapDataType kU8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  CUtensorMap maps[4];
  const uint64_t tk = uint64_t(d.T * d.k);
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&maps[0], p.w1.data, kU8, 1, uint64_t(d.E * d.N1), uint64_t(d.H),
                                              uint64_t(d.H), 64, "fused_moe_sm90_decode w1"));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&maps[1], a.xq, kU8, 1, uint64_t(d.T), uint64_t(d.H), uint64_t(d.H), 8,
                                              "fused_moe_sm90_decode xq"));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&maps[2], p.w2.data, kU8, 1, uint64_t(d.E * d.H), uint64_t(d.I),
                                              uint64_t(d.I), 64, "fused_moe_sm90_decode w2"));
  MOEKIT_RETURN_IF_ERROR(encode_tensor_map_2d(&maps[3], a.aq, kU8, 1, tk, uint64_t(d.I), uint64_t(d.I), 8,
                                              "fused_moe_sm90_decode aq"));
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  if (p.x.dtype == DType::bf16) return launch_act<__nv_bfloat16>(a, maps, f.sm_count, p.activation, st);
  return launch_act<__half>(a, maps, f.sm_count, p.activation, st);
}

}  // namespace moekit::cuda
