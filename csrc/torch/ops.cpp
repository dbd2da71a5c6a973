// csrc/torch/ops.cpp: the implementations of torch.ops.moekit.* (schemas: schemas.cpp) and their
// registration on the CPU dispatch key (the CUDA key: ops_cuda.cpp registers the same functions).
//
// Each function wraps its tensors as moekit::TensorView, fills the op's Params struct, asks the
// library for the workspace where the op has one (allocated from PyTorch's caching allocator, on the
// tensors' device) and calls the front door with the current stream. Everything else, validation
// included, is the library's: a failed Status becomes a Python exception carrying its message.
// A device guard makes the tensors' device current for the call (the library's CUDA kernels launch
// on the current device).
// Tests: tests/python/test_ops.py.
#include <ATen/DeviceGuard.h>
#include <c10/core/ScalarType.h>

#include <cstring>
#include <initializer_list>

#include "binding.h"

namespace moekit::torch_binding {

// ------------------------------------------------------------------------------------ helpers
namespace {

bool dtype_of(at::ScalarType s, DType* out) {
  switch (s) {
    case at::kFloat: *out = DType::f32; return true;
    case at::kBFloat16: *out = DType::bf16; return true;
    case at::kHalf: *out = DType::f16; return true;
    case at::kFloat8_e4m3fn: *out = DType::fp8_e4m3fn; return true;
    case at::kFloat8_e4m3fnuz: *out = DType::fp8_e4m3fnuz; return true;
    case at::kInt: *out = DType::i32; return true;
    default: return false;
  }
}

// Parses `value` as one of the names name_of(E(0)) .. name_of(E(count - 1)); ValueError otherwise.
template <class E>
E parse_enum(const std::string& value, const char* arg, const char* (*name_of)(E), int count) {
  std::string names;
  for (int i = 0; i < count; ++i) {
    const char* n = name_of(static_cast<E>(i));
    if (value == n) return static_cast<E>(i);
    names += (i ? ", " : "") + std::string(n);
  }
  TORCH_CHECK_VALUE(false, "moekit: ", arg, ": must be one of ", names, ", got \"", value, "\"");
}

Activation parse_act(const std::string& value) {
  Activation a;
  TORCH_CHECK_VALUE(parse_activation(value.c_str(), &a),
                    "moekit: activation: must be silu, gelu or gelu_tanh, got \"", value, "\"");
  return a;
}

Layout parse_layout(const std::string& value, const char* arg) {
  return parse_enum<Layout>(value, arg, layout_name, 3);
}

int to_int(int64_t v, const char* arg) {
  TORCH_CHECK_VALUE(v >= INT32_MIN && v <= INT32_MAX, "moekit: ", arg, ": out of int32 range, got ", v);
  return static_cast<int>(v);
}

}  // namespace

TensorView view_of(const at::Tensor& t, const char* name, Layout layout) {
  DType dt;
  TORCH_CHECK_VALUE(dtype_of(t.scalar_type(), &dt), "moekit: ", name,
                    ": dtype must be float32, bfloat16, float16, float8_e4m3fn, float8_e4m3fnuz or int32, got ",
                    t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() <= kMaxDims, "moekit: ", name, ": at most ", kMaxDims, " dims, got ", t.dim());
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(), "moekit: ", name,
                    ": device must be cpu or cuda, got ", t.device());
  TensorView v;
  v.data = t.numel() > 0 ? t.data_ptr() : nullptr;
  v.dtype = dt;
  v.layout = layout;
  v.device = t.device().is_cuda() ? Device::cuda : Device::cpu;
  v.device_index = t.device().is_cuda() ? t.device().index() : 0;
  if (t.dim() == 0) {
    v.ndim = 1;
    v.shape[0] = 1;
    v.stride[0] = 1;
    return v;
  }
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.stride[i] = t.stride(i);
  }
  return v;
}

TensorView view_of(const std::optional<at::Tensor>& t, const char* name) {
  return t.has_value() ? view_of(*t, name) : TensorView{};
}

