// config.json of the bundled models (include/moekit/model/runner.h, ModelConfig): transformers' keys
// of MixtralForCausalLM, DeepseekV3ForCausalLM and Llama4ForCausalLM as tools/train/model.py
// ModelConfig.hf_config() writes them. Every missing, ill-typed or out-of-range key is an
// InvalidArgument naming it, and so is every transformers feature the runner does not implement
// (q LoRA, dense first layers, QK norm, NoPE layers, chunked attention, RoPE scaling, ...), so a
// config.json the runner accepts means the same model to transformers. JSON nested deeper than 64
// levels is refused before parsing.
// Tests: tests/test_model_runner.cpp (ModelRunner.Config*, ModelRunner.RejectsOversizedAndDeepConfig);
// fuzzing: tests/fuzz/fuzz_config.cpp.
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model_io.h"
#include "moekit/model/runner.h"

namespace moekit::model {

namespace {

constexpr int kBig = 1 << 20;

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

// A number > 0 at j[key]; `name` is the key as messages show it ("rope_parameters.rope_theta").
Status get_float(const nlohmann::json& j, const char* key, float* out, const std::string& name = "") {
  const std::string n = name.empty() ? key : name;
  const auto it = j.find(key);
  if (it == j.end()) return InvalidArgument("config.json: missing key '", n, "'");
  if (!it->is_number()) return InvalidArgument("config.json: '", n, "' must be a number, got ", short_dump(*it));
  const double v = it->get<double>();
  if (!(v > 0.0) || v > 1e30) return InvalidArgument("config.json: '", n, "' = ", v, " must be finite and > 0");
  *out = float(v);
  return Status::Ok();
}

// A boolean key; `dflt` when absent (transformers' default).
Status get_bool(const nlohmann::json& j, const char* key, bool dflt, bool* out) {
  const auto it = j.find(key);
  if (it == j.end()) {
    *out = dflt;
    return Status::Ok();
  }
  if (!it->is_boolean()) return InvalidArgument("config.json: '", key, "' must be true or false, got ", short_dump(*it));
  *out = it->get<bool>();
  return Status::Ok();
}

// A boolean key the runner needs to be `want` (absent: transformers' default `dflt`).
Status require_bool(const nlohmann::json& j, const char* key, bool dflt, bool want, const char* why) {
  bool v = dflt;
  MOEKIT_RETURN_IF_ERROR(get_bool(j, key, dflt, &v));
  if (v != want) {
    return InvalidArgument("config.json: '", key, "' = ", v ? "true" : "false",
                           j.contains(key) ? "" : " (transformers' default)", " is not supported: ", why);
  }
  return Status::Ok();
}

// An optional string key that, when present, must be `want`.
Status optional_string(const nlohmann::json& j, const char* key, const char* want, bool required = false) {
  const auto it = j.find(key);
  if (it == j.end()) {
    return required ? InvalidArgument("config.json: missing key '", key, "' (want \"", want, "\")") : Status::Ok();
  }
  if (!it->is_string() || it->get<std::string>() != want) {
    return InvalidArgument("config.json: '", key, "' ", short_dump(*it), " is not supported (want \"", want, "\")");
  }
  return Status::Ok();
}

// The RoPE base: "rope_parameters": {"rope_type": "default", "rope_theta": x} (transformers 5) or a
// top-level "rope_theta"; any other RoPE type or a rope_scaling is refused (the runner implements
// the default RoPE only).
Status parse_rope(const nlohmann::json& j, float* theta) {
  const auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && !scaling->is_null()) {
    return InvalidArgument("config.json: 'rope_scaling' ", short_dump(*scaling),
                           " is not supported (the runner implements the default RoPE only)");
  }
  const auto params = j.find("rope_parameters");
  if (params == j.end() || params->is_null()) return get_float(j, "rope_theta", theta);
  if (!params->is_object()) {
    return InvalidArgument("config.json: 'rope_parameters' must be an object {\"rope_type\": \"default\", "
                           "\"rope_theta\": ...}, got ", short_dump(*params));
  }
  const auto type = params->find("rope_type");
  if (type != params->end() && !(type->is_string() && type->get<std::string>() == "default")) {
    return InvalidArgument("config.json: 'rope_parameters.rope_type' ", short_dump(*type),
                           " is not supported (the runner implements the default RoPE only)");
  }
  MOEKIT_RETURN_IF_ERROR(get_float(*params, "rope_theta", theta, "rope_parameters.rope_theta"));
  const auto top = j.find("rope_theta");
  if (top != j.end() && !(top->is_number() && float(top->get<double>()) == *theta)) {
    return InvalidArgument("config.json: 'rope_theta' ", short_dump(*top), " disagrees with 'rope_parameters.rope_theta' ",
                           *theta);
  }
  return Status::Ok();
}

// DeepseekV3ForCausalLM: Multi-head Latent Attention without q LoRA, every layer MoE.
Status parse_deepseek(const nlohmann::json& j, ModelConfig* c) {
  MOEKIT_RETURN_IF_ERROR(get_int(j, "n_routed_experts", 1, 1024, &c->num_experts));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "moe_intermediate_size", 1, kBig, &c->moe_intermediate_size));
  int shared = 0;
  MOEKIT_RETURN_IF_ERROR(get_int(j, "n_shared_experts", 0, 1, &shared));
  c->shared_expert = shared == 1;
  MOEKIT_RETURN_IF_ERROR(get_int(j, "n_group", 1, 1024, &c->n_group));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "topk_group", 1, 1024, &c->topk_group));
  MOEKIT_RETURN_IF_ERROR(get_float(j, "routed_scaling_factor", &c->routed_scaling_factor));
  if (!j.contains("norm_topk_prob")) return InvalidArgument("config.json: missing key 'norm_topk_prob' (must be true)");
  MOEKIT_RETURN_IF_ERROR(require_bool(j, "norm_topk_prob", true, true, "the runner renormalizes the top-k weights"));
  int dense = 0;
  MOEKIT_RETURN_IF_ERROR(get_int(j, "first_k_dense_replace", 0, kBig, &dense));
  if (dense != 0) {
    return InvalidArgument("config.json: 'first_k_dense_replace' = ", dense,
                           " is not supported (must be 0: the runner has no dense MLP layers, every layer is MoE)");
  }
  const auto qlora = j.find("q_lora_rank");
  if (qlora == j.end()) return InvalidArgument("config.json: missing key 'q_lora_rank' (must be null)");
  if (!qlora->is_null()) {
    return InvalidArgument("config.json: 'q_lora_rank' ", short_dump(*qlora),
                           " is not supported (must be null: the runner projects q with q_proj, no q LoRA)");
  }
  MOEKIT_RETURN_IF_ERROR(get_int(j, "kv_lora_rank", 1, kBig, &c->kv_lora_rank));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "qk_nope_head_dim", 1, 4096, &c->qk_nope_head_dim));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "qk_rope_head_dim", 2, 4096, &c->qk_rope_head_dim));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "v_head_dim", 1, 4096, &c->v_head_dim));
  if (c->qk_rope_head_dim % 2 != 0) {
    return InvalidArgument("config.json: qk_rope_head_dim ", c->qk_rope_head_dim, " must be even (RoPE pairs)");
  }
  MOEKIT_RETURN_IF_ERROR(get_bool(j, "rope_interleave", true, &c->rope_interleave));
  c->head_dim = c->qk_rope_head_dim;  // as transformers' DeepseekV3Config sets it: the RoPE dims
  MOEKIT_RETURN_IF_ERROR(optional_string(j, "scoring_func", "sigmoid"));
  MOEKIT_RETURN_IF_ERROR(optional_string(j, "topk_method", "noaux_tc"));
  if (c->num_key_value_heads != c->num_attention_heads) {
    return InvalidArgument("config.json: num_key_value_heads ", c->num_key_value_heads, " must equal num_attention_heads ",
                           c->num_attention_heads, " (MLA expands k and v per head)");
  }
  if (c->num_experts % c->n_group != 0 || c->topk_group > c->n_group ||
      c->num_experts_per_tok > c->topk_group * (c->num_experts / c->n_group)) {
    return InvalidArgument("config.json: n_group ", c->n_group, " / topk_group ", c->topk_group, " / k ",
                           c->num_experts_per_tok, " do not fit ", c->num_experts, " experts");
  }
  return Status::Ok();
}

