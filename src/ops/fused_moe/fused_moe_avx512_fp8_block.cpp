// fused_moe_avx512_fp8_block: the CPU backend's fp8 block-scale fused_moe (SPEC 3.3, 3.4; the
// DeepSeek-V3 recipe: 128 x 128 weight blocks, 1 x 128 dynamic activation groups).
//
// Same math as the reference run_block (fused_moe_ref_fp8.cpp), same staging as the per-row fp8
// kernel (fused_moe_avx512_fp8.cpp):
//   stage 0  (calling thread): group the (token, slot) entries by local expert, stable order;
//            then (threads over tokens) x_t -> f32 and quantized per bk-group g: s_tg =
//            max(amax_g, floor) / 448, xq = fp8 code VALUES of x_t / s_tg, into a [T, H] scratch.
//   stage 1  (threads over experts x blocks of 16 intermediate rows): for the gate rows i, i+1 and
//            up rows I+i, I+i+1 (bn x bk weight block scales s_w) and up to kTok entries, the dot
//            product is summed per bk-block in f32 registers, then promoted into the row total
//            with (s_tg x s_w) -- DeepGEMM's two-level accumulation, as the reference does it --;
//            a = act(w * g) * (w * u) (w = 1 unless weight_on_input) in f32 into [T*k, I].
//   stage 1b (threads over slots): a re-quantized per (token, slot, bk-group), in place.
//   stage 2  (threads over experts x blocks of 16 hidden rows): y[slot, h] = block-promoted
//            (aq . w2q[e][h]).
//   stage 3  (threads over tokens): out[t] = sum_j w_tj * y[t*k + j] in slot order, one rounding.
// fp8 e4m3fn weights are decoded on the fly in registers, 16 codes at a time, as code value x
// 2^-120 (moe::decode16_fp8, fused_moe_avx512_fp8.h), never expanded in memory. Each block's
// partial sum (exact products) is promoted with c = (s_tg x s_w) x 2^60 and the row total times 2^60
// at the end: both factors exact, and the running total stays far from the f32 denormal range.
// A task's 16 rows lie in one bn-block (bn % 16 == 0), so c is tabulated once per task and entry
// chunk (make_table) and the per-block epilogue is a single FMA with a broadcast from memory: the
// scalar scale products there were a large part of the one-token time (docs/experiments.md E98).
// Needs H, I, bn and bk multiples of 16 (the last block may be partial: H = 96 with bk = 128
// works). Deterministic: fixed partition (src/cpu/thread_pool.h), each output element from one
// thread in a fixed order. supports() refuses CPUs without AVX-512 F/BW/VL (moe::require_avx512).
// Test: tests/test_fused_moe_cpu_generic.cpp (suite FusedMoeCpuGeneric, named cases against the
// reference) and `moekit check --op fused_moe --backend cpu --scheme fp8_block`.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/thread_pool.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_avx512_fp8.h"
#include "ops/fused_moe/fused_moe_cpu.h"
#include "ops/fused_moe/fused_moe_ref.h"

namespace moekit::cpu {

void register_fused_moe_avx512_fp8_block(Registry& r);

namespace {

constexpr const char* kName = "fused_moe_avx512_fp8_block";
constexpr int64_t kRowBlock = 16;    // output rows per task (divides bn: one bn-block per task)
constexpr int kTok = 3;              // entries per register block (2 x 4 x 3 accumulators)
constexpr int64_t kPrefetch = 2048;  // bytes ahead along a weight row (as the per-row kernel)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch carved from the workspace: the expert groups plus this kernel's buffers.
struct Scratch : moe::ExpertGroups {
  float* xq;  // [T, H] fp8 code values of the quantized tokens
  float* xs;  // [T, kh] activation scale of each (token, group)
  float* a;   // [T*k, I] intermediate in f32, then its fp8 code values (stage 1b)
  float* as;  // [T*k, ki] intermediate scale of each (slot, group)
  float* y;   // [T*k, H] per-slot expert output
};

size_t workspace_bytes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k), T = size_t(d.T);
  const size_t kh = size_t(ceil_div(d.H, p.scale_block_k)), ki = size_t(ceil_div(d.I, p.scale_block_k));
  return moe::expert_groups_bytes(d) + moe::align64(T * size_t(d.H) * 4) + moe::align64(T * kh * 4) +
         moe::align64(slots * size_t(d.I) * 4) + moe::align64(slots * ki * 4) + moe::align64(slots * size_t(d.H) * 4) +
         64;
}