void throw_if_error(const Status& s, const char* op) {
  if (s.ok()) return;
  switch (s.code()) {
    case StatusCode::invalid_argument: TORCH_CHECK_VALUE(false, "moekit.", op, ": ", s.message());
    case StatusCode::unsupported: TORCH_CHECK_NOT_IMPLEMENTED(false, "moekit.", op, ": ", s.message());
    // c10::OutOfMemoryError (every torch >= 2.4 that pyproject.toml allows) becomes Python's
    // torch.OutOfMemoryError, a RuntimeError that callers catch to retry smaller.
    case StatusCode::out_of_memory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "moekit.", op, ": out of memory: ", s.message());
    default: TORCH_CHECK(false, "moekit.", op, ": ", status_code_name(s.code()), ": ", s.message());
  }
}

RunOptions run_options(const at::Device& device, const std::optional<std::string>& kernel) {
  RunOptions o;
  o.kernel = kernel.has_value() ? kernel->c_str() : nullptr;
  if (device.is_cuda()) o.stream = current_cuda_stream(device.index());
  return o;
}

at::Tensor attach_workspace(size_t bytes, const at::Device& device, RunOptions* opts) {
  if (bytes == 0) return at::Tensor();
  at::Tensor ws = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
  opts->workspace = ws.data_ptr();
  opts->workspace_bytes = bytes;
  return ws;
}

#ifndef MOEKIT_TORCH_CUDA
void* current_cuda_stream(c10::DeviceIndex) {
  TORCH_CHECK(false, "moekit: this build has no CUDA backend (rebuild with nvcc and a CUDA torch)");
}
#endif

// ------------------------------------------------------------------------------------ routing
namespace {

using OptStr = std::optional<std::string>;
using OptTensor = std::optional<at::Tensor>;

void topk_softmax_impl(const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                       const at::Tensor& token_expert_indices, const at::Tensor& gating_output, bool renormalize,
                       const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(gating_output));
  TopkSoftmaxParams p;
  p.gating = view_of(gating_output, "gating_output");
  p.k = topk_weights.dim() == 2 ? to_int(topk_weights.size(1), "topk_weights.shape[1]") : 0;
  p.renormalize = renormalize;
  p.topk_weights = view_of(topk_weights, "topk_weights");
  p.topk_ids = view_of(topk_ids, "topk_ids");
  p.token_expert_indices = view_of(token_expert_indices, "token_expert_indices");
  throw_if_error(topk_softmax(p, run_options(gating_output.device(), kernel)), "topk_softmax");
}

void grouped_topk_impl(const at::Tensor& topk_weights, const at::Tensor& topk_ids, const at::Tensor& gating_output,
                       const OptTensor& correction_bias, int64_t n_group, int64_t topk_group,
                       const std::string& scoring_func, bool renormalize, double routed_scaling_factor,
                       const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(gating_output));
  GroupedTopkParams p;
  p.gating = view_of(gating_output, "gating_output");
  p.correction_bias = view_of(correction_bias, "correction_bias");
  p.k = topk_weights.dim() == 2 ? to_int(topk_weights.size(1), "topk_weights.shape[1]") : 0;
  p.n_group = to_int(n_group, "n_group");
  p.topk_group = to_int(topk_group, "topk_group");
  p.scoring = parse_enum<Scoring>(scoring_func, "scoring_func", scoring_name, 2);
  p.renormalize = renormalize;
  p.routed_scaling_factor = static_cast<float>(routed_scaling_factor);
  p.topk_weights = view_of(topk_weights, "topk_weights");
  p.topk_ids = view_of(topk_ids, "topk_ids");
  throw_if_error(grouped_topk(p, run_options(gating_output.device(), kernel)), "grouped_topk");
}

void sigmoid_topk_impl(const at::Tensor& topk_weights, const at::Tensor& topk_ids, const at::Tensor& gating_output,
                       const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(gating_output));
  SigmoidTopkParams p;
  p.gating = view_of(gating_output, "gating_output");
  p.k = topk_weights.dim() == 2 ? to_int(topk_weights.size(1), "topk_weights.shape[1]") : 0;
  p.topk_weights = view_of(topk_weights, "topk_weights");
  p.topk_ids = view_of(topk_ids, "topk_ids");
  throw_if_error(sigmoid_topk(p, run_options(gating_output.device(), kernel)), "sigmoid_topk");
}

