// fused_moe front door (SPEC 3, 6): validate -> T == 0 returns -> pick the variant -> dispatch.
//
// validate_fused_moe checks every argument (shapes, dtypes, layouts, scales per variant, expert
// parallelism tables, devices) and, for host tensors, scans the ids / mask / map VALUES, all before
// any kernel runs, so an invalid call never writes `out`. Tests: tests/test_fused_moe.cpp
// (FusedMoe.Validation*, FusedMoe.Poison*) and tests/test_fused_moe_fp8.cpp.
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/check.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/core/config.h"
#include "moekit/ops/layout.h"
#include "ops/fused_moe/fused_moe_sm90_config.h"

namespace moekit {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}

bool parse_activation(const char* s, Activation* out) {
  struct Alias {
    const char* name;
    Activation a;
  };
  static const Alias kAliases[] = {{"silu", Activation::silu},         {"swiglu", Activation::silu},
                                   {"gelu", Activation::gelu},         {"gelu_erf", Activation::gelu},
                                   {"gelu_tanh", Activation::gelu_tanh}};
  if (s == nullptr) return false;
  for (const Alias& a : kAliases) {
    if (std::strcmp(s, a.name) == 0) {
      *out = a.a;
      return true;
    }
  }
  return false;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scale of one fp8 weight tensor `w` [E, N, K] for the row variants: [E], [E, N] or [E, N, 1].
Status check_row_scale(const TensorView& s, const char* name, int64_t E, int64_t N) {
  MOEKIT_RETURN_IF_ERROR(check::present(s, name));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(s, name, {DType::f32}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(s, name));
  const bool ok = (s.ndim == 1 && s.shape[0] == E) || (s.ndim == 2 && s.shape[0] == E && s.shape[1] == N) ||
                  (s.ndim == 3 && s.shape[0] == E && s.shape[1] == N && s.shape[2] == 1);
  if (!ok) {
    return InvalidArgument(name, ": shape must be [", E, "] (per-tensor), [", E, ", ", N, "] or [", E, ", ",
                           N, ", 1] (per-row), got ", s.describe());
  }
  return Status::Ok();
}

// Block scale of `w` [E, N, K]: [E, ceil(N/bn), ceil(K/bk)].
Status check_block_scale(const TensorView& s, const char* name, int64_t E, int64_t N, int64_t K, int bn,
                         int bk) {
  MOEKIT_RETURN_IF_ERROR(check::present(s, name));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(s, name, {DType::f32}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(s, name));
  const int64_t nb = ceil_div(N, bn), kb = ceil_div(K, bk);
  if (!(s.ndim == 3 && s.shape[0] == E && s.shape[1] == nb && s.shape[2] == kb)) {
    return InvalidArgument(name, ": block scale shape must be [", E, ", ", nb, ", ", kb, "] (= [E, ceil(",
                           N, "/", bn, "), ceil(", K, "/", bk, ")]), got ", s.describe());
  }
  return Status::Ok();
}

// Shuffled (16, 16) weights need N % 16 == 0 and K % 32 == 0 (SPEC 4).
Status check_shuffle_dims(const TensorView& w, const char* name) {
  if (w.layout != Layout::shuffled_16x16) return Status::Ok();
  const int64_t N = w.shape[1], K = w.shape[2];
  if (N % 16 != 0 || K % 32 != 0) {
    return InvalidArgument(name, ": layout shuffled_16x16 needs N % 16 == 0 and K % 32 == 0, got [N, K] = [", N,
                           ", ", K, "]");
  }
  return Status::Ok();
}

// Packed cpu_vnni2_n32 weights (moekit/ops/layout.h) need 16-bit or fp8 elements, N % 32 == 0 and
// K % 2 == 0.
Status check_vnni2_dims(const TensorView& w, const char* name) {
  if (w.layout != Layout::cpu_vnni2_n32) return Status::Ok();
  if (dtype_size(w.dtype) != 2 && !is_fp8(w.dtype)) {
    return InvalidArgument(name, ": layout cpu_vnni2_n32 needs bf16, f16 or fp8 elements, got ", dtype_name(w.dtype));
  }
  const int64_t N = w.shape[1], K = w.shape[2];
  if (N % kVnniPanelN != 0 || K % kVnniPairK != 0) {
    return InvalidArgument(name, ": layout cpu_vnni2_n32 needs N % 32 == 0 and K % 2 == 0, got [N, K] = [", N, ", ",
                           K, "]");
  }
  return Status::Ok();
}

// out may be x itself (the same view: each kernel reads a token's row before it writes it) but
// must not partly overlap x, nor overlap any other input.
Status check_out_aliasing(const FusedMoeParams& p) {
  const bool same_as_x = p.out.data == p.x.data && p.out.stride[0] == p.x.stride[0];
  if (!same_as_x && check::overlaps(p.out, p.x)) {
    return InvalidArgument("out: overlaps x without being x (out may alias x only exactly: same data and strides)");
  }
  const std::pair<const TensorView*, const char*> inputs[] = {
      {&p.w1, "w1"},           {&p.w2, "w2"},           {&p.topk_ids, "topk_ids"}, {&p.topk_weights, "topk_weights"},
      {&p.w1_scale, "w1_scale"}, {&p.w2_scale, "w2_scale"}, {&p.a1_scale, "a1_scale"}, {&p.expert_mask, "expert_mask"},
      {&p.expert_map, "expert_map"}};
  for (const auto& [t, name] : inputs) {
    if (t->present() && check::overlaps(p.out, *t)) return InvalidArgument("out: must not overlap ", name);
  }
  return Status::Ok();
}

// Shapes, dtypes, layouts, scales and devices (no data reads).
Status validate_meta(const FusedMoeParams& p) {
  // x, out
  MOEKIT_RETURN_IF_ERROR(check::present(p.x, "x"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.x, "x", {DType::bf16, DType::f16, DType::f32}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.x, "x", {-1, -1}));
  MOEKIT_RETURN_IF_ERROR(check::row_strided(p.x, "x"));
  const int64_t T = p.x.shape[0], H = p.x.shape[1];
  if (H < 1) return InvalidArgument("x: hidden size (dim 1) must be >= 1, got ", H);

  // w1, w2
  MOEKIT_RETURN_IF_ERROR(check::present(p.w1, "w1"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.w1, "w1", {p.x.dtype, DType::fp8_e4m3fn}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.w1, "w1", {-1, -1, H}));
  const int64_t E = p.w1.shape[0], N1 = p.w1.shape[1];
  if (E < 1) return InvalidArgument("w1: number of local experts (dim 0) must be >= 1, got ", E);
  MOEKIT_RETURN_IF_ERROR(check::present(p.w2, "w2"));
  if (p.w2.dtype != p.w1.dtype) {
    return InvalidArgument("w2: dtype must equal w1's (", dtype_name(p.w1.dtype), "), got ", dtype_name(p.w2.dtype));
  }
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.w2, "w2", {E, H, -1}));
  const int64_t I = p.w2.shape[2];
  if (I < 1) return InvalidArgument("w2: intermediate size (dim 2) must be >= 1, got ", I);
  if (N1 != 2 * I && N1 != I) {
    return InvalidArgument("w1: dim 1 must be 2*I = ", 2 * I, " (g1u1) or I = ", I, " (g1u0) with I = w2.shape[2], got ",
                           N1);
  }
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.w1, "w1"));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.w2, "w2"));
  if (p.w1.layout != p.w2.layout) {
    return InvalidArgument("w2: layout must equal w1's (", layout_name(p.w1.layout), "), got ", layout_name(p.w2.layout));
  }
  MOEKIT_RETURN_IF_ERROR(check_shuffle_dims(p.w1, "w1"));
  MOEKIT_RETURN_IF_ERROR(check_shuffle_dims(p.w2, "w2"));
  MOEKIT_RETURN_IF_ERROR(check_vnni2_dims(p.w1, "w1"));
  MOEKIT_RETURN_IF_ERROR(check_vnni2_dims(p.w2, "w2"));

  // expert parallelism tables
  int64_t Eg = E;
  if (p.expert_mask.present() && p.expert_map.present()) {
    return InvalidArgument("expert_map: must not be given together with expert_mask (pass one form)");
  }
  for (const auto& [t, name] : {std::pair<const TensorView*, const char*>{&p.expert_mask, "expert_mask"},
                                std::pair<const TensorView*, const char*>{&p.expert_map, "expert_map"}}) {
    if (!t->present()) continue;
    MOEKIT_RETURN_IF_ERROR(check::well_formed(*t, name));
    MOEKIT_RETURN_IF_ERROR(check::dtype_in(*t, name, {DType::i32}));
    MOEKIT_RETURN_IF_ERROR(check::shape_is(*t, name, {-1}));
    MOEKIT_RETURN_IF_ERROR(check::contiguous(*t, name));
    Eg = t->shape[0];
    if (Eg < E) return InvalidArgument(name, ": length Eg must be >= E = ", E, " (local experts), got ", Eg);
  }

  // routing
  MOEKIT_RETURN_IF_ERROR(check::present(p.topk_ids, "topk_ids"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.topk_ids, "topk_ids", {DType::i32}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.topk_ids, "topk_ids", {T, -1}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.topk_ids, "topk_ids"));
  const int64_t k = p.topk_ids.shape[1];
  if (k < 1 || k > Eg) return InvalidArgument("topk_ids: k (dim 1) must be in [1, Eg=", Eg, "], got ", k);
  MOEKIT_RETURN_IF_ERROR(check::present(p.topk_weights, "topk_weights"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.topk_weights, "topk_weights", {DType::f32}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.topk_weights, "topk_weights", {T, k}));
  MOEKIT_RETURN_IF_ERROR(check::contiguous(p.topk_weights, "topk_weights"));
  if (p.weight_on_input && k != 1) {
    return InvalidArgument("weight_on_input: needs k == 1 (router weight on the expert input, SPEC 3.4), got k = ",
                           k);
  }

  // out
  MOEKIT_RETURN_IF_ERROR(check::present(p.out, "out"));
  MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.out, "out", {p.x.dtype}));
  MOEKIT_RETURN_IF_ERROR(check::shape_is(p.out, "out", {T, H}));
  MOEKIT_RETURN_IF_ERROR(check::row_strided(p.out, "out"));

  if (int(p.activation) > int(Activation::gelu_tanh)) {
    return InvalidArgument("activation: ", int(p.activation), " is not an Activation (silu, gelu, gelu_tanh)");
  }
  // The kernels' intermediates hold T*k rows of up to 2I + H values (f32 or wider): their size
  // must fit where each tensor's own size already does.
  int64_t work = 0;
  if (__builtin_mul_overflow(T, k, &work) || __builtin_mul_overflow(work, N1 + I + H, &work) ||
      __builtin_mul_overflow(work, int64_t(8), &work) || work > check::kMaxSpanBytes) {
    return InvalidArgument("x / topk_ids / w1: the intermediates of T*k = ", T, "*", k, " slots of 2I + H = ",
                           N1 + H, " values exceed 2^62 bytes");
  }

  // quantization
  const bool fp8 = is_fp8(p.w1.dtype);
  if (p.scale_block_n < 0 || p.scale_block_k < 0 || (p.scale_block_n == 0) != (p.scale_block_k == 0)) {
    return InvalidArgument("scale_block_n/scale_block_k: must be both 0 or both > 0, got ", p.scale_block_n, " x ",
                           p.scale_block_k);
  }
  const bool block = p.scale_block_n > 0;
  if (!fp8) {
    if (block) {
      return InvalidArgument("scale_block_n/scale_block_k: block scales need fp8 weights, got ", p.scale_block_n,
                             " x ", p.scale_block_k, " with w1 ", dtype_name(p.w1.dtype));
    }
    MOEKIT_RETURN_IF_ERROR(check::absent(p.w1_scale, "w1_scale", "unquantized weights take no scale"));
    MOEKIT_RETURN_IF_ERROR(check::absent(p.w2_scale, "w2_scale", "unquantized weights take no scale"));
    MOEKIT_RETURN_IF_ERROR(check::absent(p.a1_scale, "a1_scale", "unquantized weights take no scale"));
  } else if (block) {
    MOEKIT_RETURN_IF_ERROR(check_block_scale(p.w1_scale, "w1_scale", E, N1, H, p.scale_block_n, p.scale_block_k));
    MOEKIT_RETURN_IF_ERROR(check_block_scale(p.w2_scale, "w2_scale", E, H, I, p.scale_block_n, p.scale_block_k));
    MOEKIT_RETURN_IF_ERROR(check::absent(p.a1_scale, "a1_scale",
                                         "the block variant quantizes activations per 1 x scale_block_k group"));
  } else {
    MOEKIT_RETURN_IF_ERROR(check_row_scale(p.w1_scale, "w1_scale", E, N1));
    MOEKIT_RETURN_IF_ERROR(check_row_scale(p.w2_scale, "w2_scale", E, H));
    if (p.a1_scale.present()) {
      MOEKIT_RETURN_IF_ERROR(check::well_formed(p.a1_scale, "a1_scale"));
      MOEKIT_RETURN_IF_ERROR(check::dtype_in(p.a1_scale, "a1_scale", {DType::f32}));
      MOEKIT_RETURN_IF_ERROR(check::shape_is(p.a1_scale, "a1_scale", {1}));
    }
  }

  // devices
  const std::pair<const TensorView*, const char*> others[] = {
      {&p.w1, "w1"},         {&p.w2, "w2"},           {&p.topk_ids, "topk_ids"},
      {&p.topk_weights, "topk_weights"}, {&p.out, "out"}, {&p.w1_scale, "w1_scale"},
      {&p.w2_scale, "w2_scale"}, {&p.a1_scale, "a1_scale"}, {&p.expert_mask, "expert_mask"},
      {&p.expert_map, "expert_map"}};
  for (const auto& [t, name] : others) MOEKIT_RETURN_IF_ERROR(check::same_device(p.x, "x", *t, name));
  return check_out_aliasing(p);
}

