// fused_moe_cpu_generic (+ _fp8_row, _fp8_row_tkw1, _fp8_block): the CPU backend's portable
// fused_moe (SPEC 3.1 - 3.5) for any x86-64. Plain C++ compiled WITHOUT AVX-512 flags: the loops
// are written for the auto-vectoriser (16 independent f32 partial sums per dot product, branch-free
// weight decoders), and the dot product and decoders are cloned for x86-64-v3 (AVX2 + FMA) and the
// baseline, picked at load time. Registered at priority 20, below the AVX-512 kernels (40 / 50):
// it is what dispatch picks on a CPU without AVX-512, and for the problems the AVX-512 kernels
// refuse (shuffled weights, H or I not a multiple of 16, fp8 blocks not a multiple of 16).
// Same math as the reference kernels (fused_moe_ref.cpp, fused_moe_ref_fp8.cpp):
//   stage 0  (calling thread): group the (token, slot) entries by local expert (fused_moe_cpu.h);
//            then (threads over tokens) x_t -> f32, and for fp8 its activation quantization as
//            the reference does it for the variant: per token (fp8_row, dynamic or static
//            a1_scale) or per (token, bk-group) (fp8_block), into a [T, H] scratch of code values.
//   stage 1  (threads over experts x panels of kPanel w1 rows): the panel's rows are decoded to
//            f32 into a per-thread buffer of <= 32 KiB (bf16 / f16 / f32 / fp8 code values, any
//            layout), then dotted with each entry's x row: h[slot, n] (scaled as the variant says,
//            times the router weight with weight_on_input).
//   stage 1b (threads over slots): a = act(g) * u; rounded to x's dtype (unquantized with
//            round_intermediate) or re-quantized to fp8 per slot (fp8_row) / per (slot, group).
//   stage 2  (threads over experts x panels of w2 rows): y[slot, c] = w2[e][c] . a (scaled).
//   stage 3  (threads over tokens): out[t] = sum_j w_tj * y[t*k + j] in slot order, one rounding.
// fp8 weights are never expanded in memory: at most ~32 KiB of decoded rows per thread.
// Deterministic: fixed partition (src/cpu/thread_pool.h), each output element from one thread in
// a fixed order (bit-identical run to run; the AVX2 and baseline clones may differ in the last
// bits, e.g. through FMA contraction). Test: tests/test_fused_moe_cpu_generic.cpp (suite FusedMoeCpuGeneric), which
// forces these kernels through RunOptions.kernel; `moekit check --backend cpu`.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/thread_pool.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/ops/layout.h"
#include "ops/fused_moe/fused_moe_cpu.h"
#include "ops/fused_moe/fused_moe_ref.h"