// ------------------------------------------------------------------------------------ sorting
void sort_tokens_impl(const at::Tensor& sorted_token_ids, const at::Tensor& sorted_weights,
                      const at::Tensor& sorted_expert_ids, const at::Tensor& num_valid, const at::Tensor& topk_ids,
                      const at::Tensor& topk_weights, int64_t num_experts, int64_t block_m,
                      const std::string& encoding, const OptTensor& expert_mask, const OptTensor& expert_map,
                      const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(topk_ids));
  SortTokensParams p;
  p.topk_ids = view_of(topk_ids, "topk_ids");
  p.topk_weights = view_of(topk_weights, "topk_weights");
  p.num_experts = to_int(num_experts, "num_experts");
  p.block_m = to_int(block_m, "block_m");
  p.encoding = parse_enum<SortEncoding>(encoding, "encoding", sort_encoding_name, 2);
  p.expert_mask = view_of(expert_mask, "expert_mask");
  p.expert_map = view_of(expert_map, "expert_map");
  p.sorted_token_ids = view_of(sorted_token_ids, "sorted_token_ids");
  p.sorted_weights = view_of(sorted_weights, "sorted_weights");
  p.sorted_expert_ids = view_of(sorted_expert_ids, "sorted_expert_ids");
  p.num_valid = view_of(num_valid, "num_valid");
  RunOptions opts = run_options(topk_ids.device(), kernel);
  size_t bytes = 0;
  throw_if_error(sort_tokens_workspace_size(p, opts, &bytes), "sort_tokens");
  const at::Tensor ws = attach_workspace(bytes, topk_ids.device(), &opts);
  throw_if_error(sort_tokens(p, opts), "sort_tokens");
}

// ------------------------------------------------------------------------------- quantization
void quantize_fp8_impl(const at::Tensor& out, const at::Tensor& scale, const at::Tensor& input,
                       const std::string& granularity, int64_t group_k, int64_t block_n, const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  QuantizeFp8Params p;
  p.in = view_of(input, "input");
  p.out = view_of(out, "out");
  p.scale = view_of(scale, "scale");
  p.granularity = parse_enum<QuantGranularity>(granularity, "granularity", granularity_name, 4);
  p.group_k = to_int(group_k, "group_k");
  p.block_n = to_int(block_n, "block_n");
  throw_if_error(quantize_fp8(p, run_options(input.device(), kernel)), "quantize_fp8");
}

void quantize_fp8_static_impl(const at::Tensor& out, const at::Tensor& input, const at::Tensor& scale,
                              const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  QuantizeFp8Params p;
  p.in = view_of(input, "input");
  p.out = view_of(out, "out");
  p.scale = view_of(scale, "scale");
  p.granularity = QuantGranularity::per_tensor;
  p.static_scale = true;
  throw_if_error(quantize_fp8(p, run_options(input.device(), kernel)), "quantize_fp8_static");
}

void convert_fp8_impl(const at::Tensor& out, const at::Tensor& scale_out, const at::Tensor& input,
                      const at::Tensor& scale_in, const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  ConvertFp8Params p;
  p.in = view_of(input, "input");
  p.out = view_of(out, "out");
  p.scale_in = view_of(scale_in, "scale_in");
  p.scale_out = view_of(scale_out, "scale_out");
  throw_if_error(convert_fp8(p, run_options(input.device(), kernel)), "convert_fp8");
}

// ------------------------------------------------------------------------------------ layouts
void shuffle_weight_impl(const at::Tensor& out, const at::Tensor& input, const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  ShuffleWeightParams p;
  p.in = view_of(input, "input");
  p.out = view_of(out, "out", Layout::shuffled_16x16);
  throw_if_error(shuffle_weight(p, run_options(input.device(), kernel)), "shuffle_weight");
}

void unshuffle_weight_impl(const at::Tensor& out, const at::Tensor& input, const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  ShuffleWeightParams p;
  p.in = view_of(input, "input", Layout::shuffled_16x16);
  p.out = view_of(out, "out");
  throw_if_error(unshuffle_weight(p, run_options(input.device(), kernel)), "unshuffle_weight");
}

