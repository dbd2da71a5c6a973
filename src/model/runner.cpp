// The model runner (include/moekit/model/runner.h): loading a bundled model (a transformers
// checkpoint), the f32 decoder around moekit's routing and fused_moe ops -- grouped-query attention
// (mixtral, llama4_text) or Multi-head Latent Attention (deepseek_v3) -- teacher-forced logits and
// batched greedy decoding.
// Tests: tests/test_model_runner.cpp.
#include "moekit/model/runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <unordered_map>

#include "moekit/core/dtype.h"
#include "moekit/model/safetensors.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/ops/quant.h"
#include "moekit/ops/routing.h"
#include "cpu/thread_pool.h"
#include "model/model_io.h"

namespace moekit::model {

const char* model_scheme_name(ModelScheme s) {
  switch (s) {
    case ModelScheme::f32: return "f32";
    case ModelScheme::bf16: return "bf16";
    case ModelScheme::fp8_tensor: return "fp8_tensor";
    case ModelScheme::fp8_channel: return "fp8_channel";
    case ModelScheme::fp8_block: return "fp8_block";
  }
  return "?";
}

bool parse_model_scheme(const std::string& s, ModelScheme* out) {
  for (ModelScheme m : {ModelScheme::f32, ModelScheme::bf16, ModelScheme::fp8_tensor, ModelScheme::fp8_channel,
                        ModelScheme::fp8_block}) {
    if (s == model_scheme_name(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

namespace {

constexpr int kBlock = 128;  // fp8_block: 128 x 128 weight blocks, 1 x 128 activation groups

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// f32 values of a checkpoint tensor with exactly the expected shape (bf16 / f16 / f32 on disk).
Status load_f32(const SafetensorsFile& f, const std::string& name, const std::vector<int64_t>& shape,
                std::vector<float>* out) {
  const SafetensorsTensor* t = f.find(name);
  if (t == nullptr) return InvalidArgument("model.safetensors: missing tensor '", name, "'");
  if (t->shape != shape) {
    return InvalidArgument("model.safetensors: '", name, "' has shape ", shape_str(t->shape), ", want ",
                           shape_str(shape));
  }
  TensorView v;
  MOEKIT_RETURN_IF_ERROR(f.view(*t, &v));
  if (v.dtype != DType::bf16 && v.dtype != DType::f16 && v.dtype != DType::f32) {
    return InvalidArgument("model.safetensors: '", name, "' has dtype ", t->dtype, " (want BF16, F16 or F32)");
  }
  const int64_t n = v.numel();
  out->resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) (*out)[size_t(i)] = load_as_f32(v.data, v.dtype, i);
  return Status::Ok();
}

// y[n] = sum_h w[n, h] x[h] for n < N (w row-major [N, H]); 16 partial sums (vectorisable, fixed order).
void matvec(const float* w, const float* x, int N, int H, float* y) {
  for (int n = 0; n < N; ++n) {
    const float* r = w + int64_t(n) * H;
    float acc[16] = {};
    int h = 0;
    for (; h + 16 <= H; h += 16) {
      for (int j = 0; j < 16; ++j) acc[j] += r[h + j] * x[h + j];
    }
    float s = 0.0f;
    for (int j = 0; j < 16; ++j) s += acc[j];
    for (; h < H; ++h) s += r[h] * x[h];
    y[n] = s;
  }
}

// y = w * x / rms(x) (y may be x).
void rmsnorm(const float* x, const float* w, int H, float eps, float* y) {
  double ss = 0.0;
  for (int h = 0; h < H; ++h) ss += double(x[h]) * x[h];
  const float r = 1.0f / std::sqrt(float(ss / H) + eps);
  for (int h = 0; h < H; ++h) y[h] = w[h] * (x[h] * r);
}

// RoPE on v[0, d) at position pos: pair i -- (2i, 2i+1) when interleaved, else (i, i + d/2) -- rotated
// by the angle pos * inv_freq[i].
void rope(float* v, int d, int pos, const float* inv_freq, bool interleaved) {
  for (int i = 0; i < d / 2; ++i) {
    const float a = float(pos) * inv_freq[i], c = std::cos(a), sn = std::sin(a);
    float* x1 = interleaved ? v + 2 * i : v + i;
    float* x2 = interleaved ? v + 2 * i + 1 : v + i + d / 2;
    const float a1 = *x1, a2 = *x2;
    *x1 = a1 * c - a2 * sn;
    *x2 = a2 * c + a1 * sn;
  }
}

// One query token against n cached positions: o[h] (dv) = sum_j softmax_j(q[h] . k_j[g] * scale) v_j[g]
// for each of `heads` heads, g = h / rep its key/value head. q [heads * dk]; k [n][heads / rep * dk];
// v [n][heads / rep * dv]; o [heads * dv].
void attend(const float* q, const float* k, const float* v, int n, int heads, int rep, int dk, int dv, float scale,
            float* o) {
  const int64_t ks = int64_t(heads / rep) * dk, vs = int64_t(heads / rep) * dv;
  std::vector<float> p(static_cast<size_t>(n));
  for (int h = 0; h < heads; ++h) {
    const int g = h / rep;
    const float* qh = q + int64_t(h) * dk;
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
      const float* kj = k + j * ks + int64_t(g) * dk;
      float d = 0.0f;
      for (int i = 0; i < dk; ++i) d += qh[i] * kj[i];
      p[size_t(j)] = d * scale;
      mx = std::max(mx, p[size_t(j)]);
    }
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
    float* oh = o + int64_t(h) * dv;
    std::fill(oh, oh + dv, 0.0f);
    for (int j = 0; j < n; ++j) {
      const float* vj = v + j * vs + int64_t(g) * dv;
      const float pj = p[size_t(j)] / sum;
      for (int i = 0; i < dv; ++i) oh[i] += pj * vj[i];
    }
  }
}

// The highest-priority kernel of backend b that accepts params, or nullptr.
const Kernel* pick_kernel(OpKind op, MoeVariant v, Backend b, const void* params) {
  const Kernel* best = nullptr;
  for (const Kernel* k : registry().candidates(op, v)) {
    if (k->backend != b || !k->supports(params).ok()) continue;
    if (best == nullptr || k->priority > best->priority) best = k;
  }
  // A CPU without AVX-512 has no cpu routing kernels: the reference runs on the same host data
  // (routing is a small part of a layer; fused_moe has portable cpu kernels).
  if (best == nullptr && b == Backend::cpu) return pick_kernel(op, v, Backend::ref, params);
  return best;
}

// A device allocation of the cuda backend (DeviceOps), grown on demand; freed with its owner.
struct DevBuf {
  const DeviceOps* ops = nullptr;
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p != nullptr) ops->free(p);
  }
  Status ensure(const DeviceOps* o, size_t n) {
    if (n <= bytes && p != nullptr) return Status::Ok();
    if (p != nullptr) ops->free(p);
    ops = o, p = nullptr, bytes = 0;
    MOEKIT_RETURN_IF_ERROR(o->alloc(std::max<size_t>(n, 256), &p));
    bytes = std::max<size_t>(n, 256);
    return Status::Ok();
  }
  Status upload(const DeviceOps* o, const void* src, size_t n) {
    MOEKIT_RETURN_IF_ERROR(ensure(o, n));
    return n ? o->copy_to_device(p, src, n) : Status::Ok();
  }
};

// Stacked expert weights as fused_moe takes them, in the scheme's dtype (and their device copies
// when the backend is cuda).
struct Experts {
  int E = 0, N1 = 0, H = 0, I = 0;
  DType dtype = DType::bf16;
  std::vector<uint8_t> w1, w2;              // [E, N1, H], [E, H, I]
  std::vector<float> s1, s2;                // fp8 scales
  std::vector<int64_t> s1_shape, s2_shape;
  bool block = false;
  std::unique_ptr<DevBuf> d_w1, d_w2, d_s1, d_s2;

  Status upload(const DeviceOps* o) {
    for (auto [dst, src, n] : {std::make_tuple(&d_w1, static_cast<const void*>(w1.data()), w1.size()),
                               std::make_tuple(&d_w2, static_cast<const void*>(w2.data()), w2.size()),
                               std::make_tuple(&d_s1, static_cast<const void*>(s1.data()), s1.size() * 4),
                               std::make_tuple(&d_s2, static_cast<const void*>(s2.data()), s2.size() * 4)}) {
      *dst = std::make_unique<DevBuf>();
      MOEKIT_RETURN_IF_ERROR((*dst)->upload(o, src, n));
    }
    return Status::Ok();
  }
};

Status quantize_into(const std::vector<float>& w, std::vector<int64_t> shape, ModelScheme s, std::vector<uint8_t>* q,
                     std::vector<float>* scale, std::vector<int64_t>* scale_shape) {
  const int64_t E = shape[0], N = shape[1], K = shape[2];
  q->assign(size_t(E * N * K), 0);
  QuantizeFp8Params p;
  if (s == ModelScheme::fp8_tensor) {  // one scale per expert: per_tensor on each [N, K]
    scale->assign(size_t(E), 0.0f);
    *scale_shape = {E};
    for (int64_t e = 0; e < E; ++e) {
      p.in = TensorView::contiguous(const_cast<float*>(w.data()) + e * N * K, DType::f32, {N, K});
      p.out = TensorView::contiguous(q->data() + e * N * K, DType::fp8_e4m3fn, {N, K});
      p.scale = TensorView::contiguous(scale->data() + e, DType::f32, {1});
      p.granularity = QuantGranularity::per_tensor;
      MOEKIT_RETURN_IF_ERROR(quantize_fp8(p));
    }
    return Status::Ok();
  }
  p.in = TensorView::contiguous(const_cast<float*>(w.data()), DType::f32, {E, N, K});
  p.out = TensorView::contiguous(q->data(), DType::fp8_e4m3fn, {E, N, K});
  if (s == ModelScheme::fp8_channel) {
    *scale_shape = {E, N, 1};
    p.granularity = QuantGranularity::per_row;
  } else {
    *scale_shape = {E, (N + kBlock - 1) / kBlock, (K + kBlock - 1) / kBlock};
    p.granularity = QuantGranularity::block;
    p.block_n = kBlock;
    p.group_k = kBlock;
  }
  scale->assign(size_t((*scale_shape)[0] * (*scale_shape)[1] * (*scale_shape)[2]), 0.0f);
  p.scale = TensorView::contiguous(scale->data(), DType::f32, int((*scale_shape).size()), scale_shape->data());
  return quantize_fp8(p);
}

// w1f [E, N1, H] and w2f [E, H, I] (f32 values of the checkpoint) -> the scheme's experts.
Status make_experts(const std::vector<float>& w1f, const std::vector<float>& w2f, int E, int N1, int H, int I,
                    ModelScheme s, Experts* ex) {
  ex->E = E, ex->N1 = N1, ex->H = H, ex->I = I;
  if (s == ModelScheme::f32 || s == ModelScheme::bf16) {
    ex->dtype = s == ModelScheme::f32 ? DType::f32 : DType::bf16;
    const int eb = s == ModelScheme::f32 ? 4 : 2;
    for (auto [src, dst] : {std::make_pair(&w1f, &ex->w1), std::make_pair(&w2f, &ex->w2)}) {
      dst->resize(src->size() * size_t(eb));
      for (size_t i = 0; i < src->size(); ++i) store_from_f32(dst->data(), ex->dtype, int64_t(i), (*src)[i]);
    }
    return Status::Ok();
  }
  ex->dtype = DType::fp8_e4m3fn;
  ex->block = s == ModelScheme::fp8_block;
  MOEKIT_RETURN_IF_ERROR(quantize_into(w1f, {E, N1, H}, s, &ex->w1, &ex->s1, &ex->s1_shape));
  return quantize_into(w2f, {E, H, I}, s, &ex->w2, &ex->s2, &ex->s2_shape);
}

struct Layer {
  std::vector<float> in_norm, post_norm, wq, wk, wv, wo, router, bias;
  std::vector<float> wkv_a, kv_norm, wkv_b;  // deepseek MLA: kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
  Experts experts, shared;
  std::unique_ptr<DevBuf> d_bias;  // cuda: the correction bias on the device (deepseek)
};

// The attention tensors of layer prefix p ("model.layers.L."), in the order of the Layer fields they
// fill: q/k/v/o_proj (mixtral, llama4) or the MLA projections (deepseek).
struct AttnTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> Layer::*field;
};
std::vector<AttnTensor> attention_tensors(const ModelConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  const std::string s = p + "self_attn.";
  if (c.family == Family::deepseek) {
    const int64_t dq = c.qk_nope_head_dim + c.qk_rope_head_dim, R = c.kv_lora_rank;
    return {{s + "q_proj.weight", {nh * dq, H}, &Layer::wq},
            {s + "kv_a_proj_with_mqa.weight", {R + c.qk_rope_head_dim, H}, &Layer::wkv_a},
            {s + "kv_a_layernorm.weight", {R}, &Layer::kv_norm},
            {s + "kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), R}, &Layer::wkv_b},
            {s + "o_proj.weight", {H, nh * c.v_head_dim}, &Layer::wo}};
  }
  const int64_t qd = nh * c.head_dim, kd = int64_t(c.num_key_value_heads) * c.head_dim;
  return {{s + "q_proj.weight", {qd, H}, &Layer::wq},
          {s + "k_proj.weight", {kd, H}, &Layer::wk},
          {s + "v_proj.weight", {kd, H}, &Layer::wv},
          {s + "o_proj.weight", {H, qd}, &Layer::wo}};
}

// Calls fn(name, shape) (returning a Status, the first error stops) for every tensor of the model
// config.json describes: the names and shapes MoeModel::Impl::load reads (include/moekit/model/runner.h).
template <class Fn>
Status for_each_expected_tensor(const ModelConfig& c, Fn&& fn) {
  const int64_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.moe_intermediate_size;
  MOEKIT_RETURN_IF_ERROR(fn("model.embed_tokens.weight", {V, H}));
  MOEKIT_RETURN_IF_ERROR(fn("lm_head.weight", {V, H}));
  MOEKIT_RETURN_IF_ERROR(fn("model.norm.weight", {H}));
  const char* moe_name =
      c.family == Family::mixtral ? "block_sparse_moe" : c.family == Family::deepseek ? "mlp" : "feed_forward";
  const bool mx = c.family == Family::mixtral;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    MOEKIT_RETURN_IF_ERROR(fn(p + "input_layernorm.weight", {H}));
    MOEKIT_RETURN_IF_ERROR(fn(p + "post_attention_layernorm.weight", {H}));
    for (const AttnTensor& t : attention_tensors(c, p)) MOEKIT_RETURN_IF_ERROR(fn(t.name, t.shape));
    const std::string m = p + moe_name + ".";
    if (c.family == Family::llama4) {
      MOEKIT_RETURN_IF_ERROR(fn(m + "router.weight", {E, H}));
      MOEKIT_RETURN_IF_ERROR(fn(m + "experts.gate_up_proj", {E, H, 2 * I}));
      MOEKIT_RETURN_IF_ERROR(fn(m + "experts.down_proj", {E, I, H}));
    } else {
      MOEKIT_RETURN_IF_ERROR(fn(m + "gate.weight", {E, H}));
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        MOEKIT_RETURN_IF_ERROR(fn(x + (mx ? "w1.weight" : "gate_proj.weight"), {I, H}));
        MOEKIT_RETURN_IF_ERROR(fn(x + (mx ? "w3.weight" : "up_proj.weight"), {I, H}));
        MOEKIT_RETURN_IF_ERROR(fn(x + (mx ? "w2.weight" : "down_proj.weight"), {H, I}));
      }
      if (c.family == Family::deepseek) MOEKIT_RETURN_IF_ERROR(fn(m + "gate.e_score_correction_bias", {E}));
    }
    if (c.shared_expert) {
      const std::string s = m + (c.family == Family::deepseek ? "shared_experts." : "shared_expert.");
      MOEKIT_RETURN_IF_ERROR(fn(s + "gate_proj.weight", {I, H}));
      MOEKIT_RETURN_IF_ERROR(fn(s + "up_proj.weight", {I, H}));
      MOEKIT_RETURN_IF_ERROR(fn(s + "down_proj.weight", {H, I}));
    }
  }
  return Status::Ok();
}