// Value scans of the (host) index tensors: mask 0/1 with sum E, map in [-1, E), ids in [-1, Eg),
// and a static a1_scale finite and > 0.
// NOTE: device tensors are not read here (no host-device sync on the call path); device kernels
// skip bad ids and report them through their own error flag (SPEC 2).
Status validate_values(const FusedMoeParams& p) {
  if (p.x.device != Device::cpu) return Status::Ok();
  const MoeDims d = moe_dims(p);
  if (p.expert_mask.present()) {
    const int32_t* m = p.expert_mask.ptr<int32_t>();
    int64_t ones = 0;
    for (int64_t g = 0; g < d.Eg; ++g) {
      if (m[g] != 0 && m[g] != 1) return InvalidArgument("expert_mask[", g, "]: must be 0 or 1, got ", m[g]);
      ones += m[g];
    }
    if (ones != d.E) {
      return InvalidArgument("expert_mask: sum must equal the number of local experts E = ", d.E,
                             " (w1.shape[0]), got ", ones);
    }
  }
  if (p.expert_map.present()) {
    const int32_t* m = p.expert_map.ptr<int32_t>();
    for (int64_t g = 0; g < d.Eg; ++g) {
      if (m[g] < -1 || m[g] >= d.E) {
        return InvalidArgument("expert_map[", g, "]: must be a local expert in [0, ", d.E, ") or -1, got ", m[g]);
      }
    }
  }
  if (p.a1_scale.present()) {
    const float s = p.a1_scale.ptr<const float>()[0];
    if (!(std::isfinite(s) && s > 0.0f)) {
      return InvalidArgument("a1_scale[0]: static activation scale must be finite and > 0, got ", s);
    }
  }
  const int32_t* ids = p.topk_ids.ptr<int32_t>();
  for (int64_t t = 0; t < d.T; ++t) {
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t id = ids[t * d.k + j];
      if (id < -1 || id >= d.Eg) {
        return InvalidArgument("topk_ids[", t, ", ", j, "]: expert id must be in [-1, Eg=", d.Eg, "), got ", id,
                               " (token ", t, ", slot ", j, ")");
      }
    }
  }
  return Status::Ok();
}