namespace moekit::cpu {

void register_fused_moe_cpu_generic(Registry& r);

namespace {

constexpr int64_t kPanel = 8;              // weight rows per task
constexpr int64_t kPanelBytes = 32 << 10;  // decoded rows kept in L1 while the entries loop runs

#if defined(__x86_64__) && defined(__GNUC__)
#define MOEKIT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MOEKIT_CLONES
#endif

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Activation / intermediate scale groups per row: fp8_block 1 x bk groups, fp8_row one per row,
// unquantized none (one unused entry).
int64_t groups(const FusedMoeParams& p, int64_t n) { return p.scale_block_k > 0 ? ceil_div(n, p.scale_block_k) : 1; }

bool is_fp8(const FusedMoeParams& p) { return dtype_size(p.w1.dtype) == 1; }

// Scratch carved from the workspace: the expert groups plus this kernel's buffers.
struct Scratch : moe::ExpertGroups {
  float* x;   // [T, H] x as f32 (fp8: code values of the quantized tokens)
  float* xs;  // [T, groups(H)] activation scales (fp8)
  float* h;   // [T*k, N1] first GEMM output
  float* a;   // [T*k, I] intermediate (fp8: its code values)
  float* as;  // [T*k, groups(I)] intermediate scales (fp8)
  float* y;   // [T*k, H] per-slot expert output
};

size_t workspace_bytes(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k), T = size_t(d.T);
  return moe::expert_groups_bytes(d) + moe::align64(T * size_t(d.H) * 4) +
         moe::align64(T * size_t(groups(p, d.H)) * 4) + moe::align64(slots * size_t(d.N1) * 4) +
         moe::align64(slots * size_t(d.I) * 4) + moe::align64(slots * size_t(groups(p, d.I)) * 4) +
         moe::align64(slots * size_t(d.H) * 4) + 64;
}

Scratch carve(const FusedMoeParams& p, void* ws) {
  const MoeDims d = moe_dims(p);
  const size_t slots = size_t(d.T * d.k), T = size_t(d.T);
  moe::Carver c(ws);
  Scratch s;
  moe::carve_expert_groups(d, c, &s);
  s.x = c.take<float>(T * size_t(d.H));
  s.xs = c.take<float>(T * size_t(groups(p, d.H)));
  s.h = c.take<float>(slots * size_t(d.N1));
  s.a = c.take<float>(slots * size_t(d.I));
  s.as = c.take<float>(slots * size_t(groups(p, d.I)));
  s.y = c.take<float>(slots * size_t(d.H));
  return s;
}

Status supports(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(moe::require_host(p));
  if (p.w1.dtype == DType::fp8_e4m3fnuz || p.w2.dtype == DType::fp8_e4m3fnuz) {
    return Unsupported("fused_moe_cpu_generic: fp8 weights must be fp8_e4m3fn, got w1 ", dtype_name(p.w1.dtype),
                       ", w2 ", dtype_name(p.w2.dtype));
  }
  return Status::Ok();
}

// f32 dot product of a[0..n) and b[0..n): 16 partial sums (lane j takes indices = j mod 16)
// added in a fixed order, then the tail. NOTE: the 16 lanes are what lets the compiler vectorise
// without -ffast-math; the clones give AVX2 + FMA where the CPU has it, SSE2 elsewhere.
MOEKIT_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0] + tail;
}

// fp8 e4m3fn codes s[0..n) -> their f32 values, the same as e4m3fn_bits_to_f32 but branch-free so
// that the loop vectorises: normal codes by moving the exponent / mantissa bits into place and
// re-biasing the exponent (+120), subnormal codes (exponent 0) as m * 2^-9 (exact), NaN codes
// (0x7F, 0xFF) as a quiet NaN; then the sign bit.
MOEKIT_CLONES void decode_fp8_row(const uint8_t* s, int64_t n, float* row) {
  for (int64_t c = 0; c < n; ++c) {
    const uint32_t em = s[c] & 0x7Fu;
    const float sub = float(int32_t(em)) * 0x1p-9f;
    uint32_t sub_bits;
    std::memcpy(&sub_bits, &sub, 4);
    // NOTE: all-ones / zero masks instead of ?: -- GCC 12 does not vectorise the selects.
    const uint32_t normal = 0u - uint32_t(em >= 8u), nan = 0u - uint32_t(em == 0x7Fu);
    uint32_t bits = (((em << 20) + (120u << 23)) & normal) | (sub_bits & ~normal);
    bits = (0x7FC00000u & nan) | (bits & ~nan) | (uint32_t(s[c] & 0x80u) << 24);
    std::memcpy(row + c, &bits, 4);
  }
}

// f16 bits s[0..n) -> f32, the same as f16_bits_to_f32 but branch-free so that the loop
// vectorises: normal codes re-biased (+112), subnormals as m * 2^-24 (exact), inf / NaN (exponent
// 31) with the f32 exponent all ones and the mantissa kept; then the sign bit.
MOEKIT_CLONES void decode_f16_row(const uint16_t* s, int64_t n, float* row) {
  for (int64_t c = 0; c < n; ++c) {
    const uint32_t em = s[c] & 0x7FFFu;
    const float sub = float(int32_t(em)) * 0x1p-24f;
    uint32_t sub_bits;
    std::memcpy(&sub_bits, &sub, 4);
    const uint32_t normal = 0u - uint32_t(em >= 0x400u), special = 0u - uint32_t(em >= 0x7C00u);
    uint32_t bits = (((em << 13) + (112u << 23)) & normal) | (sub_bits & ~normal);
    bits = (((em << 13) | 0x7F800000u) & special) | (bits & ~special) | (uint32_t(s[c] & 0x8000u) << 16);
    std::memcpy(row + c, &bits, 4);
  }
}