// The checkpoint holds exactly the tensors of the config's model: each one present with its shape
// and a float dtype, and none left over (a config with fewer layers or experts than the checkpoint
// would otherwise run a different model without a word). Runs before anything is converted, so a
// config whose sizes disagree with the file allocates nothing.
Status check_checkpoint(const SafetensorsFile& f, const ModelConfig& c) {
  const std::vector<SafetensorsTensor>& ts = f.tensors();
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < ts.size(); ++i) index.emplace(ts[i].name, i);
  std::vector<bool> used(ts.size(), false);
  MOEKIT_RETURN_IF_ERROR(for_each_expected_tensor(c, [&](const std::string& name, const std::vector<int64_t>& shape) {
    const auto it = index.find(name);
    if (it == index.end()) return InvalidArgument("model.safetensors: missing tensor '", name, "'");
    const SafetensorsTensor& t = ts[it->second];
    if (t.shape != shape) {
      return InvalidArgument("model.safetensors: '", name, "' has shape ", shape_str(t.shape), ", want ",
                             shape_str(shape));
    }
    if (t.dtype != "BF16" && t.dtype != "F16" && t.dtype != "F32") {
      return InvalidArgument("model.safetensors: '", name, "' has dtype ", t.dtype, " (want BF16, F16 or F32)");
    }
    used[it->second] = true;
    return Status::Ok();
  }));
  const size_t unused = size_t(std::count(used.begin(), used.end(), false));
  for (size_t i = 0; i < ts.size(); ++i) {
    if (used[i]) continue;
    return InvalidArgument("model.safetensors: tensor '", ts[i].name, "' is not part of the ", family_name(c.family),
                           " model config.json describes (", c.num_hidden_layers, " layers, ", c.num_experts,
                           " experts); ", unused, " of ", ts.size(),
                           " tensors unused: does the config have fewer layers or experts than the checkpoint?");
  }
  return Status::Ok();
}

