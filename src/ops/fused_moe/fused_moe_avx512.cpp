// fused_moe_avx512_bf16: the CPU backend's unquantized bf16 fused_moe (SPEC 3.1, 3.4, 3.5).
//
//   stage 0 (calling thread): group the (token, slot) entries by local expert, stable (token, slot)
//            order; -1 ids and remote experts are skipped.
//   stage 1 (threads over experts x blocks of 16 intermediate rows): for up to 4 entries at a time,
//            dot the gate row i and up row I+i of w1[e] with the entries' x rows using vdpbf16ps
//            (32 bf16 pairs per instruction, f32 accumulate), then a = act(g)*u (weight on input:
//            g and u scaled by w first), rounded to bf16, into a [T*k, I] scratch.
//   stage 2 (threads over experts x blocks of 16 hidden rows): y[slot, h] = w2[e][h] . a[slot] (f32).
//   stage 3 (threads over tokens): out[t] = sum_j w_tj * y[t*k + j] in slot order, one rounding.
// Every weight row of a touched expert is read once per block of 4 entries (once in total at
// decode). Work is split by a fixed partition (src/cpu/thread_pool.h) and every output element is
// produced by one thread in a fixed order: deterministic. The AVX-512 code is compiled through
// target attributes, so this file needs no special flags and the registry (and supports()) runs on
// any x86-64; the backend probe keeps the kernel off CPUs without AVX-512 BF16.
//
// Packed weights (layout cpu_vnni2_n32 from pack_weight, moekit/ops/layout.h: [N/32][K/2][32][2]
// per expert) take a register-blocked GEMM path instead of stages 1 and 2 above:
//   micro-kernel: up to 4 entry rows x 64 columns (two 32-row panels A and B: gate + up at stage 1,
//            two hidden panels at stage 2) = 16 zmm accumulators; per K-pair 4 weight vectors are
//            loaded and each row's (x[2q], x[2q+1]) pair is broadcast into 4 vdpbf16ps.
//   blocking: K in chunks of kChunkK (the 64-column weight chunk, 32 KiB, stays in L1 while every
//            row group of the token block streams past it); partial sums live in a per-task f32
//            tile [kTokenBlock][64] that the epilogue reads (stage 1: act(g)*u -> bf16 a; stage 2:
//            y rows).
//   tasks:   (expert, column block, token block); an expert's entries are cut into ceil(n / 128)
//            equal token blocks, token block innermost so consecutive tasks reuse a weight panel.
//            At decode that is a column split (one active expert still uses every core); at
//            prefill a 2-D split. Threads claim tasks from a shared counter (a busy neighbour
//            on one core does not stall the other); each output element is made by one task in a
//            fixed order, so results do not depend on the schedule or the thread count.
// Test: tests/test_fused_moe_avx512.cpp; `moekit check --backend cpu`, `moekit bench --backend cpu`.
#include "cpu/cpu_simd.h"  // first: it silences GCC 12's false warnings inside the intrinsics headers

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "cpu/thread_pool.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/ops/layout.h"
#include "ops/fused_moe/fused_moe_cpu.h"
#include "ops/fused_moe/fused_moe_ref.h"

namespace moekit::cpu {

void register_fused_moe_avx512(Registry& r);

namespace {

constexpr int64_t kRowBlock = 16;  // output rows per task
constexpr int kTok = 4;            // entries per register block

// Scratch carved from the workspace: the expert groups plus this kernel's buffers.
struct Scratch : moe::ExpertGroups {
  uint16_t* a;  // [T*k, I] intermediate (bf16 bits)
  float* y;     // [T*k, H] per-slot expert output
};

size_t workspace_bytes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k);
  return moe::expert_groups_bytes(d) + moe::align64(slots * size_t(d.I) * 2) +
         moe::align64(slots * size_t(d.H) * 4) + 64;
}

Scratch carve(const FusedMoeParams& p, void* ws) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k);
  moe::Carver c(ws);
  Scratch s;
  moe::carve_expert_groups(d, c, &s);
  s.a = c.take<uint16_t>(slots * size_t(d.I));
  s.y = c.take<float>(slots * size_t(d.H));
  return s;
}

