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
// Test: tests/test_fused_moe_avx512.cpp; `moekit check --backend cpu`, `moekit bench --backend cpu`.
#include <immintrin.h>

#include <algorithm>

#include "cpu/thread_pool.h"
#include "moekit/ops/fused_moe.h"
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
  if (p.w1.layout != Layout::row_major) {
    return Unsupported("fused_moe_avx512_bf16: weights must be row_major, got ", layout_name(p.w1.layout));
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

Status run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  Scratch s = carve(p, ctx.workspace);
  moe::group_entries(p, d, &s);
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
         "x/w bf16 row_major, vdpbf16ps f32 accumulate, a rounded to bf16; H, I % 32 == 0", 50,
         erase_supports<FusedMoeParams, supports>, erase_workspace<FusedMoeParams, workspace_bytes>,
         erase_run<FusedMoeParams, run>});
}

}  // namespace moekit::cpu