// fn(b) for b in [0, n) on the CPU backend's thread pool (contiguous ranges; rows are independent,
// so the result does not depend on the split). Small batches stay on the calling thread.
template <class Fn>
void for_rows(int n, const Fn& fn) {
  cpu::parallel_for_if(n >= 8, n, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) fn(int(b));
  });
}

}  // namespace

struct MoeModel::Impl {
  ModelConfig cfg;
  Tokenizer tok;
  RunnerOptions opts;
  const DeviceOps* dev = nullptr;  // cuda backend: the MoE ops run on the device
  DevBuf d_x, d_out, d_ids, d_w, d_logits, d_ws;
  std::vector<float> embed, lm_head, final_norm;
  std::vector<Layer> layers;
  std::vector<float> inv_freq;  // [head_dim / 2] (deepseek: qk_rope_head_dim / 2), as transformers computes it

  // One sequence's KV cache: [layer][position][kv_heads * head_dim] for K and V (deepseek: the
  // expanded [heads * (dn + dr)] and [heads * dv]).
  struct Seq {
    std::vector<std::vector<float>> k, v;
    int pos = 0;
  };

  Status load(const std::string& dir);
  Status moe(const Layer& L, const std::vector<float>& h, int B, std::vector<float>* x);
  // routed_on_device: cuda only, ids / w are already in d_ids / d_w (the routing op's outputs).
  Status run_experts(const Experts& ex, const std::vector<float>& h, int B, const int32_t* ids, const float* w, int k,
                     bool on_input, std::vector<float>* x,
                     bool routed_on_device = false);
  // One token of attention of sequence s in layer l, one function per kind: appends the token's key
  // and value to the cache and writes o_proj(attention) to y [H]. hb: the normed input [H].
  void attention_gqa(const Layer& L, const float* hb, Seq& s, size_t l, float* y) const;
  void attention_mla(const Layer& L, const float* hb, Seq& s, size_t l, float* y) const;
  // Advances every sequence by one token (tokens[b] at seqs[b]->pos) and writes logits [B, vocab].
  Status step(const std::vector<Seq*>& seqs, const std::vector<int32_t>& tokens, std::vector<float>* logits);
  Seq new_seq() const {
    Seq s;
    s.k.assign(size_t(cfg.num_hidden_layers), {});
    s.v.assign(size_t(cfg.num_hidden_layers), {});
    return s;
  }
};