// The integers of the list v (j[key]).
Status int_list(const nlohmann::json& v, const char* key, std::vector<int64_t>* out) {
  if (!v.is_array()) return InvalidArgument("config.json: '", key, "' must be a list of integers, got ", short_dump(v));
  for (const nlohmann::json& e : v) {
    if (!e.is_number_integer()) {
      return InvalidArgument("config.json: '", key, "' must be a list of integers, got ", short_dump(v));
    }
    out->push_back(e.get<int64_t>());
  }
  return Status::Ok();
}

// Llama4ForCausalLM with the Llama-4 features the runner does not implement switched off.
Status parse_llama4(const nlohmann::json& j, ModelConfig* c) {
  const int L = c->num_hidden_layers;
  MOEKIT_RETURN_IF_ERROR(get_int(j, "head_dim", 2, 4096, &c->head_dim));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_local_experts", 1, 1024, &c->num_experts));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "intermediate_size", 1, kBig, &c->moe_intermediate_size));
  c->shared_expert = true;    // Llama4TextMoe always has its shared expert
  c->rope_interleave = true;  // transformers' complex product on (2i, 2i+1)
  if (c->num_experts_per_tok != 1) {
    return InvalidArgument("config.json: llama4 routing is top-1, got num_experts_per_tok ", c->num_experts_per_tok);
  }
  MOEKIT_RETURN_IF_ERROR(require_bool(j, "use_qk_norm", true, false, "the runner has no QK norm (set it to false)"));
  // no_rope_layers[l] = 1: layer l uses RoPE. transformers fills an absent (or empty) list with a
  // NoPE layer every no_rope_layer_interval layers.
  std::vector<int64_t> rope;
  const auto nr = j.find("no_rope_layers");
  if (nr != j.end() && !nr->is_null()) MOEKIT_RETURN_IF_ERROR(int_list(*nr, "no_rope_layers", &rope));
  if (rope.empty()) {
    int interval = 4;
    if (j.contains("no_rope_layer_interval")) {
      MOEKIT_RETURN_IF_ERROR(get_int(j, "no_rope_layer_interval", 1, kBig, &interval));
    }
    for (int l = 0; l < L; ++l) rope.push_back((l + 1) % interval != 0);
    for (int l = 0; l < L; ++l) {
      if (rope[size_t(l)] == 0) {
        return InvalidArgument("config.json: without 'no_rope_layers', transformers makes layer ", l,
                               " a NoPE layer (no_rope_layer_interval ", interval,
                               "); the runner applies RoPE in every layer: set no_rope_layers to all 1");
      }
    }
  }
  if (rope.size() < size_t(L)) {
    return InvalidArgument("config.json: 'no_rope_layers' has ", rope.size(), " entries for ", L, " layers");
  }
  for (int l = 0; l < L; ++l) {
    if (rope[size_t(l)] != 1) {
      return InvalidArgument("config.json: 'no_rope_layers'[", l, "] = ", rope[size_t(l)],
                             " is not supported (must be 1: the runner applies RoPE in every layer, no NoPE layers)");
    }
  }
  // Every layer MoE: moe_layers (when given) lists them all, else interleave_moe_layer_step is 1.
  const auto ml = j.find("moe_layers");
  if (ml != j.end() && !ml->is_null()) {
    std::vector<int64_t> moe;
    MOEKIT_RETURN_IF_ERROR(int_list(*ml, "moe_layers", &moe));
    for (int l = 0; l < L; ++l) {
      if (std::find(moe.begin(), moe.end(), int64_t(l)) == moe.end()) {
        return InvalidArgument("config.json: 'moe_layers' lacks layer ", l,
                               " (the runner has no dense MLP layers: every layer must be MoE)");
      }
    }
  } else if (j.contains("interleave_moe_layer_step")) {
    int step = 1;
    MOEKIT_RETURN_IF_ERROR(get_int(j, "interleave_moe_layer_step", 1, kBig, &step));
    if (step != 1) {
      return InvalidArgument("config.json: 'interleave_moe_layer_step' = ", step,
                             " is not supported (must be 1: the runner has no dense MLP layers)");
    }
  }
  // layer_types: full or chunked attention per layer. Absent, transformers makes every RoPE layer
  // chunked when attention_chunk_size is set (and all of them use RoPE here).
  bool any_chunked = true;
  const auto lt = j.find("layer_types");
  if (lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || lt->size() != size_t(L)) {
      return InvalidArgument("config.json: 'layer_types' must be a list of ", L, " strings, got ", short_dump(*lt));
    }
    any_chunked = false;
    for (size_t l = 0; l < lt->size(); ++l) {
      const auto& t = (*lt)[l];
      if (!t.is_string() || (t != "full_attention" && t != "chunked_attention")) {
        return InvalidArgument("config.json: 'layer_types'[", l, "] = ", short_dump(t),
                               " is not supported (full_attention or chunked_attention)");
      }
      any_chunked = any_chunked || t == "chunked_attention";
    }
  }
  // Chunked attention equals full attention when a chunk holds every position (transformers'
  // default chunk is 8192).
  const auto chunk = j.find("attention_chunk_size");
  if (any_chunked && (chunk == j.end() || !chunk->is_null())) {
    int size = 8192;
    if (chunk != j.end()) MOEKIT_RETURN_IF_ERROR(get_int(j, "attention_chunk_size", 1, 1 << 30, &size));
    if (size < c->max_position_embeddings) {
      return InvalidArgument("config.json: 'attention_chunk_size' = ", size,
                             chunk == j.end() ? " (transformers' default)" : "",
                             " is not supported (must be null or >= max_position_embeddings ",
                             c->max_position_embeddings, ": the runner has no chunked attention)");
    }
  }
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
  } else if (c.model_type == "deepseek_v3") {
    c.family = Family::deepseek;
  } else if (c.model_type == "llama4_text") {
    c.family = Family::llama4;
  } else if (c.model_type == "moekit_deepseek_v3" || c.model_type == "moekit_llama4_text") {
    return InvalidArgument("config.json: model_type '", c.model_type, "' was renamed '", c.model_type.substr(7),
                           "' (transformers' own architecture; regenerate the model with tools/train)");
  } else {
    return InvalidArgument("config.json: model_type '", c.model_type, "' is not one of mixtral, deepseek_v3, llama4_text");
  }
  MOEKIT_RETURN_IF_ERROR(get_int(j, "vocab_size", 1, kBig, &c.vocab_size));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "hidden_size", 1, kBig, &c.hidden_size));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_hidden_layers", 1, 1024, &c.num_hidden_layers));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_attention_heads", 1, 1024, &c.num_attention_heads));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_key_value_heads", 1, 1024, &c.num_key_value_heads));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "num_experts_per_tok", 1, 1024, &c.num_experts_per_tok));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "max_position_embeddings", 1, kBig, &c.max_position_embeddings));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "pad_token_id", 0, kBig, &c.pad_token_id));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "bos_token_id", 0, kBig, &c.bos_token_id));
  MOEKIT_RETURN_IF_ERROR(get_int(j, "eos_token_id", 0, kBig, &c.eos_token_id));
  MOEKIT_RETURN_IF_ERROR(get_float(j, "rms_norm_eps", &c.rms_norm_eps));
  MOEKIT_RETURN_IF_ERROR(parse_rope(j, &c.rope_theta));
  // silu experts everywhere (MixtralConfig's default; deepseek and llama4 must say it).
  MOEKIT_RETURN_IF_ERROR(optional_string(j, "hidden_act", "silu", /*required=*/c.family != Family::mixtral));
  MOEKIT_RETURN_IF_ERROR(require_bool(j, "attention_bias", false, false, "the runner's projections have no bias"));
  MOEKIT_RETURN_IF_ERROR(require_bool(j, "tie_word_embeddings", false, false, "the runner reads lm_head.weight"));
  if (c.family == Family::mixtral) {
    MOEKIT_RETURN_IF_ERROR(get_int(j, "head_dim", 2, 4096, &c.head_dim));
    MOEKIT_RETURN_IF_ERROR(get_int(j, "num_local_experts", 1, 1024, &c.num_experts));
    MOEKIT_RETURN_IF_ERROR(get_int(j, "intermediate_size", 1, kBig, &c.moe_intermediate_size));
    const auto sw = j.find("sliding_window");
    if (sw != j.end() && !sw->is_null() &&
        !(sw->is_number_integer() && sw->get<int64_t>() >= int64_t(c.max_position_embeddings))) {
      return InvalidArgument("config.json: 'sliding_window' ", short_dump(*sw),
                             " is not supported (must be null or >= max_position_embeddings: no sliding window)");
    }
  } else if (c.family == Family::deepseek) {
    MOEKIT_RETURN_IF_ERROR(parse_deepseek(j, &c));
  } else {
    MOEKIT_RETURN_IF_ERROR(parse_llama4(j, &c));
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