void pack_weight_impl(const at::Tensor& out, const at::Tensor& input, const std::string& layout,
                      const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  PackWeightParams p;
  p.in = view_of(input, "input");
  p.out = view_of(out, "out", parse_layout(layout, "layout"));
  throw_if_error(pack_weight(p, run_options(input.device(), kernel)), "pack_weight");
}

void unpack_weight_impl(const at::Tensor& out, const at::Tensor& input, const std::string& layout,
                        const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(input));
  PackWeightParams p;
  p.in = view_of(input, "input", parse_layout(layout, "layout"));
  p.out = view_of(out, "out");
  throw_if_error(unpack_weight(p, run_options(input.device(), kernel)), "unpack_weight");
}

// ----------------------------------------------------------------------------------- fused MoE
// The params every fused-MoE entry point shares (also used to size the workspace of the AITER-named
// ops, whose adapters fill the same struct).
FusedMoeParams moe_params(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                          const at::Tensor& topk_weights, const at::Tensor& topk_ids, const OptTensor& w1_scale,
                          const OptTensor& w2_scale, const OptTensor& a1_scale, const OptTensor& expert_mask,
                          const std::string& activation, const std::string& weight_layout) {
  const Layout layout = parse_layout(weight_layout, "weight_layout");
  FusedMoeParams p;
  p.x = view_of(x, "hidden_states");
  p.w1 = view_of(w1, "w1", layout);
  p.w2 = view_of(w2, "w2", layout);
  p.topk_weights = view_of(topk_weights, "topk_weights");
  p.topk_ids = view_of(topk_ids, "topk_ids");
  p.out = view_of(out, "out");
  p.w1_scale = view_of(w1_scale, "w1_scale");
  p.w2_scale = view_of(w2_scale, "w2_scale");
  p.a1_scale = view_of(a1_scale, "a1_scale");
  p.expert_mask = view_of(expert_mask, "expert_mask");
  p.activation = parse_act(activation);
  return p;
}

// Sizes and allocates the workspace of `p` on x's device, returning the tensor that owns it.
at::Tensor moe_workspace(const FusedMoeParams& p, const at::Device& device, RunOptions* opts, const char* op) {
  size_t bytes = 0;
  throw_if_error(fused_moe_workspace_size(p, *opts, &bytes), op);
  return attach_workspace(bytes, device, opts);
}

// torch.ops.moekit.fused_moe's arguments (and fused_moe_kernel's) as params.
FusedMoeParams fused_moe_params(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                                const at::Tensor& topk_weights, const at::Tensor& topk_ids, const OptTensor& w1_scale,
                                const OptTensor& w2_scale, const OptTensor& a1_scale, const OptTensor& expert_mask,
                                const OptTensor& expert_map, const std::string& activation,
                                bool apply_router_weight_on_input, int64_t block_n, int64_t block_k,
                                const std::string& weight_layout) {
  FusedMoeParams p = moe_params(out, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, expert_mask,
                                activation, weight_layout);
  p.expert_map = view_of(expert_map, "expert_map");
  p.weight_on_input = apply_router_weight_on_input;
  p.scale_block_n = to_int(block_n, "block_n");
  p.scale_block_k = to_int(block_k, "block_k");
  return p;
}

void fused_moe_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                    const at::Tensor& topk_weights, const at::Tensor& topk_ids, const OptTensor& w1_scale,
                    const OptTensor& w2_scale, const OptTensor& a1_scale, const OptTensor& expert_mask,
                    const OptTensor& expert_map, const std::string& activation, bool apply_router_weight_on_input,
                    int64_t block_n, int64_t block_k, bool round_intermediate, const std::string& weight_layout,
                    const OptStr& kernel, const OptStr& config) {
  const at::OptionalDeviceGuard guard(at::device_of(x));
  FusedMoeParams p = fused_moe_params(out, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale, expert_mask,
                                      expert_map, activation, apply_router_weight_on_input, block_n, block_k,
                                      weight_layout);
  p.round_intermediate = round_intermediate;
  RunOptions opts = run_options(x.device(), kernel);
  if (config) opts.config = config->c_str();  // docs/fused_moe_configs.md
  const at::Tensor ws = moe_workspace(p, x.device(), &opts, "fused_moe");
  throw_if_error(fused_moe(p, opts), "fused_moe");
}

