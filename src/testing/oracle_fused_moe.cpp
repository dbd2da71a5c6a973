// float64 dense oracle, problem generator and tolerance judge of fused_moe
// (src/testing/oracle_fused_moe.h; tolerances: docs/tolerances.md). Used by
// tests/test_fused_moe.cpp, tests/test_fused_moe_fp8.cpp and src/testing/check_fused_moe.cpp.
#include "testing/oracle_fused_moe.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>

#include "moekit/ops/layout.h"
#include "moekit/ops/quant.h"

namespace moekit::testing {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------- generator helpers
// Counter-based hash so that a weight depends only on (seed, stream, index): cheap enough for the
// full-size presets and independent of how many tokens a problem has.
uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1) from 64 random bits.
float to_uniform(uint64_t h) { return float(double(h >> 11) * (2.0 / 9007199254740992.0) - 1.0); }
// Key of item i of a stream: a seed for splitmix64(key + j) sequences.
uint64_t hash_key(uint64_t seed, uint64_t stream, uint64_t i) {
  return splitmix64(seed * 0x632BE59BD9B4E019ull ^ splitmix64(stream * 0x100000001B3ull + i));
}
float hash_uniform(uint64_t seed, uint64_t stream, uint64_t i) { return to_uniform(hash_key(seed, stream, i)); }

// Static per-tensor activation scale from an amax (same formula as SPEC 5).
float fp8_scale_for(float amax) { return std::max(amax, kFp8AmaxFloor) / kFp8E4m3fnMax; }

// Element offset of (n, c) inside one [N, K] matrix of the given layout.
int64_t matrix_offset(Layout l, int64_t n, int64_t c, int64_t K, int elem_bytes) {
  return l == Layout::row_major ? n * K + c : shuffle_index(n, c, K, elem_bytes);
}

// Fills expert e of weight buffer `w` [E, N, K] (and its scale buffer for fp8 schemes) with the
// generated values of matrix `stream` (1 = w1, 2 = w2).
void fill_expert(Buffer& w, Buffer& scale, Scheme scheme, int bn_size, int bk_size, uint64_t seed, uint64_t stream,
                 int64_t e) {
  const int64_t N = w.view.shape[1], K = w.view.shape[2];
  const float sigma = 1.0f / std::sqrt(float(K));
  const float expert_factor = 1.0f + 0.5f * hash_uniform(seed, stream * 1000 + 1, uint64_t(e));
  std::vector<float> v(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    const float row_factor = 1.0f + 0.5f * hash_uniform(seed, stream * 1000 + 2, uint64_t(e * N + n));
    const float amp = std::sqrt(3.0f) * sigma * expert_factor * row_factor;  // U(-amp, amp) has std sigma*f
    const uint64_t key = hash_key(seed, stream, uint64_t(e * N + n));
    for (int64_t c = 0; c < K; ++c) v[size_t(n * K + c)] = amp * to_uniform(splitmix64(key + uint64_t(c)));
  }
  const DType dt = w.view.dtype;
  const Layout lay = w.view.layout;
  const int eb = dtype_size(dt);
  const int64_t base = e * N * K;
  if (!is_fp8(dt)) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < K; ++c) w.set(base + matrix_offset(lay, n, c, K, eb), v[size_t(n * K + c)]);
    }
    return;
  }
  // NOTE: the weights are quantized by the library's own quantize_fp8 op (SPEC 5), so generated
  // fp8 checkpoints follow exactly the recipe its tests pin down.
  const int64_t nb = ceil_div(N, bn_size), kb = ceil_div(K, bk_size);
  QuantizeFp8Params q;
  q.in = TensorView::contiguous(v.data(), DType::f32, {N, K});
  std::vector<uint8_t> codes(static_cast<size_t>(N * K));
  q.out = TensorView::contiguous(codes.data(), DType::fp8_e4m3fn, {N, K});
  float* s = scale.data<float>();
  if (scheme == Scheme::fp8_tensor) {
    q.granularity = QuantGranularity::per_tensor;
    q.scale = TensorView::contiguous(s + e, DType::f32, {1});
  } else if (scheme == Scheme::fp8_channel) {
    q.granularity = QuantGranularity::per_row;
    q.scale = TensorView::contiguous(s + e * N, DType::f32, {N});
  } else {
    q.granularity = QuantGranularity::block;
    q.block_n = bn_size;
    q.group_k = bk_size;
    q.scale = TensorView::contiguous(s + e * nb * kb, DType::f32, {nb, kb});
  }
  const Status st = quantize_fp8(q);
  if (!st.ok()) std::abort();  // generator bug: the shapes above are valid by construction
  auto* dst = w.data<uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < K; ++c) dst[base + matrix_offset(lay, n, c, K, eb)] = codes[size_t(n * K + c)];
  }
}

