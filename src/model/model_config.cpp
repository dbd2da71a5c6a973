// config.json of the bundled models (include/moekit/model/runner.h, ModelConfig): the keys written by
// tools/train/model.py ModelConfig.hf_config() for the three families. Every missing or ill-typed
// key is an InvalidArgument naming it; JSON nested deeper than 64 levels is refused before parsing.
// Tests: tests/test_model_runner.cpp (ModelRunner.Config*, ModelRunner.RejectsOversizedAndDeepConfig).
#include <string>

#include <nlohmann/json.hpp>

#include "model/model_io.h"
#include "moekit/model/runner.h"

namespace moekit::model {

namespace {

Status get_int(const nlohmann::json& j, const char* key, int lo, int hi, int* out) {
  const auto it = j.find(key);
  if (it == j.end()) return InvalidArgument("config.json: missing key '", key, "'");
  if (!it->is_number_integer()) {
    return InvalidArgument("config.json: '", key, "' must be an integer, got ", short_dump(*it));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return InvalidArgument("config.json: '", key, "' = ", v, " is outside [", lo, ", ", hi, "]");
  *out = int(v);
  return Status::Ok();
}

Status get_float(const nlohmann::json& j, const char* key, float* out) {
  const auto it = j.find(key);
  if (it == j.end()) return InvalidArgument("config.json: missing key '", key, "'");
  if (!it->is_number()) return InvalidArgument("config.json: '", key, "' must be a number, got ", short_dump(*it));
  const double v = it->get<double>();
  if (!(v > 0.0) || v > 1e30) return InvalidArgument("config.json: '", key, "' = ", v, " must be finite and > 0");
  *out = float(v);
  return Status::Ok();
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::mixtral: return "mixtral";
    case Family::deepseek: return "deepseek";
    case Family::llama4: return "llama4";
  }
  return "?";
}

namespace {

Status parse_config(const std::string& json_text, ModelConfig* out) {
  MOEKIT_RETURN_IF_ERROR(check_json_depth("config.json", json_text.data(), json_text.size()));
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("config.json: the ", json_text.size(), "-byte text is not valid JSON");
  if (!j.is_object()) return InvalidArgument("config.json: must be a JSON object, got ", j.type_name());
  ModelConfig c;
  const auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return InvalidArgument("config.json: missing string key 'model_type'");
  c.model_type = mt->get<std::string>();
  if (c.model_type == "mixtral") {
    c.family = Family::mixtral;
  } else if (c.model_type == "moekit_deepseek_v3") {
    c.family = Family::deepseek;
  } else if (c.model_type == "moekit_llama4_text") {
    c.family = Family::llama4;
  } else {
    return InvalidArgument("config.json: model_type '", c.model_type,
                           "' is not one of mixtral, moekit_deepseek_v3, moekit_llama4_text");
  }
  constexpr int kBig = 1 << 20;
  MOEKIT_RETURN_IF_ERROR(get_int(j, "vocab_size", 1, kBig, &c.vocab_size));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "hidden_size", 1, kBig, &c.hidden_size));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_hidden_layers", 1, 1024, &c.num_hidden_layers));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_attention_heads", 1, 1024, &c.num_attention_heads));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_key_value_heads", 1, 1024, &c.num_key_value_heads));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "head_dim", 2, 4096, &c.head_dim));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_experts_per_tok", 1, 1024, &c.num_experts_per_tok));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "max_position_embeddings", 1, kBig, &c.max_position_embeddings));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "pad_token_id", 0, kBig, &c.pad_token_id));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "bos_token_id", 0, kBig, &c.bos_token_id));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "eos_token_id", 0, kBig, &c.eos_token_id));
  MOEKIT_RETURN_IF_ERROR(get_float(j, "rms_norm_eps", &c.rms_norm_eps));
  MOEKIT_RETURN_IF_ERROR(get_float(j, "rope_theta", &c.rope_theta));
  if (c.family == Family::deepseek) {
    MOEKIT_RETURN_IF_ERROR(get_int(j, "n_routed_experts", 1, 1024, &c.num_experts));
    MOEKIT_RETURN_IF_ERROR(get_int(j, "moe_intermediate_size", 1, kBig, &c.moe_intermediate_size));
    int shared = 0;
    MOEKIT_RETURN_IF_ERROR(get_int(j, "n_shared_experts", 0, 1, &shared));
    c.shared_expert = shared == 1;
    MOEKIT_RETURN_IF_ERROR(get_int(j, "n_group", 1, 1024, &c.n_group));
    MOEKIT_RETURN_IF_ERROR(get_int(j, "topk_group", 1, 1024, &c.topk_group));
    MOEKIT_RETURN_IF_ERROR(get_float(j, "routed_scaling_factor", &c.routed_scaling_factor));
  } else {
    MOEKIT_RETURN_IF_ERROR(get_int(j, "num_local_experts", 1, 1024, &c.num_experts));
    MOEKIT_RETURN_IF_ERROR(get_int(j, "intermediate_size", 1, kBig, &c.moe_intermediate_size));
    if (c.family == Family::llama4) {
      const auto se = j.find("shared_expert");
      if (se == j.end() || !se->is_boolean()) return InvalidArgument("config.json: missing boolean key 'shared_expert'");
      c.shared_expert = se->get<bool>();
    }
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgument("config.json: num_attention_heads ", c.num_attention_heads,
                           " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  }
  if (c.head_dim % 2 != 0) return InvalidArgument("config.json: head_dim ", c.head_dim, " must be even (RoPE pairs)");
  if (c.num_experts_per_tok > c.num_experts) {
    return InvalidArgument("config.json: num_experts_per_tok ", c.num_experts_per_tok, " exceeds the ", c.num_experts,
                           " experts");
  }
  if (c.family == Family::deepseek &&
      (c.num_experts % c.n_group != 0 || c.topk_group > c.n_group ||
       c.num_experts_per_tok > c.topk_group * (c.num_experts / c.n_group))) {
    return InvalidArgument("config.json: n_group ", c.n_group, " / topk_group ", c.topk_group, " / k ",
                           c.num_experts_per_tok, " do not fit ", c.num_experts, " experts");
  }
  if (c.family == Family::llama4 && c.num_experts_per_tok != 1) {
    return InvalidArgument("config.json: llama4 routing is top-1, got num_experts_per_tok ", c.num_experts_per_tok);
  }
  for (int id : {c.pad_token_id, c.bos_token_id, c.eos_token_id}) {
    if (id >= c.vocab_size) return InvalidArgument("config.json: special token id ", id, " >= vocab_size ", c.vocab_size);
  }
  *out = c;
  return Status::Ok();
}

}  // namespace

Status ModelConfig::parse(const std::string& json_text, ModelConfig* out) {
  return no_throw("config.json", [&]() -> Status { return parse_config(json_text, out); });
}

}  // namespace moekit::model