Status supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(moe::require_host(p));
  if (p.x.dtype != DType::bf16) return Unsupported("fused_moe_avx512_bf16: x must be bf16, got ", dtype_name(p.x.dtype));
  if (p.w1.layout != Layout::row_major && p.w1.layout != Layout::cpu_vnni2_n32) {
    return Unsupported("fused_moe_avx512_bf16: weights must be row_major or cpu_vnni2_n32, got ",
                       layout_name(p.w1.layout));
  }
  if (!p.round_intermediate) return Unsupported("fused_moe_avx512_bf16: needs round_intermediate (bf16 intermediate)");
  const MoeDims d = moe_dims(p);
  if (d.H % 32 != 0 || d.I % 32 != 0) {
    return Unsupported("fused_moe_avx512_bf16: H and I must be multiples of 32, got H=", d.H, " I=", d.I);
  }
  return Status::Ok();
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// Sum of the 16 lanes in a fixed order. NOTE: not _mm512_reduce_add_ps, which trips a false
// -Wmaybe-uninitialized in GCC 12's headers.
__attribute__((target("avx512f"))) inline float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

// Stage 1 for expert e, intermediate rows [i0, i1): a[slot, i] for every entry of e.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void gate_up_block(
    const FusedMoeParams& p, const MoeDims& d, const Scratch& s, int32_t e, int64_t i0, int64_t i1) {
  const auto* w1 = p.w1.ptr<const uint16_t>() + int64_t(e) * d.N1 * d.H;
  const auto* x = p.x.ptr<const uint16_t>();
  const float* tw = p.topk_weights.ptr<const float>();
  const int32_t* ent = s.entry + s.offset[e];
  const int64_t n = s.offset[e + 1] - s.offset[e];
  for (int64_t c = 0; c < n; c += kTok) {
    const int nt = int(std::min<int64_t>(kTok, n - c));
    const uint16_t* xr[kTok];
    for (int q = 0; q < kTok; ++q) xr[q] = x + (ent[c + std::min(q, nt - 1)] / d.k) * p.x.stride[0];
    for (int64_t i = i0; i < i1; ++i) {
      const uint16_t* wg = w1 + i * d.H;
      const uint16_t* wu = d.g1u1 ? w1 + (d.I + i) * d.H : wg;
      __m512 ag[kTok], au[kTok];
      for (int q = 0; q < kTok; ++q) ag[q] = au[q] = _mm512_setzero_ps();
      for (int64_t kk = 0; kk < d.H; kk += 32) {
        const __m512i vg = _mm512_loadu_si512(wg + kk);
        const __m512i vu = _mm512_loadu_si512(wu + kk);
#pragma GCC unroll 4
        for (int q = 0; q < kTok; ++q) {
          const __m512i vx = _mm512_loadu_si512(xr[q] + kk);
          ag[q] = dp(ag[q], vg, vx);
          au[q] = dp(au[q], vu, vx);
        }
      }
      for (int q = 0; q < nt; ++q) {
        const int32_t slot = ent[c + q];
        const float win = ref::moe::slot_weight(p, tw[slot]).in;
        const float g = hsum(ag[q]) * win;
        float v = ref::moe::activation(p.activation, g);
        if (d.g1u1) v *= hsum(au[q]) * win;
        s.a[int64_t(slot) * d.I + i] = f32_to_bf16_bits(v);
      }
    }
  }
}

// Stage 2 for expert e, hidden rows [h0, h1): y[slot, h] = w2[e][h] . a[slot].
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void down_block(
    const FusedMoeParams& p, const MoeDims& d, const Scratch& s, int32_t e, int64_t h0, int64_t h1) {
  const auto* w2 = p.w2.ptr<const uint16_t>() + int64_t(e) * d.H * d.I;
  const int32_t* ent = s.entry + s.offset[e];
  const int64_t n = s.offset[e + 1] - s.offset[e];
  for (int64_t c = 0; c < n; c += kTok) {
    const int nt = int(std::min<int64_t>(kTok, n - c));
    const uint16_t* ar[kTok];
    for (int q = 0; q < kTok; ++q) ar[q] = s.a + int64_t(ent[c + std::min(q, nt - 1)]) * d.I;
    for (int64_t h = h0; h < h1; ++h) {
      const uint16_t* wr = w2 + h * d.I;
      __m512 acc[kTok];
      for (int q = 0; q < kTok; ++q) acc[q] = _mm512_setzero_ps();
      for (int64_t kk = 0; kk < d.I; kk += 32) {
        const __m512i vw = _mm512_loadu_si512(wr + kk);
#pragma GCC unroll 4
        for (int q = 0; q < kTok; ++q) acc[q] = dp(acc[q], vw, _mm512_loadu_si512(ar[q] + kk));
      }
      for (int q = 0; q < nt; ++q) s.y[int64_t(ent[c + q]) * d.H + h] = hsum(acc[q]);
    }
  }
}