// Softmax top-k of one logit row (ties to the lower id), renormalized if asked, times rsf.
void route_softmax(const std::vector<float>& logits, int64_t k, bool renormalize, float rsf, int32_t* ids,
                   float* weights) {
  const int64_t n = int64_t(logits.size());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += (p[size_t(e)] = std::exp(double(logits[size_t(e)] - mx)));
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  double picked = 0;
  for (int64_t j = 0; j < k; ++j) picked += p[size_t(order[size_t(j)])] / sum;
  for (int64_t j = 0; j < k; ++j) {
    double w = p[size_t(order[size_t(j)])] / sum;
    if (renormalize && picked > 0) w /= picked;
    ids[j] = order[size_t(j)];
    weights[j] = float(w * rsf);
  }
}

// Local expert of a global id from the mask / map buffers (-1 = remote).
std::vector<int64_t> local_table(const FusedMoeParams& p, int64_t Eg) {
  std::vector<int64_t> local(static_cast<size_t>(Eg));
  for (int64_t g = 0; g < Eg; ++g) {
    if (p.expert_mask.present()) {
      const int32_t* m = p.expert_mask.ptr<const int32_t>();
      int64_t before = 0;  // NOTE: counted directly (quadratic), not the ref's running cumsum
      for (int64_t q = 0; q < g; ++q) before += m[q];
      local[size_t(g)] = m[g] ? before : -1;
    } else if (p.expert_map.present()) {
      local[size_t(g)] = p.expert_map.ptr<const int32_t>()[g];
    } else {
      local[size_t(g)] = g;
    }
  }
  return local;
}

}  // namespace

// ---------------------------------------------------------------- MoeProblem
FusedMoeParams MoeProblem::params() {
  FusedMoeParams p;
  const int64_t H = shape.H;
  p.x = x.view;
  p.x.shape[1] = H;
  p.out = out.view;
  p.out.shape[1] = H;
  p.w1 = w1.view;
  p.w2 = w2.view;
  p.topk_ids = topk_ids.view;
  p.topk_weights = topk_weights.view;
  if (is_fp8(w1.view.dtype)) {
    p.w1_scale = w1_scale.view;
    p.w2_scale = w2_scale.view;
    if (opts.static_a1_scale && shape.scheme != Scheme::fp8_block) p.a1_scale = a1_scale.view;
  }
  if (opts.ep == ExpertParallel::mask) p.expert_mask = expert_mask.view;
  if (opts.ep == ExpertParallel::map) p.expert_map = expert_map.view;
  p.activation = shape.activation;
  p.weight_on_input = shape.weight_on_input;
  if (shape.scheme == Scheme::fp8_block) {
    p.scale_block_n = opts.block;
    p.scale_block_k = opts.block_k > 0 ? opts.block_k : opts.block;
  }
  p.round_intermediate = opts.round_intermediate;
  return p;
}