Status MoeModel::Impl::load(const std::string& dir) {
  std::string text;
  MOEKIT_RETURN_IF_ERROR(read_regular_file("config.json", dir + "/config.json", kMaxJsonFileBytes, &text));
  MOEKIT_RETURN_IF_ERROR(ModelConfig::parse(text, &cfg));
  MOEKIT_RETURN_IF_ERROR(Tokenizer::load(dir + "/tokenizer.json", &tok));
  if (tok.vocab_size() != cfg.vocab_size) {
    return InvalidArgument("tokenizer.json: ", tok.vocab_size(), " tokens, config.json says vocab_size ", cfg.vocab_size);
  }
  if (tok.bos_id() != cfg.bos_token_id || tok.eos_id() != cfg.eos_token_id) {
    return InvalidArgument("config.json: bos_token_id ", cfg.bos_token_id, " / eos_token_id ", cfg.eos_token_id,
                           " disagree with tokenizer.json's <bos> ", tok.bos_id(), " / <eos> ", tok.eos_id());
  }
  SafetensorsFile f;
  MOEKIT_RETURN_IF_ERROR(SafetensorsFile::open(dir + "/model.safetensors", &f));
  MOEKIT_RETURN_IF_ERROR(check_checkpoint(f, cfg));
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, E = cfg.num_experts, I = cfg.moe_intermediate_size;
  MOEKIT_RETURN_IF_ERROR(load_f32(f, "model.embed_tokens.weight", {V, H}, &embed));
  MOEKIT_RETURN_IF_ERROR(load_f32(f, "lm_head.weight", {V, H}, &lm_head));
  MOEKIT_RETURN_IF_ERROR(load_f32(f, "model.norm.weight", {H}, &final_norm));
  const char* moe_name = cfg.family == Family::mixtral ? "block_sparse_moe" : cfg.family == Family::deepseek ? "mlp" : "feed_forward";
  layers.resize(size_t(cfg.num_hidden_layers));
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    Layer& L = layers[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    MOEKIT_RETURN_IF_ERROR(load_f32(f, p + "input_layernorm.weight", {H}, &L.in_norm));
    MOEKIT_RETURN_IF_ERROR(load_f32(f, p + "post_attention_layernorm.weight", {H}, &L.post_norm));
    for (const AttnTensor& t : attention_tensors(cfg, p)) {
      MOEKIT_RETURN_IF_ERROR(load_f32(f, t.name, t.shape, &(L.*t.field)));
    }
    const std::string m = p + moe_name + ".";
    // Routed experts stacked: w1 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I].
    std::vector<float> w1(size_t(E * 2 * I * H)), w2(size_t(E * H * I)), t;
    if (cfg.family == Family::llama4) {
      MOEKIT_RETURN_IF_ERROR(load_f32(f, m + "router.weight", {E, H}, &L.router));
      MOEKIT_RETURN_IF_ERROR(load_f32(f, m + "experts.gate_up_proj", {E, H, 2 * I}, &t));  // x @ it = [gate | up]
      for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t n = 0; n < 2 * I; ++n) w1[size_t((e * 2 * I + n) * H + h)] = t[size_t((e * H + h) * 2 * I + n)];
      MOEKIT_RETURN_IF_ERROR(load_f32(f, m + "experts.down_proj", {E, I, H}, &t));  // a @ it
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i)
          for (int64_t h = 0; h < H; ++h) w2[size_t((e * H + h) * I + i)] = t[size_t((e * I + i) * H + h)];
    } else {
      MOEKIT_RETURN_IF_ERROR(load_f32(f, m + "gate.weight", {E, H}, &L.router));
      const bool mx = cfg.family == Family::mixtral;
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        MOEKIT_RETURN_IF_ERROR(load_f32(f, x + (mx ? "w1.weight" : "gate_proj.weight"), {I, H}, &t));
        std::copy(t.begin(), t.end(), w1.begin() + e * 2 * I * H);
        MOEKIT_RETURN_IF_ERROR(load_f32(f, x + (mx ? "w3.weight" : "up_proj.weight"), {I, H}, &t));
        std::copy(t.begin(), t.end(), w1.begin() + (e * 2 + 1) * I * H);
        MOEKIT_RETURN_IF_ERROR(load_f32(f, x + (mx ? "w2.weight" : "down_proj.weight"), {H, I}, &t));
        std::copy(t.begin(), t.end(), w2.begin() + e * H * I);
      }
      if (cfg.family == Family::deepseek) {
        MOEKIT_RETURN_IF_ERROR(load_f32(f, m + "gate.e_score_correction_bias", {E}, &L.bias));
      }
    }
    MOEKIT_RETURN_IF_ERROR(make_experts(w1, w2, int(E), int(2 * I), int(H), int(I), opts.scheme, &L.experts));
    if (cfg.shared_expert) {
      const std::string s = m + (cfg.family == Family::deepseek ? "shared_experts." : "shared_expert.");
      std::vector<float> s1(size_t(2 * I * H)), s2;
      MOEKIT_RETURN_IF_ERROR(load_f32(f, s + "gate_proj.weight", {I, H}, &t));
      std::copy(t.begin(), t.end(), s1.begin());
      MOEKIT_RETURN_IF_ERROR(load_f32(f, s + "up_proj.weight", {I, H}, &t));
      std::copy(t.begin(), t.end(), s1.begin() + I * H);
      MOEKIT_RETURN_IF_ERROR(load_f32(f, s + "down_proj.weight", {H, I}, &s2));
      MOEKIT_RETURN_IF_ERROR(make_experts(s1, s2, 1, int(2 * I), int(H), int(I), opts.scheme, &L.shared));
    }
    if (dev != nullptr) {
      MOEKIT_RETURN_IF_ERROR(L.experts.upload(dev));
      if (cfg.shared_expert) MOEKIT_RETURN_IF_ERROR(L.shared.upload(dev));
      if (!L.bias.empty()) {
        L.d_bias = std::make_unique<DevBuf>();
        MOEKIT_RETURN_IF_ERROR(L.d_bias->upload(dev, L.bias.data(), L.bias.size() * 4));
      }
    }
  }
  // transformers: inv_freq = 1 / theta ^ (arange(0, d, 2) / d), all in f32 (d = head_dim, which
  // DeepseekV3Config sets to qk_rope_head_dim).
  inv_freq.resize(size_t(cfg.head_dim / 2));
  for (int i = 0; i < cfg.head_dim / 2; ++i) {
    inv_freq[size_t(i)] = 1.0f / std::pow(cfg.rope_theta, float(2 * i) / float(cfg.head_dim));
  }
  return Status::Ok();
}