// Row n of expert e of weight w ([E, N, K]) decoded to f32 (fp8: code values, unscaled) into row.
// row_major rows are converted in one pass, other
// layouts element by element through the reference's index map.
void decode_row(const TensorView& w, int64_t e, int64_t n, float* row) {
  const int64_t N = w.shape[1], K = w.shape[2];
  if (w.layout != Layout::row_major) {
    ref::moe::load_weight_row(w, e, n, row);
    return;
  }
  const int64_t off = (e * N + n) * K;
  switch (w.dtype) {
    case DType::f32: std::copy_n(w.ptr<const float>() + off, K, row); return;
    case DType::bf16: {
      const uint16_t* s = w.ptr<const uint16_t>() + off;
      for (int64_t c = 0; c < K; ++c) row[c] = bf16_bits_to_f32(s[c]);
      return;
    }
    case DType::f16: decode_f16_row(w.ptr<const uint16_t>() + off, K, row); return;
    default: decode_fp8_row(w.ptr<const uint8_t>() + off, K, row); return;
  }
}

// Scale of one dot product of row n (of N rows, K columns) of expert e's weight w against an
// activation row with scales vs: fp8_row: s_x * row_scale, unquantized: 1. fp8_block is summed per
// block instead (block_dot).
float row_dot(const FusedMoeParams& p, const TensorView& ws, const float* wrow, const float* v, const float* vs,
              int64_t e, int64_t n, int64_t N, int64_t K) {
  if (p.scale_block_k > 0) {
    const int64_t bn = p.scale_block_n, bk = p.scale_block_k, kb = ceil_div(K, bk);
    const float* s = ws.ptr<const float>() + (e * ceil_div(N, bn) + n / bn) * kb;
    float acc = 0.0f;
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t c0 = b * bk;
      acc += dot(wrow + c0, v + c0, std::min(bk, K - c0)) * (vs[b] * s[b]);
    }
    return acc;
  }
  const float dv = dot(wrow, v, K);
  if (!is_fp8(p)) return dv;
  return dv * vs[0] * ref::moe::row_scale(ws, e, n, N);
}

// Quantizes v[0..n) to fp8 code values in place, per group of bk (bk = n: one group); scales to s.
void quantize_groups(float* v, int64_t n, int64_t bk, float* s) {
  for (int64_t g = 0; g * bk < n; ++g) {
    const int64_t c0 = g * bk;
    s[g] = ref::moe::quantize_row_fp8(v + c0, std::min(bk, n - c0), v + c0);
  }
}

// out[slot, n] = row_dot(w row n, v[slot]) for every entry of each active expert, n in [0, N):
// tasks = active experts x panels of kPanel rows. Stage 1 (w1, v = x rows per token, first: times
// the input-side router weight, out = h) and stage 2 (w2, v = a rows per slot, out = y).
void gemm_entries(const FusedMoeParams& p, const Scratch& s, const TensorView& w, const TensorView& ws, const float* v,
                  const float* vs, bool v_per_token, int64_t vs_stride, bool first, float* out) {
  const MoeDims d = moe_dims(p);
  const int64_t N = w.shape[1], K = w.shape[2];
  const int64_t np = ceil_div(N, kPanel);
  const float* tw = p.topk_weights.ptr<const float>();
  // Rows decoded at a time: as many as fit in ~32 KiB (L1), at least 1, at most the task's kPanel.
  const int64_t sub = std::clamp<int64_t>(kPanelBytes / (4 * K), 1, kPanel);
  parallel_for(s.n_active * np, [&](int64_t b, int64_t end) {
    std::vector<float> panel(static_cast<size_t>(sub * K));
    for (int64_t task = b; task < end; ++task) {
      const int32_t e = s.active[task / np];
      const int64_t n1 = std::min(N, (task % np + 1) * kPanel);
      for (int64_t n0 = (task % np) * kPanel; n0 < n1; n0 += sub) {
        const int64_t rows = std::min(sub, n1 - n0);
        for (int64_t r = 0; r < rows; ++r) decode_row(w, e, n0 + r, panel.data() + r * K);
        for (int32_t q = s.offset[e]; q < s.offset[e + 1]; ++q) {
          const int64_t slot = s.entry[q];
          const int64_t vrow = v_per_token ? slot / d.k : slot;
          const float win = first ? ref::moe::slot_weight(p, tw[slot]).in : 1.0f;
          for (int64_t r = 0; r < rows; ++r) {
            const float h = row_dot(p, ws, panel.data() + r * K, v + vrow * K, vs + vrow * vs_stride, e, n0 + r, N, K);
            out[slot * N + n0 + r] = h * win;
          }
        }
      }
    }
  });
}

