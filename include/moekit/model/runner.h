// The model runner (issue 7): the bundled tiny MoE decoders (models/<name>/, docs/models.md) run in
// C++ with moekit's routing and fused_moe ops for every MoE layer, on the ref, cpu or cuda backend
// (cuda: the expert weights live on the device, the routing op and fused_moe run there, the rest
// of the decoder stays on the host), in f32, bf16 or any fp8 scheme (expert weights quantized at
// load with quantize_fp8).
//
// The decoder mirrors tools/train/model.py (the PyTorch reference): token embedding; per layer
// x += attn(rmsnorm(x)) (grouped-query attention, Hugging Face RoPE with rotate-half pairing, causal,
// a KV cache), x += moe(rmsnorm(x)); logits = lm_head(rmsnorm(x)). Attention, norms and the head run
// in f32 on the checkpoint's bf16 values; the MoE block calls
//   mixtral   topk_softmax (renormalize) -> fused_moe
//   deepseek  grouped_topk (sigmoid, correction bias, n_group / topk_group, renormalize, rsf)
//             -> fused_moe, + the shared expert (fused_moe with E = 1, weight 1)
//   llama4    sigmoid_topk (k = 1) -> fused_moe with the router weight on the input, + shared expert
// Decoding: every sequence has its own KV cache and position; each step runs all live sequences of a
// batch through one batched call per op (the MoE sees the whole batch), prompts are fed one token
// per step (a sequence whose prompt is longer keeps feeding it while others generate).
// Tests: tests/test_model_runner.cpp (logits against the PyTorch reference of the smoke models).
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

// config.json of a bundled model (the keys of tools/train/model.py ModelConfig.hf_config()).
struct ModelConfig {
  Family family = Family::mixtral;
  std::string model_type;
  int vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  bool shared_expert = false;
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  float rms_norm_eps = 1e-5f, rope_theta = 10000.0f;
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
  // them ([E, 2I, H] gate rows then up rows, [E, H, I]) and quantized per the scheme. An empty
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