Scratch carve(const FusedMoeParams& p, void* ws) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k), T = size_t(d.T);
  const size_t kh = size_t(ceil_div(d.H, p.scale_block_k)), ki = size_t(ceil_div(d.I, p.scale_block_k));
  moe::Carver c(ws);
  Scratch s;
  moe::carve_expert_groups(d, c, &s);
  s.xq = c.take<float>(T * size_t(d.H));
  s.xs = c.take<float>(T * kh);
  s.a = c.take<float>(slots * size_t(d.I));
  s.as = c.take<float>(slots * ki);
  s.y = c.take<float>(slots * size_t(d.H));
  return s;
}

Status supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(moe::require_avx512(kName, cpu_features(), false));
  MOEKIT_RETURN_IF_ERROR(moe::require_host(p));
  if (p.x.dtype != DType::bf16 && p.x.dtype != DType::f16 && p.x.dtype != DType::f32) {
    return Unsupported(kName, ": x must be bf16, f16 or f32, got ", dtype_name(p.x.dtype));
  }
  if (p.w1.dtype != DType::fp8_e4m3fn || p.w2.dtype != DType::fp8_e4m3fn) {
    return Unsupported(kName, ": weights must be fp8_e4m3fn, got w1 ", dtype_name(p.w1.dtype), ", w2 ",
                       dtype_name(p.w2.dtype));
  }
  if (p.w1.layout != Layout::row_major || p.w2.layout != Layout::row_major) {
    return Unsupported(kName, ": weights must be row_major, got w1 ", layout_name(p.w1.layout), ", w2 ",
                       layout_name(p.w2.layout));
  }
  if (p.scale_block_n <= 0 || p.scale_block_k <= 0 || p.scale_block_n % 16 != 0 || p.scale_block_k % 16 != 0) {
    return Unsupported(kName, ": block scales must be multiples of 16, got scale_block_n=", p.scale_block_n,
                       " scale_block_k=", p.scale_block_k);
  }
  const MoeDims d = moe_dims(p);
  if (d.H % 16 != 0 || d.I % 16 != 0) {
    return Unsupported(kName, ": H and I must be multiples of 16, got H=", d.H, " I=", d.I);
  }
  return Status::Ok();
}

// acc[r][q] += (w row r . v[q]) over [k0, k0 + 16 * steps), steps = kSteps when it is not 0 (then
// the loop is unrolled: no loop overhead inside a block, which measured faster at one token, E99).
template <int R, int NT, int kSteps>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void accumulate(const uint8_t* const* w,
                                                                                           const float* const* v,
                                                                                           int64_t k0, int64_t steps,
                                                                                           __m512 (&acc)[R][NT]) {
  const int64_t n = kSteps > 0 ? kSteps : steps;
#pragma GCC unroll 8
  for (int64_t u = 0; u < n; ++u) {
    const int64_t kk = k0 + 16 * u;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      if ((kk & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(w[r] + kk + kPrefetch), _MM_HINT_T1);
      const __m512 vw = moe::decode16_fp8(w[r] + kk);
#pragma GCC unroll 4
      for (int q = 0; q < NT; ++q) acc[r][q] = _mm512_fmadd_ps(vw, _mm512_loadu_ps(v[q] + kk), acc[r][q]);
    }
  }
}

// dots[r][q] = sum over bk-blocks b of (w row r . v[q] over block b) * c[r][q * kb + b], for R
// weight rows and NT activation rows; K % 16 == 0. c[r] is the promotion table of row r's
// bn-block (make_table): the per-block epilogue is one FMA with a broadcast from memory.
template <int R, int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void dot_rows_block(const uint8_t* const* w,
                                                                                const float* const* v,
                                                                                const float* const* c, int64_t K,
                                                                                int64_t bk, float (*dots)[kTok]) {
  const int64_t kb = ceil_div(K, bk);
  __m512 tot[R][NT];
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < NT; ++q) tot[r][q] = _mm512_setzero_ps();
  }
  for (int64_t c0 = 0, b = 0; c0 < K; c0 += bk, ++b) {
    const int64_t c1 = std::min(K, c0 + bk);
    __m512 acc[R][NT];
    for (int r = 0; r < R; ++r) {
      for (int q = 0; q < NT; ++q) acc[r][q] = _mm512_setzero_ps();
    }
    if (c1 - c0 == 128) {  // the DeepSeek block: a fixed trip count, fully unrolled
      accumulate<R, NT, 8>(w, v, c0, 8, acc);
    } else {
      accumulate<R, NT, 0>(w, v, c0, (c1 - c0) / 16, acc);
    }
    for (int r = 0; r < R; ++r) {
      for (int q = 0; q < NT; ++q) tot[r][q] = _mm512_fmadd_ps(acc[r][q], _mm512_set1_ps(c[r][q * kb + b]), tot[r][q]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < NT; ++q) dots[r][q] = moe::hsum16(tot[r][q]) * 0x1p60f;
  }
}