// ---------------------------------------------------------------- packed (cpu_vnni2_n32) path
constexpr int64_t kCols = 2 * kVnniPanelN;  // columns per micro-kernel: panels A and B
constexpr int64_t kChunkK = 256;            // K per weight chunk: 64 cols x 256 x 2 B = 32 KiB (L1)
constexpr int64_t kTokenBlock = 128;        // max entries per task (tile: 128 x 64 f32 = 32 KiB)

inline int32_t load_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// c[m][0..63] (+)= sum over K-pairs q < kp of rows xr[m] . panel columns; pa / pb point at the
// chunk's first K-pair of panels A and B (64 bf16 per K-pair each). M rows x 4 vectors = 4M
// accumulators (16 at M = 4), held in registers for the whole chunk.
template <int M>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void micro_kernel(
    const uint16_t* pa, const uint16_t* pb, const uint16_t* const* xr, int64_t kp, float* c, bool accumulate) {
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m) {
    for (int v = 0; v < 4; ++v) acc[m][v] = accumulate ? _mm512_load_ps(c + m * kCols + v * 16) : _mm512_setzero_ps();
  }
  for (int64_t q = 0; q < kp; ++q) {
    const __m512i w0 = _mm512_loadu_si512(pa + q * 64), w1 = _mm512_loadu_si512(pa + q * 64 + 32);
    const __m512i w2 = _mm512_loadu_si512(pb + q * 64), w3 = _mm512_loadu_si512(pb + q * 64 + 32);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      const __m512i xb = _mm512_set1_epi32(load_pair(xr[m] + 2 * q));
      acc[m][0] = dp(acc[m][0], w0, xb);
      acc[m][1] = dp(acc[m][1], w1, xb);
      acc[m][2] = dp(acc[m][2], w2, xb);
      acc[m][3] = dp(acc[m][3], w3, xb);
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int v = 0; v < 4; ++v) _mm512_store_ps(c + m * kCols + v * 16, acc[m][v]);
  }
}

// tile[r][0..63] = rows[r] . columns of panels A, B over all K (rows r < n, K = panel depth).
// Weight chunk outermost: it stays in L1 while every row group of the block passes.
void panel_gemm(const uint16_t* pa, const uint16_t* pb, const uint16_t* const* rows, int64_t n, int64_t K,
                float* tile) {
  for (int64_t k0 = 0; k0 < K; k0 += kChunkK) {
    const int64_t kp = std::min(kChunkK, K - k0) / 2;
    const uint16_t* ca = pa + k0 * kVnniPanelN;  // K-pair k0/2 starts at (k0/2) * 64 elements
    const uint16_t* cb = pb + k0 * kVnniPanelN;
    for (int64_t r = 0; r < n; r += kTok) {
      const uint16_t* xr[kTok];
      for (int q = 0; q < kTok; ++q) xr[q] = rows[std::min(r + q, n - 1)] + k0;
      float* c = tile + r * kCols;
      switch (std::min<int64_t>(kTok, n - r)) {
        case 4: micro_kernel<4>(ca, cb, xr, kp, c, k0 > 0); break;
        case 3: micro_kernel<3>(ca, cb, xr, kp, c, k0 > 0); break;
        case 2: micro_kernel<2>(ca, cb, xr, kp, c, k0 > 0); break;
        default: micro_kernel<1>(ca, cb, xr, kp, c, k0 > 0); break;
      }
    }
  }
}

// One task: expert e, column block cb, entries [r0, r1) of e.
struct PackedTask {
  int32_t e;
  int64_t cb, r0, r1;
};