void update_touched(MoeProblem* p) {
  FusedMoeParams prm = p->params();
  const std::vector<int64_t> local = local_table(prm, p->shape.E);
  p->touched.assign(size_t(p->E), false);
  const int32_t* ids = p->topk_ids.data<int32_t>();
  for (int64_t i = 0; i < p->topk_ids.numel(); ++i) {
    if (ids[i] >= 0 && ids[i] < p->shape.E && local[size_t(ids[i])] >= 0) p->touched[size_t(local[size_t(ids[i])])] = true;
  }
  p->filled.resize(size_t(p->E), false);
  std::vector<int64_t> todo;
  for (int64_t e = 0; e < p->E; ++e) {
    if (p->touched[size_t(e)] && !p->filled[size_t(e)]) todo.push_back(e);
  }
  // NOTE: experts are filled on several threads (full-size presets generate up to 11 G weights);
  // each expert's values depend only on (seed, e), and every thread writes its own experts' rows
  // and scales, so the result does not depend on the thread count.
  const int bk = p->opts.block_k > 0 ? p->opts.block_k : p->opts.block;
  const size_t nt = std::min<size_t>(todo.size(), std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  auto work = [&](size_t first) {
    for (size_t i = first; i < todo.size(); i += nt) {
      fill_expert(p->w1, p->w1_scale, p->shape.scheme, p->opts.block, bk, p->seed, 1, todo[i]);
      fill_expert(p->w2, p->w2_scale, p->shape.scheme, p->opts.block, bk, p->seed, 2, todo[i]);
    }
  };
  if (todo.size() < 4) {
    for (size_t t = 0; t < nt; ++t) work(t);
  } else {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < nt; ++t) threads.emplace_back(work, t);
    for (std::thread& th : threads) th.join();
  }
  for (int64_t e : todo) p->filled[size_t(e)] = true;
}

Status make_moe_problem(const MoeShape& s, const MoeProblemOptions& o, uint64_t seed, MoeProblem* out) {
  const int64_t Eg = s.E, T = s.T, H = s.H, I = s.I, k = s.k;
  const int64_t E = o.local_experts > 0 ? o.local_experts : Eg;
  if (E > Eg) return InvalidArgument("local_experts: must be <= experts = ", Eg, ", got ", E);
  if (E < Eg && o.ep == ExpertParallel::none) {
    return InvalidArgument("local_experts: ", E, " < ", Eg, " needs an expert_mask or expert_map");
  }
  if (s.weight_on_input && k != 1) return InvalidArgument("weight_on_input: needs k == 1, got ", k);
  if (k < 1 || k > Eg) return InvalidArgument("k: must be in [1, ", Eg, "], got ", k);
  const bool fp8 = s.scheme == Scheme::fp8_tensor || s.scheme == Scheme::fp8_channel || s.scheme == Scheme::fp8_block;
  const DType xd = s.scheme == Scheme::f16 ? DType::f16 : (s.scheme == Scheme::f32 ? DType::f32 : DType::bf16);
  const DType wd = fp8 ? DType::fp8_e4m3fn : xd;
  const int64_t N1 = o.g1u1 ? 2 * I : I;
  if (o.shuffled && (N1 % 16 || H % 32 || H % 16 || I % 32)) {
    return InvalidArgument("shuffled: needs 2I/I and H multiples of 16 and H, I multiples of 32, got H=", H, " I=", I);
  }

  MoeProblem p;
  p.shape = s;
  p.opts = o;
  p.E = E;
  p.N1 = N1;
  p.x_dtype = xd;
  Rng rng(seed);

  // x and out: [T, H + row_pad] buffers, viewed as [T, H] with the wider row stride.
  p.x = Buffer(xd, {T, H + o.row_pad});
  p.out = Buffer(xd, {T, H + o.row_pad});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c) p.x.set(t * (H + o.row_pad) + c, rng.normal(0.0f, 1.0f));
  }

  // Local experts: a random subset of the Eg global ones when E < Eg (mask and the equivalent map).
  p.expert_mask = Buffer(DType::i32, {Eg});
  p.expert_map = Buffer(DType::i32, {Eg});
  {
    std::vector<int64_t> perm(static_cast<size_t>(Eg));
    std::iota(perm.begin(), perm.end(), 0);
    if (E < Eg) std::shuffle(perm.begin(), perm.end(), rng.gen);
    int32_t* mask = p.expert_mask.data<int32_t>();
    int32_t* map = p.expert_map.data<int32_t>();
    for (int64_t i = 0; i < Eg; ++i) mask[i] = 0;
    for (int64_t i = 0; i < E; ++i) mask[perm[size_t(i)]] = 1;
    int32_t next = 0;
    for (int64_t g = 0; g < Eg; ++g) map[g] = mask[g] ? next++ : -1;
  }

  // Routing over the Eg global experts.
  p.topk_ids = Buffer(DType::i32, {T, k});
  p.topk_weights = Buffer(DType::f32, {T, k});
  std::vector<float> logits(static_cast<size_t>(Eg));
  for (int64_t t = 0; t < T; ++t) {
    for (float& l : logits) l = rng.normal(0.0f, 1.0f);
    int32_t* ids = p.topk_ids.data<int32_t>() + t * k;
    float* w = p.topk_weights.data<float>() + t * k;
    if (s.weight_on_input) {
      const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
      ids[0] = int32_t(best);
      w[0] = 1.0f / (1.0f + std::exp(-logits[size_t(best)]));
    } else {
      route_softmax(logits, k, s.renormalize, s.rsf, ids, w);
    }
  }

  // Weights (and scales): only experts some token uses get values.
  p.w1 = Buffer(wd, {E, N1, H});
  p.w2 = Buffer(wd, {E, H, I});
  const Layout lay = o.shuffled ? Layout::shuffled_16x16 : Layout::row_major;
  p.w1.view.layout = p.w2.view.layout = lay;
  if (fp8) {
    if (s.scheme == Scheme::fp8_tensor) {
      p.w1_scale = Buffer(DType::f32, {E});
      p.w2_scale = Buffer(DType::f32, {E});
    } else if (s.scheme == Scheme::fp8_channel) {
      p.w1_scale = Buffer(DType::f32, {E, N1, 1});
      p.w2_scale = Buffer(DType::f32, {E, H, 1});
    } else {
      const int bk = o.block_k > 0 ? o.block_k : o.block;
      p.w1_scale = Buffer(DType::f32, {E, ceil_div(N1, o.block), ceil_div(H, bk)});
      p.w2_scale = Buffer(DType::f32, {E, ceil_div(H, o.block), ceil_div(I, bk)});
    }
    for (Buffer* b : {&p.w1_scale, &p.w2_scale}) {
      for (int64_t i = 0; i < b->numel(); ++i) b->set(i, 1.0f);
    }
    // Static activation scale: amax of the whole x over 448 (a calibrated per-tensor scale).
    p.a1_scale = Buffer(DType::f32, {1});
    float amax = 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < H; ++c) amax = std::max(amax, std::fabs(p.x.get(t * (H + o.row_pad) + c)));
    }
    p.a1_scale.set(0, fp8_scale_for(amax));
  }
  p.seed = seed;
  update_touched(&p);
  *out = std::move(p);
  return Status::Ok();
}