// The bk-block scale row of weight row n (of N) of expert e: ws[e, n / bn, :].
const float* block_scales(const FusedMoeParams& p, const TensorView& ws, int64_t e, int64_t n, int64_t N, int64_t K) {
  return ws.ptr<const float>() +
         (e * ceil_div(N, p.scale_block_n) + n / p.scale_block_n) * ceil_div(K, p.scale_block_k);
}

// The promotion table of NT activation rows (group scales vs[q]) against one bn-block of weight
// rows (block scales ws): c[q * kb + b] = vs[q][b] * ws[b] * 2^60 -- the reference's (activation
// scale x weight scale), then the exact 2^60 that keeps the running total far from denormals.
template <int NT>
void make_table(const float* const* vs, const float* ws, int64_t kb, float* c) {
  for (int q = 0; q < NT; ++q) {
    for (int64_t b = 0; b < kb; ++b) c[q * kb + b] = vs[q][b] * ws[b] * 0x1p60f;
  }
}

// Stage 1 for expert e, intermediate rows [i0, i1) (an even count inside one bn-block), NT entries
// from ent; table: 2 * kTok * ceil(H / bk) floats of per-thread scratch.
template <int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void gate_up_rows(const FusedMoeParams& p, const MoeDims& d,
                                                                       const Scratch& s, int32_t e, const int32_t* ent,
                                                                       int64_t i0, int64_t i1, float* table) {
  const auto* w1 = p.w1.ptr<const uint8_t>() + int64_t(e) * d.N1 * d.H;
  const float* tw = p.topk_weights.ptr<const float>();
  const int64_t kh = ceil_div(d.H, p.scale_block_k);
  const float* xr[kTok];
  const float* xs[kTok];
  for (int q = 0; q < NT; ++q) {
    xr[q] = s.xq + int64_t(ent[q] / d.k) * d.H;
    xs[q] = s.xs + int64_t(ent[q] / d.k) * kh;
  }
  float* cg = table;
  float* cu = table + kTok * kh;
  make_table<NT>(xs, block_scales(p, p.w1_scale, e, i0, d.N1, d.H), kh, cg);
  if (d.g1u1) make_table<NT>(xs, block_scales(p, p.w1_scale, e, d.I + i0, d.N1, d.H), kh, cu);
  const float* c[4] = {cg, cg, cu, cu};
  for (int64_t i = i0; i < i1; i += 2) {
    float dots[4][kTok];
    if (d.g1u1) {
      const uint8_t* w[4] = {w1 + i * d.H, w1 + (i + 1) * d.H, w1 + (d.I + i) * d.H, w1 + (d.I + i + 1) * d.H};
      dot_rows_block<4, NT>(w, xr, c, d.H, p.scale_block_k, dots);
    } else {
      const uint8_t* w[2] = {w1 + i * d.H, w1 + (i + 1) * d.H};
      dot_rows_block<2, NT>(w, xr, c, d.H, p.scale_block_k, dots);
    }
    for (int r = 0; r < 2; ++r) {
      for (int q = 0; q < NT; ++q) {
        const int32_t slot = ent[q];
        const float win = ref::moe::slot_weight(p, tw[slot]).in;
        float v = ref::moe::activation(p.activation, dots[r][q] * win);
        if (d.g1u1) v *= dots[2 + r][q] * win;
        s.a[int64_t(slot) * d.I + i + r] = v;
      }
    }
  }
}

// Stage 2 for expert e, hidden rows [h0, h1) (a multiple of 4 inside one bn-block), NT entries
// from ent; table: kTok * ceil(I / bk) floats of per-thread scratch.
template <int NT>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void down_rows(const FusedMoeParams& p, const MoeDims& d,
                                                                    const Scratch& s, int32_t e, const int32_t* ent,
                                                                    int64_t h0, int64_t h1, float* table) {
  const auto* w2 = p.w2.ptr<const uint8_t>() + int64_t(e) * d.H * d.I;
  const int64_t ki = ceil_div(d.I, p.scale_block_k);
  const float* ar[kTok];
  const float* as[kTok];
  for (int q = 0; q < NT; ++q) {
    ar[q] = s.a + int64_t(ent[q]) * d.I;
    as[q] = s.as + int64_t(ent[q]) * ki;
  }
  make_table<NT>(as, block_scales(p, p.w2_scale, e, h0, d.H, d.I), ki, table);
  const float* c[4] = {table, table, table, table};
  for (int64_t h = h0; h < h1; h += 4) {
    float dots[4][kTok];
    const uint8_t* w[4] = {w2 + h * d.I, w2 + (h + 1) * d.I, w2 + (h + 2) * d.I, w2 + (h + 3) * d.I};
    dot_rows_block<4, NT>(w, ar, c, d.I, p.scale_block_k, dots);
    for (int r = 0; r < 4; ++r) {
      for (int q = 0; q < NT; ++q) s.y[int64_t(ent[q]) * d.H + h + r] = dots[r][q];
    }
  }
}