// Tasks of one stage: every active expert x column block x token block (token block innermost).
std::vector<PackedTask> packed_tasks(const Scratch& s, int64_t col_blocks) {
  std::vector<PackedTask> tasks;
  for (int64_t a = 0; a < s.n_active; ++a) {
    const int32_t e = s.active[a];
    const int64_t n = s.offset[e + 1] - s.offset[e];
    const int64_t nb = (n + kTokenBlock - 1) / kTokenBlock;  // equal blocks, none tiny
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      for (int64_t b = 0; b < nb; ++b) tasks.push_back({e, cb, n * b / nb, n * (b + 1) / nb});
    }
  }
  return tasks;
}

// Runs fn(task, tile) for every task. Threads claim tasks one at a time from a shared counter, so
// a core that a neighbour slows down simply takes fewer tasks. NOTE: this is still deterministic:
// a task's outputs (its rows x columns of a or y) are written by that task alone, in a fixed order
// that does not depend on which thread runs it, so the result is bit-identical for any schedule.
template <class Fn>
void run_tasks(const std::vector<PackedTask>& tasks, Fn&& fn) {
  std::atomic<size_t> next{0};
  parallel_for(num_threads(), [&](int64_t b, int64_t e) {
    alignas(64) float tile[kTokenBlock * kCols];
    for (int64_t t = b; t < e; ++t) {  // one item per thread, unless the pool runs them serially
      for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < tasks.size();
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        fn(tasks[i], tile);
      }
    }
  });
}

// a[j] = bf16(silu(w g[j]) * (w u[j])) for j < n (n % 16 == 0; u null: g1u0, no product), with the
// vector sigmoid of cpu_simd.h (within kExpRelErr of expf's; a is rounded to bf16 anyway).
// NOTE: the scalar expf of ref::moe::activation cost a few percent of a large-T run
// (docs/experiments.md E89).
MOEKIT_CPU_AVX512 void silu_mul_bf16(const float* g, const float* u, float w, int64_t n, uint16_t* a) {
  const __m512 vw = _mm512_set1_ps(w);
  alignas(64) float v[16];
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 z = _mm512_mul_ps(_mm512_loadu_ps(g + j), vw);
    __m512 r = _mm512_mul_ps(z, simd::sigmoid_approx(z));
    if (u != nullptr) r = _mm512_mul_ps(r, _mm512_mul_ps(_mm512_loadu_ps(u + j), vw));
    _mm512_store_ps(v, r);
    for (int q = 0; q < 16; ++q) a[j + q] = f32_to_bf16_bits(v[q]);
  }
}

// Stage 1, packed: a[slot, i] = act(w * g) * (w * u) for the 32 intermediate columns of gate panel
// cb (g1u1: B = up panel cb) or the 64 of gate panels 2cb, 2cb + 1 (g1u0).
void gate_up_packed(const FusedMoeParams& p, const MoeDims& d, const Scratch& s, const PackedTask& t, float* tile) {
  const auto* w1 = p.w1.ptr<const uint16_t>() + int64_t(t.e) * d.N1 * d.H;
  const int64_t panel = kVnniPanelN * d.H, gate_panels = d.I / kVnniPanelN;
  const uint16_t* pa = w1 + (d.g1u1 ? t.cb : 2 * t.cb) * panel;
  const int64_t pb_index = d.g1u1 ? gate_panels + t.cb : std::min(2 * t.cb + 1, gate_panels - 1);
  const uint16_t* pb = w1 + pb_index * panel;
  const int32_t* ent = s.entry + s.offset[t.e] + t.r0;
  const int64_t n = t.r1 - t.r0;
  const uint16_t* rows[kTokenBlock] = {};
  for (int64_t r = 0; r < n; ++r) rows[r] = p.x.ptr<const uint16_t>() + (ent[r] / d.k) * p.x.stride[0];
  panel_gemm(pa, pb, rows, n, d.H, tile);
  const float* tw = p.topk_weights.ptr<const float>();
  const int64_t i0 = d.g1u1 ? t.cb * kVnniPanelN : 2 * t.cb * kVnniPanelN;
  const int64_t ncols = d.g1u1 ? kVnniPanelN : std::min(kCols, d.I - i0);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t slot = ent[r];
    const float win = ref::moe::slot_weight(p, tw[slot]).in;
    const float* c = tile + r * kCols;
    uint16_t* a = s.a + int64_t(slot) * d.I + i0;
    if (p.activation == Activation::silu && ncols % 16 == 0) {
      silu_mul_bf16(c, d.g1u1 ? c + kVnniPanelN : nullptr, win, ncols, a);
      continue;
    }
    for (int64_t j = 0; j < ncols; ++j) {
      float v = ref::moe::activation(p.activation, c[j] * win);
      if (d.g1u1) v *= c[kVnniPanelN + j] * win;
      a[j] = f32_to_bf16_bits(v);
    }
  }
}