std::string shape_key(const FusedMoeParams& p) {
  const MoeDims d = moe_dims(p);
  std::ostringstream os;
  os << "T=" << d.T << " E=" << d.E << " Eg=" << d.Eg << " k=" << d.k << " H=" << d.H << " I=" << d.I << ' '
     << (d.g1u1 ? "g1u1" : "g1u0") << " x=" << dtype_name(p.x.dtype) << " w=" << dtype_name(p.w1.dtype) << ' '
     << layout_name(p.w1.layout) << ' ' << activation_name(p.activation);
  if (p.weight_on_input) os << " weight_on_input";
  return os.str();
}

// The call with its explicit config (RunOptions::config, else MOEKIT_FUSED_MOE_CONFIG's entry for the
// variant's recipe) in both the params and the options, the name's syntax checked before dispatch.
// The environment's entry applies to calls on CUDA tensors only: the kernels that take configs are
// the CUDA rows, and a process that also runs fused_moe on the host keeps its host kernels.
struct ConfiguredCall {
  FusedMoeParams p;
  RunOptions opts;
};
Status configure(const FusedMoeParams& p, const RunOptions& opts, ConfiguredCall* out) {
  out->p = p;
  out->opts = opts;
  const Sm90Recipe recipe = sm90_recipe_of(fused_moe_variant(p));
  const char* cfg = opts.config;
  if ((cfg == nullptr || *cfg == '\0') && p.x.device == Device::cuda) {
    const std::string& env = config().fused_moe_config[fused_moe_config_slot(sm90_recipe_name(recipe))];
    cfg = env.empty() ? nullptr : env.c_str();  // config() lives for the process
  }
  if (cfg != nullptr && *cfg == '\0') cfg = nullptr;
  out->p.config = cfg;
  out->opts.config = cfg;
  if (cfg == nullptr) return Status::Ok();
  Sm90ConfigRequest req;
  std::string why;
  if (!parse_sm90_config(cfg, recipe, &req, &why)) return InvalidArgument(why);
  return Status::Ok();
}

}  // namespace