// Runs fn<NT>(ent) over expert e's entries in chunks of up to kTok.
template <typename F>
void for_entry_chunks(const Scratch& s, int32_t e, F&& fn) {
  const int32_t* ent = s.entry + s.offset[e];
  const int64_t n = s.offset[e + 1] - s.offset[e];
  for (int64_t c = 0; c < n; c += kTok) {
    switch (std::min<int64_t>(kTok, n - c)) {
      case 1: fn(std::integral_constant<int, 1>{}, ent + c); break;
      case 2: fn(std::integral_constant<int, 2>{}, ent + c); break;
      default: fn(std::integral_constant<int, 3>{}, ent + c); break;
    }
  }
}

// Quantizes v[0..n) to fp8 code values in place per group of bk; group scales to scale.
void quantize_groups(float* v, int64_t n, int64_t bk, float* scale) {
  for (int64_t g = 0; g * bk < n; ++g) {
    const int64_t c0 = g * bk;
    scale[g] = ref::moe::quantize_row_fp8(v + c0, std::min(bk, n - c0), v + c0);
  }
}

Status run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  Scratch s = carve(p, ctx.workspace);
  const int64_t bk = p.scale_block_k, kh = ceil_div(d.H, bk), ki = ceil_div(d.I, bk);
  moe::group_entries(p, d, &s);  // stage 0a
  // Stage 0b: per (token, group) activation quantization (in place: each group's amax is read first).
  parallel_for(d.T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      ref::moe::load_x_row(p.x, t, s.xq + t * d.H);
      quantize_groups(s.xq + t * d.H, d.H, bk, s.xs + t * kh);
    }
  });
  // Stage 1 and 2: tasks = active experts x row blocks.
  const int64_t nbi = ceil_div(d.I, kRowBlock), nbh = ceil_div(d.H, kRowBlock);
  parallel_for(s.n_active * nbi, [&](int64_t b, int64_t e) {
    std::vector<float> table(static_cast<size_t>(2 * kTok * kh));
    for (int64_t t = b; t < e; ++t) {
      const int32_t ex = s.active[t / nbi];
      const int64_t i0 = (t % nbi) * kRowBlock, i1 = std::min(d.I, i0 + kRowBlock);
      for_entry_chunks(s, ex, [&](auto nt, const int32_t* ent) {
        gate_up_rows<decltype(nt)::value>(p, d, s, ex, ent, i0, i1, table.data());
      });
    }
  });
  // Stage 1b: per (token, slot, group) re-quantization of a.
  parallel_for(d.T * d.k, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      if (s.valid[q]) quantize_groups(s.a + q * d.I, d.I, bk, s.as + q * ki);
    }
  });
  parallel_for(s.n_active * nbh, [&](int64_t b, int64_t e) {
    std::vector<float> table(static_cast<size_t>(kTok * ki));
    for (int64_t t = b; t < e; ++t) {
      const int32_t ex = s.active[t / nbh];
      const int64_t h0 = (t % nbh) * kRowBlock, h1 = std::min(d.H, h0 + kRowBlock);
      for_entry_chunks(s, ex, [&](auto nt, const int32_t* ent) {
        down_rows<decltype(nt)::value>(p, d, s, ex, ent, h0, h1, table.data());
      });
    }
  });
  moe::combine_slots(p, d, s, s.y);  // stage 3
  return Status::Ok();
}

}  // namespace

void register_fused_moe_avx512_fp8_block(Registry& r) {
  r.add({kName, OpKind::fused_moe, MoeVariant::fp8_block, Backend::cpu,
         "w fp8_e4m3fn row_major decoded on the fly, bn x bk block scales promoted per block, 1 x bk dynamic fp8 "
         "activation groups, f32 FMA; H, I, bn, bk % 16 == 0",
         50, erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run>});
}

}  // namespace moekit::cpu