// x[b] += experts(h[b]) routed by ids / weights [B, k] (on_input: the weight scales the expert input).
Status MoeModel::Impl::run_experts(const Experts& ex, const std::vector<float>& h, int B, const int32_t* ids,
                                   const float* w, int k, bool on_input, std::vector<float>* x,
                                   bool routed_on_device) {
  const int H = ex.H;
  const DType xd = ex.dtype == DType::f32 ? DType::f32 : DType::bf16;
  const int eb = dtype_size(xd);
  std::vector<uint8_t> xin(size_t(B) * H * eb), out(size_t(B) * H * eb);
  for (int64_t i = 0; i < int64_t(B) * H; ++i) store_from_f32(xin.data(), xd, i, h[size_t(i)]);
  const bool on_dev = dev != nullptr;
  const Device where = on_dev ? Device::cuda : Device::cpu;
  void* px = xin.data();
  void* pout = out.data();
  void* pids = const_cast<int32_t*>(ids);
  void* pw = const_cast<float*>(w);
  if (on_dev) {
    MOEKIT_RETURN_IF_ERROR(d_x.upload(dev, xin.data(), xin.size()));
    MOEKIT_RETURN_IF_ERROR(d_out.ensure(dev, out.size()));
    if (!routed_on_device) {
      MOEKIT_RETURN_IF_ERROR(d_ids.upload(dev, ids, size_t(B) * k * 4));
      MOEKIT_RETURN_IF_ERROR(d_w.upload(dev, w, size_t(B) * k * 4));
    }
    px = d_x.p, pout = d_out.p, pids = d_ids.p, pw = d_w.p;
  }
  FusedMoeParams p;
  p.x = TensorView::contiguous(px, xd, {B, H}, where);
  p.out = TensorView::contiguous(pout, xd, {B, H}, where);
  p.w1 = TensorView::contiguous(on_dev ? ex.d_w1->p : const_cast<uint8_t*>(ex.w1.data()), ex.dtype, {ex.E, ex.N1, H},
                                where);
  p.w2 = TensorView::contiguous(on_dev ? ex.d_w2->p : const_cast<uint8_t*>(ex.w2.data()), ex.dtype, {ex.E, H, ex.I},
                                where);
  p.topk_ids = TensorView::contiguous(pids, DType::i32, {B, k}, where);
  p.topk_weights = TensorView::contiguous(pw, DType::f32, {B, k}, where);
  p.weight_on_input = on_input;
  if (ex.dtype == DType::fp8_e4m3fn) {
    p.w1_scale = TensorView::contiguous(on_dev ? ex.d_s1->p : const_cast<float*>(ex.s1.data()), DType::f32,
                                        int(ex.s1_shape.size()), ex.s1_shape.data(), where);
    p.w2_scale = TensorView::contiguous(on_dev ? ex.d_s2->p : const_cast<float*>(ex.s2.data()), DType::f32,
                                        int(ex.s2_shape.size()), ex.s2_shape.data(), where);
    if (ex.block) p.scale_block_n = p.scale_block_k = kBlock;
  }
  const Kernel* kern = pick_kernel(OpKind::fused_moe, fused_moe_variant(p), opts.backend, &p);
  if (kern == nullptr) {
    return Unsupported("fused_moe: no ", backend_name(opts.backend), " kernel accepts the ",
                       model_scheme_name(opts.scheme), " experts");
  }
  RunOptions o;
  o.kernel = kern->name;
  if (on_dev) {
    size_t ws = 0;
    MOEKIT_RETURN_IF_ERROR(fused_moe_workspace_size(p, o, &ws));
    MOEKIT_RETURN_IF_ERROR(d_ws.ensure(dev, ws));
    o.workspace = d_ws.p;
    o.workspace_bytes = d_ws.bytes;
  }
  MOEKIT_RETURN_IF_ERROR(fused_moe(p, o));
  if (on_dev) {
    MOEKIT_RETURN_IF_ERROR(dev->synchronize());
    MOEKIT_RETURN_IF_ERROR(dev->copy_to_host(out.data(), d_out.p, out.size()));
  }
  for (int64_t i = 0; i < int64_t(B) * H; ++i) (*x)[size_t(i)] += load_as_f32(out.data(), xd, i);
  return Status::Ok();
}