// ---------------------------------------------------------------- oracle
namespace {

double act64(Activation a, double z) {
  switch (a) {
    case Activation::silu: return z / (1.0 + std::exp(-z));
    case Activation::gelu: return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    case Activation::gelu_tanh: {
      const double c = std::sqrt(2.0 / 3.14159265358979323846);
      return 0.5 * z * (1.0 + std::tanh(c * (z + 0.044715 * z * z * z)));
    }
  }
  return z;
}

// Dequantized expert e of weight w [E, N, K] with its scale (absent = unquantized) into m[N*K].
void dequantize_expert(const TensorView& w, const TensorView& scale, int bn, int bk, int64_t e,
                       std::vector<double>& m) {
  const int64_t N = w.shape[1], K = w.shape[2];
  const int eb = dtype_size(w.dtype);
  m.assign(static_cast<size_t>(N * K), 0.0);
  const float* s = scale.present() ? scale.ptr<const float>() : nullptr;
  const int64_t nb = bn > 0 ? ceil_div(N, bn) : 0, kb = bk > 0 ? ceil_div(K, bk) : 0;
  const int64_t run = bk > 0 ? bk : K;  // columns sharing one scale
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c0 = 0; c0 < K; c0 += run) {
      double sc = 1.0;
      if (s != nullptr) {
        if (bn > 0) sc = s[(e * nb + n / bn) * kb + c0 / bk];
        else sc = scale.ndim == 1 ? s[e] : s[e * N + n];
      }
      for (int64_t c = c0; c < std::min(K, c0 + run); ++c) {
        const double v = load_as_f32(w.data, w.dtype, e * N * K + matrix_offset(w.layout, n, c, K, eb));
        m[size_t(n * K + c)] = v * sc;
      }
    }
  }
}