Status validate_fused_moe(const FusedMoeParams& p) {
  MOEKIT_RETURN_IF_ERROR(validate_meta(p));
  return validate_values(p);
}

Status fused_moe(const FusedMoeParams& p, const RunOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(validate_fused_moe(p));
  if (p.x.shape[0] == 0) return Status::Ok();  // T = 0: nothing to launch, out untouched
  ConfiguredCall c;
  MOEKIT_RETURN_IF_ERROR(configure(p, opts, &c));
  return dispatch(OpKind::fused_moe, fused_moe_variant(p), &c.p, c.opts, shape_key(p));
}

Status fused_moe_workspace_size(const FusedMoeParams& p, const RunOptions& opts, size_t* bytes) {
  if (bytes == nullptr) return InvalidArgument("bytes: output pointer is null");
  *bytes = 0;
  MOEKIT_RETURN_IF_ERROR(validate_meta(p));
  ConfiguredCall c;
  MOEKIT_RETURN_IF_ERROR(configure(p, opts, &c));
  return dispatch_workspace_size(OpKind::fused_moe, fused_moe_variant(p), &c.p, c.opts, shape_key(p), bytes);
}

Status fused_moe_kernel_name(const FusedMoeParams& p, const RunOptions& opts, std::string* name) {
  if (name == nullptr) return InvalidArgument("name: output pointer is null");
  MOEKIT_RETURN_IF_ERROR(validate_meta(p));
  ConfiguredCall c;
  MOEKIT_RETURN_IF_ERROR(configure(p, opts, &c));
  const Kernel* k = nullptr;
  MOEKIT_RETURN_IF_ERROR(registry().select(OpKind::fused_moe, fused_moe_variant(p), &c.p, c.opts, shape_key(p), &k));
  *name = k->name;
  return Status::Ok();
}

Status fused_moe_configs(const FusedMoeParams& p, const RunOptions& opts, std::vector<std::string>* names) {
  if (names == nullptr) return InvalidArgument("names: output pointer is null");
  names->clear();
  MOEKIT_RETURN_IF_ERROR(validate_meta(p));
  ConfiguredCall c;
  MOEKIT_RETURN_IF_ERROR(configure(p, opts, &c));
  const Kernel* k = nullptr;
  MOEKIT_RETURN_IF_ERROR(registry().select(OpKind::fused_moe, fused_moe_variant(p), &c.p, c.opts, shape_key(p), &k));
  if (k->configs != nullptr) *names = k->configs(&c.p);
  return Status::Ok();
}

}  // namespace moekit