// x += moe(h): routing on f32 logits, then the routed experts and the shared one.
Status MoeModel::Impl::moe(const Layer& L, const std::vector<float>& h, int B, std::vector<float>* x) {
  const int H = cfg.hidden_size, E = cfg.num_experts, k = cfg.num_experts_per_tok;
  std::vector<float> logits(size_t(B) * E), w(size_t(B) * k);
  std::vector<int32_t> ids(size_t(B) * k);
  for (int b = 0; b < B; ++b) matvec(L.router.data(), h.data() + int64_t(b) * H, E, H, logits.data() + int64_t(b) * E);
  // cuda: the routing op runs on a device copy of the logits and leaves ids / weights in d_ids / d_w
  // for the routed fused_moe.
  const bool on_dev = dev != nullptr;
  const Device where = on_dev ? Device::cuda : Device::cpu;
  void* pl = logits.data();
  void* pw = w.data();
  void* pi = ids.data();
  void* pb = const_cast<float*>(L.bias.data());
  if (on_dev) {
    MOEKIT_RETURN_IF_ERROR(d_logits.upload(dev, logits.data(), logits.size() * 4));
    MOEKIT_RETURN_IF_ERROR(d_w.ensure(dev, w.size() * 4));
    MOEKIT_RETURN_IF_ERROR(d_ids.ensure(dev, ids.size() * 4));
    pl = d_logits.p, pw = d_w.p, pi = d_ids.p, pb = L.d_bias ? L.d_bias->p : nullptr;
  }
  const TensorView gv = TensorView::contiguous(pl, DType::f32, {B, E}, where);
  const TensorView wv = TensorView::contiguous(pw, DType::f32, {B, k}, where);
  const TensorView iv = TensorView::contiguous(pi, DType::i32, {B, k}, where);
  RunOptions o;
  const char* op = "";
  Status st;
  if (cfg.family == Family::mixtral) {
    TopkSoftmaxParams p;
    p.gating = gv, p.k = k, p.renormalize = true, p.topk_weights = wv, p.topk_ids = iv;
    const Kernel* kern = pick_kernel(OpKind::topk_softmax, MoeVariant::none, opts.backend, &p);
    op = "topk_softmax";
    o.kernel = kern ? kern->name : nullptr;
    st = kern ? topk_softmax(p, o) : Status::Ok();
  } else if (cfg.family == Family::deepseek) {
    GroupedTopkParams p;
    p.gating = gv, p.k = k, p.n_group = cfg.n_group, p.topk_group = cfg.topk_group, p.scoring = Scoring::sigmoid;
    p.correction_bias = TensorView::contiguous(pb, DType::f32, {E}, where);
    p.renormalize = true, p.routed_scaling_factor = cfg.routed_scaling_factor, p.topk_weights = wv, p.topk_ids = iv;
    const Kernel* kern = pick_kernel(OpKind::grouped_topk, MoeVariant::none, opts.backend, &p);
    op = "grouped_topk";
    o.kernel = kern ? kern->name : nullptr;
    st = kern ? grouped_topk(p, o) : Status::Ok();
  } else {
    SigmoidTopkParams p;
    p.gating = gv, p.k = k, p.topk_weights = wv, p.topk_ids = iv;
    const Kernel* kern = pick_kernel(OpKind::sigmoid_topk, MoeVariant::none, opts.backend, &p);
    op = "sigmoid_topk";
    o.kernel = kern ? kern->name : nullptr;
    st = kern ? sigmoid_topk(p, o) : Status::Ok();
  }
  if (o.kernel == nullptr) return Unsupported(op, ": no ", backend_name(opts.backend), " kernel accepts the router");
  MOEKIT_RETURN_IF_ERROR(st);
  const bool on_input = cfg.family == Family::llama4;
  MOEKIT_RETURN_IF_ERROR(run_experts(L.experts, h, B, ids.data(), w.data(), k, on_input, x, on_dev));
  if (cfg.shared_expert) {
    const std::vector<int32_t> zero(size_t(B), 0);
    const std::vector<float> one(size_t(B), 1.0f);
    MOEKIT_RETURN_IF_ERROR(run_experts(L.shared, h, B, zero.data(), one.data(), 1, false, x));
  }
  return Status::Ok();
}