// Quantize-dequantize v[0..n) through e4m3fn in groups of `group` (dynamic scale per group,
// max(amax, floor) / 448 in float64) or with one static scale when static_s > 0.
void fake_quant_fp8(double* v, int64_t n, int64_t group, double static_s) {
  for (int64_t c0 = 0; c0 < n; c0 += group) {
    const int64_t c1 = std::min(n, c0 + group);
    double s = static_s;
    if (s <= 0) {
      double amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[c]));
      s = std::max(amax, double(kFp8AmaxFloor)) / double(kFp8E4m3fnMax);
    }
    for (int64_t c = c0; c < c1; ++c) v[c] = double(round_to(DType::fp8_e4m3fn, float(v[c] / s))) * s;
  }
}

}  // namespace

std::vector<double> oracle_fused_moe(const FusedMoeParams& p, const OracleOptions& o) {
  const MoeDims d = moe_dims(p);
  const bool on_input = p.weight_on_input;
  const bool quantized = is_fp8(p.w1.dtype);
  const bool emulate = quantized && o.emulate_fp8_activations;
  // Emulation: activation groups along H / I (whole rows for the row variants), static x scale.
  const int64_t gx = p.scale_block_k > 0 ? p.scale_block_k : std::max<int64_t>(d.H, 1);
  const int64_t ga = p.scale_block_k > 0 ? p.scale_block_k : std::max<int64_t>(d.I, 1);
  const double static_s = p.a1_scale.present() ? double(p.a1_scale.ptr<const float>()[0]) : 0.0;
  // NOTE: emulation applies weight_on_input to h (the documented kernel order: x is quantized
  // unscaled); the plain oracle scales x first (SPEC 6.4), the linear-algebra equivalent.
  const bool scale_x = on_input && !emulate;
  std::vector<double> y(static_cast<size_t>(d.T * d.H), 0.0);

  // Routing matrix R [T, E].
  const std::vector<int64_t> local = local_table(p, d.Eg);
  std::vector<double> R(static_cast<size_t>(d.T * d.E), 0.0);
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  const float* wts = p.topk_weights.ptr<const float>();
  for (int64_t t = 0; t < d.T; ++t) {
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t id = ids[t * d.k + j];
      if (id < 0 || local[size_t(id)] < 0) continue;
      R[size_t(t * d.E + local[size_t(id)])] += double(wts[t * d.k + j]);
    }
  }

  std::vector<double> W1, W2, xin(static_cast<size_t>(d.H)), h(static_cast<size_t>(d.N1)), a(static_cast<size_t>(d.I));
  for (int64_t e = 0; e < d.E; ++e) {
    bool used = false;
    for (int64_t t = 0; t < d.T && !used; ++t) used = R[size_t(t * d.E + e)] != 0.0;
    if (!used) continue;
    dequantize_expert(p.w1, p.w1_scale, p.scale_block_n, p.scale_block_k, e, W1);
    dequantize_expert(p.w2, p.w2_scale, p.scale_block_n, p.scale_block_k, e, W2);
    for (int64_t t = 0; t < d.T; ++t) {
      const double r = R[size_t(t * d.E + e)];
      if (r == 0.0) continue;
      for (int64_t c = 0; c < d.H; ++c) {
        const double xv = load_as_f32(p.x.data, p.x.dtype, t * p.x.stride[0] + c);
        xin[size_t(c)] = scale_x ? r * xv : xv;  // SPEC 6.4 form: x scaled by w first
      }
      if (emulate) fake_quant_fp8(xin.data(), d.H, gx, static_s);
      for (int64_t n = 0; n < d.N1; ++n) {
        double acc = 0;
        for (int64_t c = 0; c < d.H; ++c) acc += W1[size_t(n * d.H + c)] * xin[size_t(c)];
        h[size_t(n)] = on_input && emulate ? r * acc : acc;
      }
      for (int64_t i = 0; i < d.I; ++i) {
        const double g = act64(p.activation, h[size_t(i)]);
        double v = d.g1u1 ? g * h[size_t(d.I + i)] : g;
        if (!quantized && p.round_intermediate) v = round_to(p.x.dtype, float(v));
        a[size_t(i)] = v;
      }
      if (emulate) fake_quant_fp8(a.data(), d.I, ga, 0.0);
      const double out_w = on_input ? 1.0 : r;
      for (int64_t c = 0; c < d.H; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < d.I; ++i) acc += W2[size_t(c * d.I + i)] * a[size_t(i)];
        y[size_t(t * d.H + c)] += out_w * acc;
      }
    }
  }
  return y;
}