std::string fused_moe_kernel_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1,
                                  const at::Tensor& w2, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                                  const OptTensor& w1_scale, const OptTensor& w2_scale, const OptTensor& a1_scale,
                                  const OptTensor& expert_mask, const OptTensor& expert_map,
                                  const std::string& activation, bool apply_router_weight_on_input, int64_t block_n,
                                  int64_t block_k, const std::string& weight_layout, const OptStr& kernel,
                                  const OptStr& config) {
  const at::OptionalDeviceGuard guard(at::device_of(x));
  const FusedMoeParams p = fused_moe_params(out, x, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, a1_scale,
                                            expert_mask, expert_map, activation, apply_router_weight_on_input,
                                            block_n, block_k, weight_layout);
  RunOptions opts = run_options(x.device(), kernel);
  if (config) opts.config = config->c_str();
  std::string name;
  throw_if_error(fused_moe_kernel_name(p, opts, &name), "fused_moe_kernel");
  return name;
}

void ck_moe_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                 const at::Tensor& topk_weights, const at::Tensor& topk_ids, const std::string& activation,
                 const OptTensor& expert_mask, const std::string& weight_layout, const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(x));
  const FusedMoeParams p = moe_params(out, x, w1, w2, topk_weights, topk_ids, std::nullopt, std::nullopt,
                                      std::nullopt, expert_mask, activation, weight_layout);
  RunOptions opts = run_options(x.device(), kernel);
  // NOTE: the adapter rejects fp8 weights itself; sizing first would report a less helpful error.
  const at::Tensor ws = is_fp8(p.w1.dtype) ? at::Tensor() : moe_workspace(p, x.device(), &opts, "ck_moe");
  throw_if_error(aiter::ck_moe(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, p.out, p.activation, p.expert_mask, opts),
                 "ck_moe");
}

void asm_moe_common(const char* op, bool tkw1, const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1,
                    const at::Tensor& w2, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                    const at::Tensor& fc1_scale, const at::Tensor& fc2_scale, const OptTensor& a1_scale,
                    const OptTensor& expert_mask, const std::string& activation, const std::string& weight_layout,
                    const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(x));
  FusedMoeParams p = moe_params(out, x, w1, w2, topk_weights, topk_ids, fc1_scale, fc2_scale, a1_scale, expert_mask,
                                activation, weight_layout);
  p.weight_on_input = tkw1;
  RunOptions opts = run_options(x.device(), kernel);
  const at::Tensor ws = is_fp8(p.w1.dtype) ? moe_workspace(p, x.device(), &opts, op) : at::Tensor();
  const auto fn = tkw1 ? aiter::asm_moe_tkw1 : aiter::asm_moe;
  throw_if_error(fn(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, p.w1_scale, p.w2_scale, p.out, p.a1_scale,
                    p.expert_mask, p.activation, opts),
                 op);
}

void asm_moe_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                  const at::Tensor& topk_weights, const at::Tensor& topk_ids, const at::Tensor& fc1_scale,
                  const at::Tensor& fc2_scale, const OptTensor& a1_scale, const OptTensor& expert_mask,
                  const std::string& activation, const std::string& weight_layout, const OptStr& kernel) {
  asm_moe_common("asm_moe", false, out, x, w1, w2, topk_weights, topk_ids, fc1_scale, fc2_scale, a1_scale,
                 expert_mask, activation, weight_layout, kernel);
}

void asm_moe_tkw1_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                       const at::Tensor& topk_weights, const at::Tensor& topk_ids, const at::Tensor& fc1_scale,
                       const at::Tensor& fc2_scale, const OptTensor& a1_scale, const OptTensor& expert_mask,
                       const std::string& activation, const std::string& weight_layout, const OptStr& kernel) {
  asm_moe_common("asm_moe_tkw1", true, out, x, w1, w2, topk_weights, topk_ids, fc1_scale, fc2_scale, a1_scale,
                 expert_mask, activation, weight_layout, kernel);
}