void MoeModel::Impl::attention_gqa(const Layer& L, const float* hb, Seq& s, size_t l, float* y) const {
  const int H = cfg.hidden_size, hd = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  std::vector<float> q(size_t(nh) * hd), k(size_t(nkv) * hd), v(size_t(nkv) * hd), o(size_t(nh) * hd);
  matvec(L.wq.data(), hb, nh * hd, H, q.data());
  matvec(L.wk.data(), hb, nkv * hd, H, k.data());
  matvec(L.wv.data(), hb, nkv * hd, H, v.data());
  for (int h = 0; h < nh; ++h) rope(q.data() + int64_t(h) * hd, hd, s.pos, inv_freq.data(), cfg.rope_interleave);
  for (int h = 0; h < nkv; ++h) rope(k.data() + int64_t(h) * hd, hd, s.pos, inv_freq.data(), cfg.rope_interleave);
  s.k[l].insert(s.k[l].end(), k.begin(), k.end());
  s.v[l].insert(s.v[l].end(), v.begin(), v.end());
  attend(q.data(), s.k[l].data(), s.v[l].data(), s.pos + 1, nh, nh / nkv, hd, hd, 1.0f / std::sqrt(float(hd)), o.data());
  matvec(L.wo.data(), o.data(), H, nh * hd, y);
}

void MoeModel::Impl::attention_mla(const Layer& L, const float* hb, Seq& s, size_t l, float* y) const {
  // NOTE: transformers builds kv_a_layernorm as DeepseekV3RMSNorm(kv_lora_rank), eps 1e-6 whatever
  // rms_norm_eps says.
  constexpr float kKvNormEps = 1e-6f;
  const int H = cfg.hidden_size, nh = cfg.num_attention_heads, R = cfg.kv_lora_rank;
  const int dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, dq = dn + dr;
  std::vector<float> q(size_t(nh) * dq), a(size_t(R + dr)), kv(size_t(nh) * (dn + dv));
  std::vector<float> k(size_t(nh) * dq), v(size_t(nh) * dv), o(size_t(nh) * dv);
  matvec(L.wq.data(), hb, nh * dq, H, q.data());
  matvec(L.wkv_a.data(), hb, R + dr, H, a.data());   // [c (R) | k_rot (dr)]
  rmsnorm(a.data(), L.kv_norm.data(), R, kKvNormEps, a.data());
  matvec(L.wkv_b.data(), a.data(), nh * (dn + dv), R, kv.data());  // head h: [k_nope (dn) | v (dv)]
  float* k_rot = a.data() + R;
  rope(k_rot, dr, s.pos, inv_freq.data(), cfg.rope_interleave);
  for (int h = 0; h < nh; ++h) {
    rope(q.data() + int64_t(h) * dq + dn, dr, s.pos, inv_freq.data(), cfg.rope_interleave);
    const float* kvh = kv.data() + int64_t(h) * (dn + dv);
    std::copy_n(kvh, dn, k.data() + int64_t(h) * dq);
    std::copy_n(k_rot, dr, k.data() + int64_t(h) * dq + dn);  // the one k_rot every head shares
    std::copy_n(kvh + dn, dv, v.data() + int64_t(h) * dv);
  }
  s.k[l].insert(s.k[l].end(), k.begin(), k.end());
  s.v[l].insert(s.v[l].end(), v.begin(), v.end());
  attend(q.data(), s.k[l].data(), s.v[l].data(), s.pos + 1, nh, 1, dq, dv, 1.0f / std::sqrt(float(dq)), o.data());
  matvec(L.wo.data(), o.data(), H, nh * dv, y);
}

Status MoeModel::Impl::step(const std::vector<Seq*>& seqs, const std::vector<int32_t>& tokens,
                            std::vector<float>* logits) {
  const int B = int(seqs.size()), H = cfg.hidden_size, V = cfg.vocab_size;
  for (int b = 0; b < B; ++b) {
    if (tokens[size_t(b)] < 0 || tokens[size_t(b)] >= V) return InvalidArgument("token id ", tokens[size_t(b)], " outside [0, ", V, ")");
    if (seqs[size_t(b)]->pos >= cfg.max_position_embeddings) {
      return InvalidArgument("position ", seqs[size_t(b)]->pos, " reaches max_position_embeddings ", cfg.max_position_embeddings);
    }
  }
  std::vector<float> x(size_t(B) * H), h(size_t(B) * H);
  for (int b = 0; b < B; ++b) std::copy_n(embed.data() + int64_t(tokens[size_t(b)]) * H, H, x.data() + int64_t(b) * H);
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& L = layers[l];
    // Attention: every sequence on its own (its rows and cache), rows split over threads.
    for_rows(B, [&](int b) {
      std::vector<float> y(static_cast<size_t>(H));
      float* xb = x.data() + int64_t(b) * H;
      float* hb = h.data() + int64_t(b) * H;
      rmsnorm(xb, L.in_norm.data(), H, cfg.rms_norm_eps, hb);
      if (cfg.family == Family::deepseek) {
        attention_mla(L, hb, *seqs[size_t(b)], l, y.data());
      } else {
        attention_gqa(L, hb, *seqs[size_t(b)], l, y.data());
      }
      for (int i = 0; i < H; ++i) xb[i] += y[size_t(i)];
      rmsnorm(xb, L.post_norm.data(), H, cfg.rms_norm_eps, hb);
    });
    MOEKIT_RETURN_IF_ERROR(moe(L, h, B, &x));
  }
  logits->resize(size_t(B) * V);
  for_rows(B, [&](int b) {
    float* hb = h.data() + int64_t(b) * H;
    rmsnorm(x.data() + int64_t(b) * H, final_norm.data(), H, cfg.rms_norm_eps, hb);
    matvec(lm_head.data(), hb, V, H, logits->data() + int64_t(b) * V);
  });
  for (int b = 0; b < B; ++b) ++seqs[size_t(b)]->pos;
  return Status::Ok();
}

