// The model runner (issue 7): the bundled tiny MoE decoders (models/<name>/, docs/models.md), which are
// Hugging Face transformers checkpoints (config.json, model.safetensors, tokenizer.json), run in
// C++ with moekit's routing and fused_moe ops for every MoE layer, on the ref, cpu or cuda backend
// (cuda: the expert weights live on the device, the routing op and fused_moe run there, the rest
// of the decoder stays on the host), in f32, bf16 or any fp8 scheme (expert weights quantized at
// load with quantize_fp8).
//
// The decoder is transformers' for each model_type (and tools/train/model.py, the PyTorch
// reference, mirrors it): token embedding; per layer x += attn(rmsnorm(x)), x += moe(rmsnorm(x));
// logits = lm_head(rmsnorm(x)). RoPE everywhere: the default type, inv_freq[i] = theta^(-2i/d) (f32),
// pair i rotated by pos * inv_freq[i]. Attention, causal with a KV cache, per family:
//   mixtral      (MixtralForCausalLM) grouped-query attention, q/k/v/o_proj; RoPE on rotate-half
//                pairs (i, i + d/2), d = head_dim; scores * 1/sqrt(head_dim).
//   llama4_text  (Llama4ForCausalLM) the same projections; RoPE as transformers' complex product, on
//                interleaved pairs (2i, 2i+1): x'[2i] = x[2i] cos - x[2i+1] sin,
//                x'[2i+1] = x[2i+1] cos + x[2i] sin. QK norm, NoPE layers, chunked attention and
//                dense layers are refused at load.
//   deepseek_v3  (DeepseekV3ForCausalLM) Multi-head Latent Attention without q LoRA; nh heads,
//                dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim, R = kv_lora_rank,
//                dq = dn + dr. Per token (x the normed input):
//                  q = q_proj x [nh*dq], head h = [q_nope (dn) | q_rot (dr)];
//                  [c (R) | k_rot (dr)] = kv_a_proj_with_mqa x; c = rmsnorm(c, kv_a_layernorm,
//                  eps 1e-6: transformers' default, not rms_norm_eps);
//                  kv_b_proj c [nh*(dn+dv)], head h = [k_nope (dn) | v (dv)];
//                  RoPE over dr dims (d = dr) on every q_rot and on the one k_rot all heads share,
//                  interleaved pairs when rope_interleave (the default), else rotate-half;
//                  key of head h = [k_nope_h | k_rot]; scores * 1/sqrt(dq); o_proj on [nh*dv].
//                The cache holds the expanded keys [nh*dq] and values [nh*dv] of every position.
// Attention, norms and the head run in f32 on the checkpoint's bf16 values; the MoE block calls
//   mixtral   topk_softmax (renormalize) -> fused_moe
//   deepseek  grouped_topk (sigmoid, correction bias, n_group / topk_group, renormalize, rsf)
//             -> fused_moe, + the shared expert (fused_moe with E = 1, weight 1)
//   llama4    sigmoid_topk (k = 1) -> fused_moe with the router weight on the input, + shared expert
// Checkpoint tensors (model.layers.L. prefix; all BF16, F16 or F32; nothing else may be in the file):
//   model.embed_tokens.weight [V, H], lm_head.weight [V, H], model.norm.weight [H];
//   input_layernorm.weight, post_attention_layernorm.weight [H];
//   mixtral, llama4: self_attn.q_proj.weight [nh*hd, H], k_proj / v_proj [nkv*hd, H], o_proj [H, nh*hd];
//   deepseek: self_attn.q_proj.weight [nh*dq, H], kv_a_proj_with_mqa.weight [R+dr, H],
//     kv_a_layernorm.weight [R], kv_b_proj.weight [nh*(dn+dv), R], o_proj.weight [H, nh*dv];
//   mixtral: block_sparse_moe.gate.weight [E, H], block_sparse_moe.experts.N.{w1,w3} [I, H], w2 [H, I];
//   deepseek: mlp.gate.weight [E, H], mlp.gate.e_score_correction_bias [E], mlp.experts.N.{gate,up}_proj
//     [I, H], down_proj [H, I], mlp.shared_experts.* likewise (when n_shared_experts is 1);
//   llama4: feed_forward.router.weight [E, H], feed_forward.experts.gate_up_proj [E, H, 2I] (x @ it =
//     [gate | up]), feed_forward.experts.down_proj [E, I, H], feed_forward.shared_expert.* as deepseek.
// Decoding: every sequence has its own KV cache and position; each step runs all live sequences of a
// batch through one batched call per op (the MoE sees the whole batch), prompts are fed one token
// per step (a sequence whose prompt is longer keeps feeding it while others generate).
// Tests: tests/test_model_runner.cpp (logits against the PyTorch reference of the smoke models, the
// trained models' greedy completions, config.json and load errors).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/model/tokenizer.h"
#include "moekit/registry.h"