// Stage 2, packed: y[slot, h] = w2[e][h] . a[slot] for the 64 hidden rows of panels 2cb, 2cb + 1.
void down_packed(const FusedMoeParams& p, const MoeDims& d, const Scratch& s, const PackedTask& t, float* tile) {
  const auto* w2 = p.w2.ptr<const uint16_t>() + int64_t(t.e) * d.H * d.I;
  const int64_t panel = kVnniPanelN * d.I, panels = d.H / kVnniPanelN;
  const uint16_t* pa = w2 + 2 * t.cb * panel;
  const uint16_t* pb = w2 + std::min(2 * t.cb + 1, panels - 1) * panel;
  const int32_t* ent = s.entry + s.offset[t.e] + t.r0;
  const int64_t n = t.r1 - t.r0;
  const uint16_t* rows[kTokenBlock] = {};
  for (int64_t r = 0; r < n; ++r) rows[r] = s.a + int64_t(ent[r]) * d.I;
  panel_gemm(pa, pb, rows, n, d.I, tile);
  const int64_t h0 = 2 * t.cb * kVnniPanelN, ncols = std::min(kCols, d.H - h0);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(s.y + int64_t(ent[r]) * d.H + h0, tile + r * kCols, size_t(ncols) * sizeof(float));
  }
}

void run_packed(const FusedMoeParams& p, const MoeDims& d, const Scratch& s) {
  const int64_t gate_panels = d.I / kVnniPanelN, hidden_panels = d.H / kVnniPanelN;
  const int64_t cb1 = d.g1u1 ? gate_panels : (gate_panels + 1) / 2, cb2 = (hidden_panels + 1) / 2;
  run_tasks(packed_tasks(s, cb1), [&](const PackedTask& t, float* tile) { gate_up_packed(p, d, s, t, tile); });
  run_tasks(packed_tasks(s, cb2), [&](const PackedTask& t, float* tile) { down_packed(p, d, s, t, tile); });
}

Status run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  Scratch s = carve(p, ctx.workspace);
  moe::group_entries(p, d, &s);
  if (p.w1.layout == Layout::cpu_vnni2_n32) {
    run_packed(p, d, s);
    moe::combine_slots(p, d, s, s.y);  // stage 3
    return Status::Ok();
  }
  // Stage 1 and 2: tasks = active experts x row blocks.
  const int64_t nbi = (d.I + kRowBlock - 1) / kRowBlock, nbh = (d.H + kRowBlock - 1) / kRowBlock;
  parallel_for(s.n_active * nbi, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t i0 = (t % nbi) * kRowBlock;
      gate_up_block(p, d, s, s.active[t / nbi], i0, std::min(d.I, i0 + kRowBlock));
    }
  });
  parallel_for(s.n_active * nbh, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t h0 = (t % nbh) * kRowBlock;
      down_block(p, d, s, s.active[t / nbh], h0, std::min(d.H, h0 + kRowBlock));
    }
  });
  moe::combine_slots(p, d, s, s.y);  // stage 3
  return Status::Ok();
}

}  // namespace

void register_fused_moe_avx512(Registry& r) {
  r.add({"fused_moe_avx512_bf16", OpKind::fused_moe, MoeVariant::unquantized, Backend::cpu,
         "x/w bf16 row_major or cpu_vnni2_n32, vdpbf16ps f32 accumulate, a rounded to bf16; H, I % 32 == 0", 50,
         erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run>});
}

}  // namespace moekit::cpu