MoeModel::MoeModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoeModel::~MoeModel() = default;
const ModelConfig& MoeModel::config() const { return impl_->cfg; }
const Tokenizer& MoeModel::tokenizer() const { return impl_->tok; }

Status MoeModel::load(const std::string& dir, const RunnerOptions& opts, std::unique_ptr<MoeModel>* out) {
  // NOTE: an empty dir would read "/config.json" (the root's), not the current folder's.
  if (dir.empty()) {
    return InvalidArgument("model folder: empty path (the folder of config.json, model.safetensors, tokenizer.json)");
  }
  if (out == nullptr) return InvalidArgument("out: must not be null");
  MOEKIT_RETURN_IF_ERROR(registry().backend_available(opts.backend));
  return no_throw("model " + dir, [&]() -> Status {
    auto impl = std::make_unique<Impl>();
    impl->opts = opts;
    if (opts.backend == Backend::cuda) {
      impl->dev = registry().device_ops(Backend::cuda);
      if (impl->dev == nullptr) return Unsupported("model runner: the cuda backend registers no device operations");
    }
    const Status s = impl->load(dir);
    if (!s.ok()) return Status(s.code(), dir + ": " + s.message());
    out->reset(new MoeModel(std::move(impl)));
    return Status::Ok();
  });
}

Status MoeModel::logits(const std::vector<int32_t>& ids, std::vector<float>* logits) {
  if (logits == nullptr) return InvalidArgument("logits: must not be null");
  return no_throw("model: logits", [&]() -> Status {
    Impl::Seq s = impl_->new_seq();
    const int V = impl_->cfg.vocab_size;
    std::vector<float> all, one;
    all.reserve(ids.size() * size_t(V));
    for (int32_t t : ids) {
      MOEKIT_RETURN_IF_ERROR(impl_->step({&s}, {t}, &one));
      all.insert(all.end(), one.begin(), one.end());
    }
    *logits = std::move(all);
    return Status::Ok();
  });
}

Status MoeModel::generate(const std::vector<std::vector<int32_t>>& prompts, int max_new, int batch,
                          std::vector<std::vector<int32_t>>* out,
                          const std::function<void(size_t, size_t)>& progress) {
  return no_throw("model: generate",
                  [&]() -> Status { return generate_checked(prompts, max_new, batch, out, progress); });
}

Status MoeModel::generate_checked(const std::vector<std::vector<int32_t>>& prompts, int max_new, int batch,
                                  std::vector<std::vector<int32_t>>* out,
                                  const std::function<void(size_t, size_t)>& progress) {
  if (out == nullptr) return InvalidArgument("out: must not be null");
  if (batch < 1) return InvalidArgument("batch: must be >= 1, got ", batch);
  if (max_new < 0) return InvalidArgument("max_new: must be >= 0, got ", max_new);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return InvalidArgument("prompts[", i, "]: empty (include bos)");
  }
  const ModelConfig& c = impl_->cfg;
  std::vector<std::vector<int32_t>> result(prompts.size());
  for (size_t c0 = 0; c0 < prompts.size(); c0 += size_t(batch)) {
    const size_t n = std::min(prompts.size() - c0, size_t(batch));
    std::vector<Impl::Seq> seqs(n, impl_->new_seq());
    std::vector<bool> done(n, false);
    while (true) {
      std::vector<Impl::Seq*> live;
      std::vector<int32_t> toks;
      std::vector<size_t> idx;
      for (size_t i = 0; i < n; ++i) {
        if (done[i]) continue;
        const std::vector<int32_t>& pr = prompts[c0 + i];
        const int pos = seqs[i].pos;
        live.push_back(&seqs[i]);
        toks.push_back(pos < int(pr.size()) ? pr[size_t(pos)] : result[c0 + i].back());
        idx.push_back(i);
      }
      if (live.empty()) break;
      std::vector<float> logits;
      MOEKIT_RETURN_IF_ERROR(impl_->step(live, toks, &logits));
      for (size_t j = 0; j < idx.size(); ++j) {
        const size_t i = idx[j];
        const int pos = seqs[i].pos;  // already advanced
        if (pos < int(prompts[c0 + i].size())) continue;  // still reading the prompt
        const float* lg = logits.data() + j * size_t(c.vocab_size);
        const int32_t next = int32_t(std::max_element(lg, lg + c.vocab_size) - lg);  // first max = lowest id
        std::vector<int32_t>& r = result[c0 + i];
        if (next == c.eos_token_id || max_new == 0) {
          done[i] = true;
          continue;
        }
        r.push_back(next);
        if (int(r.size()) >= max_new || pos >= c.max_position_embeddings) done[i] = true;
      }
    }
    if (progress) progress(c0 + n, prompts.size());
  }
  *out = std::move(result);
  return Status::Ok();
}

}  // namespace moekit::model
