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
#include <cstring>
#include <vector>

#include "cpu/thread_pool.h"
#include "moekit/ops/fused_moe.h"
#include "ops/fused_moe/fused_moe_ref.h"

namespace moekit::cpu {

void register_fused_moe_avx512(Registry& r);

namespace {

constexpr int64_t kRowBlock = 16;  // output rows per task
constexpr int kTok = 4;            // entries per register block

// Scratch carved from the workspace (64-byte aligned pieces).
struct Scratch {
  int32_t* local;   // [Eg] global -> local expert (-1 remote)
  int32_t* offset;  // [E + 1] start of each expert's entries in `entry`
  int32_t* entry;   // [T*k] slot ids t*k + j grouped by expert, (t, j) ascending inside
  int32_t* active;  // [E] local experts with entries, ascending; count in n_active
  uint8_t* valid;   // [T*k] the slot has a local expert
  uint16_t* a;      // [T*k, I] intermediate (bf16 bits)
  float* y;         // [T*k, H] per-slot expert output
  int64_t n_active;
};

size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

size_t workspace_bytes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k);
  return align64(size_t(d.Eg) * 4) + align64(size_t(d.E + 1) * 4) + align64(slots * 4) +
         align64(size_t(d.E) * 4) + align64(slots) + align64(slots * size_t(d.I) * 2) +
         align64(slots * size_t(d.H) * 4) + 64;
}

Scratch carve(const FusedMoeParams& p, void* ws) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k);
  auto* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(ws) + 63) & ~uintptr_t(63));
  auto take = [&](size_t bytes) {
    unsigned char* q = base;
    base += align64(bytes);
    return q;
  };
  Scratch s;
  s.local = reinterpret_cast<int32_t*>(take(size_t(d.Eg) * 4));
  s.offset = reinterpret_cast<int32_t*>(take(size_t(d.E + 1) * 4));
  s.entry = reinterpret_cast<int32_t*>(take(slots * 4));
  s.active = reinterpret_cast<int32_t*>(take(size_t(d.E) * 4));
  s.valid = take(slots);
  s.a = reinterpret_cast<uint16_t*>(take(slots * size_t(d.I) * 2));
  s.y = reinterpret_cast<float*>(take(slots * size_t(d.H) * 4));
  s.n_active = 0;
  return s;
}

Status supports(const FusedMoeParams& p) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"x", &p.x}, {"w1", &p.w1}, {"w2", &p.w2},
                                {"topk_ids", &p.topk_ids}, {"topk_weights", &p.topk_weights}, {"out", &p.out},
                                {"expert_mask", &p.expert_mask}, {"expert_map", &p.expert_map}}) {
    if (t->present() && t->device != Device::cpu) {
      return Unsupported("CPU kernels need host tensors; ", name, " is on ", device_name(t->device));
    }
  }
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

// Stage 0: entries grouped by local expert (counting sort, stable in slot order).
void group_entries(const FusedMoeParams& p, const MoeDims& d, Scratch* s) {
  ref::moe::build_local_table(p, s->local);
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  const int64_t slots = d.T * d.k;
  std::fill(s->offset, s->offset + d.E + 1, 0);
  for (int64_t q = 0; q < slots; ++q) {
    const int32_t e = ref::moe::local_expert(s->local, ids[q]);
    s->valid[q] = e >= 0;
    if (e >= 0) ++s->offset[e + 1];
  }
  for (int64_t e = 0; e < d.E; ++e) s->offset[e + 1] += s->offset[e];
  std::vector<int32_t> cursor(s->offset, s->offset + d.E);
  for (int64_t q = 0; q < slots; ++q) {
    const int32_t e = ref::moe::local_expert(s->local, ids[q]);
    if (e >= 0) s->entry[cursor[size_t(e)]++] = int32_t(q);
  }
  s->n_active = 0;
  for (int64_t e = 0; e < d.E; ++e) {
    if (s->offset[e + 1] > s->offset[e]) s->active[s->n_active++] = int32_t(e);
  }
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
  group_entries(p, d, &s);
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
  // Stage 3: per token, slots in order (the reference's order), one rounding.
  const float* tw = p.topk_weights.ptr<const float>();
  parallel_for(d.T, [&](int64_t b, int64_t e) {
    std::vector<float> y(static_cast<size_t>(d.H));
    for (int64_t t = b; t < e; ++t) {
      std::fill(y.begin(), y.end(), 0.0f);
      for (int64_t j = 0; j < d.k; ++j) {
        const int64_t slot = t * d.k + j;
        if (!s.valid[slot]) continue;
        const float w = ref::moe::slot_weight(p, tw[slot]).out;
        const float* ys = s.y + slot * d.H;
        for (int64_t h = 0; h < d.H; ++h) y[size_t(h)] += w * ys[h];
      }
      ref::moe::store_out_row(p.out, t, y.data());
    }
  });
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
