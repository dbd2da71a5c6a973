// libFuzzer target of config.json loading (ModelConfig::parse, include/moekit/model/runner.h; the
// text MoeModel::load reads through src/model/model_io.h): any input must parse or be rejected with
// a Status -- never crash, overflow the stack on deep JSON or throw -- and an accepted config must
// satisfy what the runner relies on. Build and run (clang; the seeds are the bundled models'
// config.json -- transformers' mixtral, deepseek_v3 and llama4_text -- plus edge cases; new inputs go
// to the first, scratch, folder):
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMOEKIT_FUZZ=ON -DMOEKIT_CUDA=OFF \
//         -DMOEKIT_BUILD_TESTS=OFF -DMOEKIT_BUILD_TOOLS=OFF && cmake --build build-fuzz --target fuzz_config
//   mkdir -p /tmp/corpus_config && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
//     ./build-fuzz/fuzz_config -max_total_time=300 -jobs=1 /tmp/corpus_config tests/fuzz/corpus_config
// Results: docs/models.md ("The C++ model runner").
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "moekit/model/runner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using moekit::model::Family;
  moekit::model::ModelConfig c;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!moekit::model::ModelConfig::parse(text, &c).ok()) return 0;
  // What MoeModel::load and the decoder assume of an accepted config.
  const bool ok = c.vocab_size >= 1 && c.hidden_size >= 1 && c.num_hidden_layers >= 1 && c.head_dim >= 2 &&
                  c.head_dim % 2 == 0 && c.num_attention_heads % c.num_key_value_heads == 0 &&
                  c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts && c.pad_token_id < c.vocab_size &&
                  c.bos_token_id < c.vocab_size && c.eos_token_id < c.vocab_size && c.rms_norm_eps > 0 &&
                  c.rope_theta > 0 && c.moe_intermediate_size >= 1 &&
                  (c.family != Family::llama4 || (c.num_experts_per_tok == 1 && c.shared_expert && c.rope_interleave)) &&
                  (c.family != Family::mixtral || !c.rope_interleave) &&
                  (c.family != Family::deepseek ||
                   (c.num_experts % c.n_group == 0 && c.topk_group <= c.n_group &&
                    c.num_key_value_heads == c.num_attention_heads && c.kv_lora_rank >= 1 && c.qk_nope_head_dim >= 1 &&
                    c.v_head_dim >= 1 && c.head_dim == c.qk_rope_head_dim));
  if (!ok) std::abort();
  return 0;
}