// ---------------------------------------------------------------- tolerances
const MoeTolerance& moe_tolerance(MoeVariant v, DType x_dtype, MoeCompare c) {
  const bool fp8 = v != MoeVariant::unquantized;
  for (const MoeTolerance& t : kMoeTolerances) {
    if (t.variant == v && t.compare == c && (fp8 || t.x_dtype == x_dtype)) return t;
  }
  return kMoeTolerances[0];  // unreachable for valid (variant, dtype): the table is complete
}

bool judge_moe(const std::vector<double>& actual, const std::vector<double>& expected, int64_t T, int64_t H,
               const MoeTolerance& tol, Metrics* m, std::string* detail) {
  double ss = 0;
  for (double e : expected) ss += e * e;
  const double rms = expected.empty() ? 0.0 : std::sqrt(ss / double(expected.size()));
  const bool elementwise = tol.rtol > 0;
  const double atol = tol.atol_rms * rms;
  *m = compare_close(actual, expected, elementwise ? atol : INFINITY, elementwise ? tol.rtol : 0.0, {T, H});
  std::ostringstream os;
  const int64_t allowed = int64_t(tol.max_bad * double(m->count));
  if (elementwise) {
    os << "|err| <= " << tol.atol_rms << "*rms(" << rms << ") + " << tol.rtol << "*|ref|";
    if (tol.max_bad > 0) os << " for all but " << allowed << " of " << m->count << " elements";
    os << " (" << m->mismatches << " outside), ";
  }
  os << "cos >= " << tol.min_cosine << ", rms ratio in [" << tol.rms_lo << ", " << tol.rms_hi << "]; got cos "
     << m->cosine << ", rms ratio " << m->rms_ratio << ", max abs err " << m->max_abs_err;
  bool ok = true;
  std::string why;
  if (!m->finite) ok = false, why += " non-finite output;";
  if (elementwise && m->mismatches > allowed) {
    ok = false;
    why += " " + std::to_string(m->mismatches) + " elements out of bound, worst " + m->worst + ";";
  }
  if (!(m->cosine >= tol.min_cosine)) ok = false, why += " cosine too low;";
  if (!(m->rms_ratio >= tol.rms_lo && m->rms_ratio <= tol.rms_hi)) ok = false, why += " rms ratio out of range;";
  *detail = ok ? os.str() : "FAIL:" + why + " (" + os.str() + ")";
  return ok;
}

bool run_against_oracle(MoeProblem& prob, const RunOptions& opts, std::string* detail) {
  FusedMoeParams p = prob.params();
  const Status st = fused_moe(p, opts);
  if (!st.ok()) {
    *detail = "fused_moe failed: " + st.to_string();
    return false;
  }
  const MoeVariant v = fused_moe_variant(p);
  const std::vector<double> actual = read_out(p.out);
  const int64_t T = prob.shape.T, H = prob.shape.H;
  Metrics m;
  bool ok = judge_moe(actual, oracle_fused_moe(p), T, H, moe_tolerance(v, prob.x_dtype, MoeCompare::ref_vs_oracle), &m,
                      detail);
  if (v != MoeVariant::unquantized) {
    OracleOptions emu;
    emu.emulate_fp8_activations = true;
    std::string d2;
    ok = judge_moe(actual, oracle_fused_moe(p, emu), T, H,
                   moe_tolerance(v, prob.x_dtype, MoeCompare::ref_vs_emulation), &m, &d2) && ok;
    *detail = "oracle: " + *detail + "; emulated-quant oracle: " + d2;
  }
  return ok;
}

std::vector<double> read_out(const TensorView& out) {
  const int64_t T = out.shape[0], H = out.shape[1];
  std::vector<double> v(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c) v[size_t(t * H + c)] = load_as_f32(out.data, out.dtype, t * out.stride[0] + c);
  }
  return v;
}

}  // namespace moekit::testing