namespace moekit::model {

enum class Family : uint8_t { mixtral, deepseek, llama4 };
const char* family_name(Family f);

// config.json of a bundled model: transformers' keys of the family (src/model/model_config.cpp lists
// what each family requires and refuses).
struct ModelConfig {
  Family family = Family::mixtral;
  std::string model_type;                            // "mixtral", "deepseek_v3" or "llama4_text"
  int vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int num_attention_heads = 0, num_key_value_heads = 0;
  int head_dim = 0;                                  // RoPE dims per head (deepseek: qk_rope_head_dim)
  int num_experts = 0, num_experts_per_tok = 0;
  int moe_intermediate_size = 0;                     // I of a routed and of the shared expert
  bool shared_expert = false;                        // deepseek: n_shared_experts == 1; llama4: always
  int n_group = 1, topk_group = 1;                   // deepseek routing groups
  float routed_scaling_factor = 1.0f;
  int kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;  // deepseek MLA, else 0
  // RoPE pairs (2i, 2i+1) (llama4; deepseek's rope_interleave) or rotate-half (i, i + d/2) (mixtral).
  bool rope_interleave = false;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;                       // rope_parameters.rope_theta or rope_theta
  int max_position_embeddings = 0;
  int pad_token_id = 0, bos_token_id = 1, eos_token_id = 2;

  // Parses config.json text; every missing or bad key is an InvalidArgument naming it.
  static Status parse(const std::string& json_text, ModelConfig* out);
};

// Weight precision of the experts (attention, norms and the head always run in f32).
enum class ModelScheme : uint8_t { f32, bf16, fp8_tensor, fp8_channel, fp8_block };
const char* model_scheme_name(ModelScheme s);
bool parse_model_scheme(const std::string& s, ModelScheme* out);

struct RunnerOptions {
  Backend backend = Backend::cpu;       // ref, cpu or cuda (kernels of that backend for every op)
  ModelScheme scheme = ModelScheme::bf16;
};

class MoeModel {
 public:
  // Loads models/<name>/ (config.json, model.safetensors, tokenizer.json): every tensor checked for
  // name, dtype and shape, and a tensor the config does not use (e.g. a config with fewer layers
  // than the checkpoint) is an InvalidArgument naming it; the experts stacked as fused_moe wants
  // them ([E, 2I, H] gate rows then up rows, [E, H, I]) and quantized per the scheme; config.json's
  // vocab_size, bos_token_id and eos_token_id must agree with tokenizer.json. An empty
  // `dir`, a file that is not a regular file, a JSON file over 64 MiB or nested deeper than 64 levels
  // are InvalidArguments naming the path; a model the machine cannot hold is OutOfMemory.
  // Nothing here (nor logits / generate) throws.
  static Status load(const std::string& dir, const RunnerOptions& opts, std::unique_ptr<MoeModel>* out);
  ~MoeModel();

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;

  // Teacher-forced logits of one sequence: (*logits)[s * vocab + v] for positions 0..ids.size()-1.
  Status logits(const std::vector<int32_t>& ids, std::vector<float>* logits);

  // Greedy decoding: for each prompt (ids, bos included) up to max_new tokens, stopping at eos (not
  // included in the output) or at max_position_embeddings. Ties go to the lowest id. `batch`
  // sequences advance together; progress(done, total) is called after every finished batch.
  Status generate(const std::vector<std::vector<int32_t>>& prompts, int max_new, int batch,
                  std::vector<std::vector<int32_t>>* out,
                  const std::function<void(size_t, size_t)>& progress = nullptr);

 private:
  struct Impl;
  explicit MoeModel(std::unique_ptr<Impl> impl);
  Status generate_checked(const std::vector<std::vector<int32_t>>& prompts, int max_new, int batch,
                          std::vector<std::vector<int32_t>>* out, const std::function<void(size_t, size_t)>& progress);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit::model