Status run(const FusedMoeParams& p, const RunContext& ctx) {
  const MoeDims d = moe_dims(p);
  if (d.T == 0) return Status::Ok();
  Scratch s = carve(p, ctx.workspace);
  moe::group_entries(p, d, &s);  // stage 0a
  const bool fp8 = is_fp8(p);
  const int64_t gh = groups(p, d.H), gi = groups(p, d.I);
  const int64_t bkh = p.scale_block_k > 0 ? p.scale_block_k : d.H, bki = p.scale_block_k > 0 ? p.scale_block_k : d.I;
  // Stage 0b: x rows as f32, quantized for fp8 (in place: the amax is read first).
  parallel_for(d.T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* xr = s.x + t * d.H;
      ref::moe::load_x_row(p.x, t, xr);
      if (!fp8) continue;
      if (p.a1_scale.present() && p.scale_block_k == 0) {
        s.xs[t] = p.a1_scale.ptr<const float>()[0];
        ref::moe::quantize_row_fp8_static(xr, d.H, s.xs[t], xr);
      } else {
        quantize_groups(xr, d.H, bkh, s.xs + t * gh);
      }
    }
  });
  gemm_entries(p, s, p.w1, p.w1_scale, s.x, s.xs, true, gh, true, s.h);  // stage 1
  // Stage 1b: a = act(g) * u, then rounded or re-quantized per slot / group.
  parallel_for(d.T * d.k, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      if (!s.valid[q]) continue;
      float* a = s.a + q * d.I;
      ref::moe::act_and_mul(p.activation, d.g1u1, s.h + q * d.N1, d.I, a);
      if (fp8) {
        quantize_groups(a, d.I, bki, s.as + q * gi);
      } else if (p.round_intermediate) {
        for (int64_t i = 0; i < d.I; ++i) a[i] = round_to(p.x.dtype, a[i]);
      }
    }
  });
  gemm_entries(p, s, p.w2, p.w2_scale, s.a, s.as, false, gi, false, s.y);  // stage 2
  moe::combine_slots(p, d, s, s.y);                                        // stage 3
  return Status::Ok();
}

}  // namespace

void register_fused_moe_cpu_generic(Registry& r) {
  const auto sup = erase_supports<FusedMoeParams, supports>;
  const auto ws = erase_workspace<FusedMoeParams, workspace_bytes>;
  const auto go = erase_run<FusedMoeParams, run>;
  r.add({"fused_moe_cpu_generic", OpKind::fused_moe, MoeVariant::unquantized, Backend::cpu,
         "portable C++: x/w bf16|f16|f32 any layout, f32 accumulate, a optionally rounded to x dtype", 20, sup, ws,
         go});
  r.add({"fused_moe_cpu_generic_fp8_row", OpKind::fused_moe, MoeVariant::fp8_row, Backend::cpu,
         "portable C++: w fp8_e4m3fn per-row/per-tensor scales, dynamic or static fp8 activations, f32 accumulate", 20,
         sup, ws, go});
  r.add({"fused_moe_cpu_generic_fp8_row_tkw1", OpKind::fused_moe, MoeVariant::fp8_row_tkw1, Backend::cpu,
         "as fused_moe_cpu_generic_fp8_row, k == 1, router weight on the expert input", 20, sup, ws, go});
  r.add({"fused_moe_cpu_generic_fp8_block", OpKind::fused_moe, MoeVariant::fp8_block, Backend::cpu,
         "portable C++: w fp8_e4m3fn bn x bk block scales, 1 x bk dynamic fp8 activation groups, f32 accumulate", 20,
         sup, ws, go});
}

}  // namespace moekit::cpu
