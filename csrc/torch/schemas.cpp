// csrc/torch/schemas.cpp: the schema of every torch.ops.moekit op, defined once.
//
// Conventions (vLLM / AITER style, so a call is CUDA-graph safe and allocation-free):
//   - outputs are caller-allocated and come first, marked `Tensor(x!)` (mutated); ops return ().
//     The Python API (python/moekit/api.py) allocates them and returns them.
//   - `str? kernel_name=None` forces one registered kernel by name (the explicit argument of SPEC 6);
//     None = the normal selection (MOEKIT_FORCE_KERNEL > MOEKIT_BACKEND > priority).
//     NOTE: not called `kernel`: Inductor passes an op's arguments as keywords to a function that
//     has its own `kernel` parameter, so torch.compile would fail on that name.
//   - weight layouts ("row_major", "shuffled_16x16", "cpu_vnni2_n32") are explicit arguments: the
//     tag travels with the call, never guessed from the data (SPEC 4).
// The contracts are those of include/moekit/ops/*.h and include/moekit/aiter.h (docs/spec.md
// sections, cited as SPEC n). Fake implementations for torch.compile: python/moekit/_ops.py. Tests:
// tests/python/test_ops.py.
#include <torch/library.h>

TORCH_LIBRARY(moekit, m) {
  // ---- routing (SPEC 1) ----
  m.def(
      "topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor(c!) token_expert_indices, "
      "Tensor gating_output, bool renormalize, str? kernel_name=None) -> ()");
  m.def(
      "grouped_topk(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor gating_output, "
      "Tensor? correction_bias, int n_group, int topk_group, str scoring_func, bool renormalize, "
      "float routed_scaling_factor, str? kernel_name=None) -> ()");
  m.def("sigmoid_topk(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor gating_output, str? kernel_name=None) -> ()");

  // ---- token sorting (SPEC 2); sizes: moekit.sort_tokens_max_padded / _max_blocks ----
  m.def(
      "sort_tokens(Tensor(a!) sorted_token_ids, Tensor(b!) sorted_weights, Tensor(c!) sorted_expert_ids, "
      "Tensor(d!) num_valid, Tensor topk_ids, Tensor topk_weights, int num_experts, int block_m, "
      "str encoding=\"packed\", Tensor? expert_mask=None, Tensor? expert_map=None, str? kernel_name=None) -> ()");

  // ---- quantization (SPEC 5) ----
  // granularity: per_tensor | per_row | per_token_group | block; group_k = group / block width.
  m.def(
      "quantize_fp8(Tensor(a!) out, Tensor(b!) scale, Tensor input, str granularity, int group_k=128, "
      "int block_n=128, str? kernel_name=None) -> ()");
  // per_tensor with a given (static) scale: q = fp8(input / scale[0]).
  m.def("quantize_fp8_static(Tensor(a!) out, Tensor input, Tensor scale, str? kernel_name=None) -> ()");
  // e4m3fnuz <-> e4m3fn checkpoint conversion; the direction is read from the dtypes.
  m.def("convert_fp8(Tensor(a!) out, Tensor(b!) scale_out, Tensor input, Tensor scale_in, str? kernel_name=None) -> ()");

  // ---- weight layouts (SPEC 4) ----
  m.def("shuffle_weight(Tensor(a!) out, Tensor input, str? kernel_name=None) -> ()");
  m.def("unshuffle_weight(Tensor(a!) out, Tensor input, str? kernel_name=None) -> ()");
  m.def("pack_weight(Tensor(a!) out, Tensor input, str layout=\"cpu_vnni2_n32\", str? kernel_name=None) -> ()");
  m.def("unpack_weight(Tensor(a!) out, Tensor input, str layout=\"cpu_vnni2_n32\", str? kernel_name=None) -> ()");

  // ---- fused MoE (SPEC 3); the variant is read from the data (SPEC 6) ----
  m.def(
      "fused_moe(Tensor(a!) out, Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
      "Tensor topk_ids, Tensor? w1_scale=None, Tensor? w2_scale=None, Tensor? a1_scale=None, "
      "Tensor? expert_mask=None, Tensor? expert_map=None, str activation=\"silu\", "
      "bool apply_router_weight_on_input=False, int block_n=0, int block_k=0, "
      "bool round_intermediate=True, str weight_layout=\"row_major\", str? kernel_name=None, "
      "str? config=None) -> ()");
  // The kernel fused_moe would run for these arguments (nothing is written): for engines' logs.
  m.def(
      "fused_moe_kernel(Tensor out, Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
      "Tensor topk_ids, Tensor? w1_scale=None, Tensor? w2_scale=None, Tensor? a1_scale=None, "
      "Tensor? expert_mask=None, Tensor? expert_map=None, str activation=\"silu\", "
      "bool apply_router_weight_on_input=False, int block_n=0, int block_k=0, "
      "str weight_layout=\"row_major\", str? kernel_name=None, str? config=None) -> str");

  // ---- AITER names (include/moekit/aiter.h) ----
  m.def(
      "ck_moe(Tensor(a!) out, Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
      "Tensor topk_ids, str activation=\"silu\", Tensor? expert_mask=None, "
      "str weight_layout=\"row_major\", str? kernel_name=None) -> ()");
  m.def(
      "asm_moe(Tensor(a!) out, Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
      "Tensor topk_ids, Tensor fc1_scale, Tensor fc2_scale, Tensor? a1_scale=None, "
      "Tensor? expert_mask=None, str activation=\"silu\", str weight_layout=\"row_major\", "
      "str? kernel_name=None) -> ()");
  m.def(
      "asm_moe_tkw1(Tensor(a!) out, Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
      "Tensor topk_ids, Tensor fc1_scale, Tensor fc2_scale, Tensor? a1_scale=None, "
      "Tensor? expert_mask=None, str activation=\"silu\", str weight_layout=\"row_major\", "
      "str? kernel_name=None) -> ()");
  m.def(
      "fmoe_fp8_blockscale_g1u1(Tensor(a!) out, Tensor hidden_states, Tensor w1, Tensor w2, "
      "Tensor topk_weights, Tensor topk_ids, Tensor fc1_scale, Tensor fc2_scale, int block_n=128, "
      "int block_k=128, Tensor? expert_mask=None, str activation=\"silu\", "
      "str weight_layout=\"row_major\", str? kernel_name=None) -> ()");
}