void fmoe_fp8_blockscale_g1u1_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w1,
                                   const at::Tensor& w2, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                                   const at::Tensor& fc1_scale, const at::Tensor& fc2_scale, int64_t block_n,
                                   int64_t block_k, const OptTensor& expert_mask, const std::string& activation,
                                   const std::string& weight_layout, const OptStr& kernel) {
  const at::OptionalDeviceGuard guard(at::device_of(x));
  const char* op = "fmoe_fp8_blockscale_g1u1";
  FusedMoeParams p = moe_params(out, x, w1, w2, topk_weights, topk_ids, fc1_scale, fc2_scale, std::nullopt,
                                expert_mask, activation, weight_layout);
  p.scale_block_n = to_int(block_n, "block_n");
  p.scale_block_k = to_int(block_k, "block_k");
  RunOptions opts = run_options(x.device(), kernel);
  const bool sizable = is_fp8(p.w1.dtype) && p.scale_block_n > 0 && p.scale_block_k > 0;
  const at::Tensor ws = sizable ? moe_workspace(p, x.device(), &opts, op) : at::Tensor();
  throw_if_error(aiter::fmoe_fp8_blockscale_g1u1(p.x, p.w1, p.w2, p.topk_weights, p.topk_ids, p.w1_scale,
                                                 p.w2_scale, p.out, p.scale_block_n, p.scale_block_k,
                                                 p.expert_mask, p.activation, opts),
                 op);
}

}  // namespace

void register_impls(torch::Library& m) {
  m.impl("topk_softmax", &topk_softmax_impl);
  m.impl("grouped_topk", &grouped_topk_impl);
  m.impl("sigmoid_topk", &sigmoid_topk_impl);
  m.impl("sort_tokens", &sort_tokens_impl);
  m.impl("quantize_fp8", &quantize_fp8_impl);
  m.impl("quantize_fp8_static", &quantize_fp8_static_impl);
  m.impl("convert_fp8", &convert_fp8_impl);
  m.impl("shuffle_weight", &shuffle_weight_impl);
  m.impl("unshuffle_weight", &unshuffle_weight_impl);
  m.impl("pack_weight", &pack_weight_impl);
  m.impl("unpack_weight", &unpack_weight_impl);
  m.impl("fused_moe", &fused_moe_impl);
  m.impl("fused_moe_kernel", &fused_moe_kernel_impl);
  m.impl("ck_moe", &ck_moe_impl);
  m.impl("asm_moe", &asm_moe_impl);
  m.impl("asm_moe_tkw1", &asm_moe_tkw1_impl);
  m.impl("fmoe_fp8_blockscale_g1u1", &fmoe_fp8_blockscale_g1u1_impl);
}

}  // namespace moekit::torch_binding

TORCH_LIBRARY_IMPL(moekit, CPU, m) { moekit::torch_binding::register_impls(m); }

// torch.ops.moekit.set_num_threads(n) / num_threads(): the CPU kernels' thread count
// (moekit/threads.h). No tensors, so one catch-all kernel each; the Python package calls
// set_num_threads to follow torch.get_num_threads() (python/moekit/api.py, _follow_torch_threads).
TORCH_LIBRARY_FRAGMENT(moekit, m) {
  m.def("set_num_threads(int n) -> ()", [](int64_t n) {
    TORCH_CHECK_VALUE(n >= 1 && n <= (int64_t(1) << 30), "moekit.set_num_threads: n must be >= 1, got ", n);
    moekit::torch_binding::throw_if_error(moekit::set_num_threads(static_cast<int>(n)), "set_num_threads");
  });
  m.def("num_threads() -> int", []() -> int64_t { return moekit::num_threads(); });
}

// torch.ops.moekit_testing.raise_status(code, message): raises what throw_if_error makes of a
// Status with that StatusCode value, so tests/python can check the mapping of every code (the
// library has no input that fails with out_of_memory or internal on demand). Not part of the API.
TORCH_LIBRARY(moekit_testing, m) {
  m.def("raise_status(int code, str message) -> ()", [](int64_t code, const std::string& message) {
    TORCH_CHECK_VALUE(code > 0 && code <= static_cast<int64_t>(moekit::StatusCode::out_of_memory),
                      "moekit_testing.raise_status: code must be a failing StatusCode value, got ", code);
    moekit::torch_binding::throw_if_error(moekit::Status(static_cast<moekit::StatusCode>(code), message),
                                          "raise_status");
  });
}
