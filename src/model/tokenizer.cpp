// The character-level tokenizer (include/moekit/model/tokenizer.h): a Hugging Face tokenizer.json of
// the WordLevel, per-character family parsed with every field validated, UTF-8 decoding that rejects
// malformed input, encode (added tokens matched first) and decode.
// Tests: tests/test_tokenizer.cpp (suite Tokenizer).
#include "moekit/model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/model_io.h"

namespace moekit::model {

namespace {

// "U+00E9"
std::string code_point_name(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

std::string byte_hex(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned>(b));
  return buf;
}

// Decodes the UTF-8 character at s[at]: its code point and byte length, or false for a malformed
// sequence (bad lead byte, missing continuation, overlong form, surrogate, past U+10FFFF).
bool next_code_point(const std::string& s, size_t at, uint32_t* cp, size_t* len) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(at);
  size_t n = 0;
  uint32_t c = 0, min = 0;
  if (b0 < 0x80) {
    *cp = b0;
    *len = 1;
    return true;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 2, c = b0 & 0x1Fu, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, c = b0 & 0x0Fu, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, c = b0 & 0x07u, min = 0x10000;
  } else {
    return false;
  }
  if (at + n > s.size()) return false;
  for (size_t i = 1; i < n; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return false;
    c = (c << 6) | (byte(at + i) & 0x3Fu);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  *cp = c;
  *len = n;
  return true;
}

// j[key] for an error message: its JSON text (cut), or "nothing" when the key is absent.
std::string got(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() ? std::string("nothing") : short_dump(*it);
}

// j[key] is an integer equal to `want`.
bool has_integer_equal(const nlohmann::json& j, const char* key, int64_t want) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() && it->get<int64_t>() == want;
}

bool is_null_or_absent(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null();
}

// A string field of `j` equal to `want`.
bool has_string(const nlohmann::json& j, const char* key, const char* want) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() && it->get<std::string>() == want;
}

// The pre-tokenizer patterns that split a text into single characters: Oniguruma's [\s\S] matches
// any one code point ("." would not match "\n", and HF would then look up "\n\n" as one word).
bool per_character_regex(const std::string& r) { return r == "[\\s\\S]" || r == "[\\S\\s]"; }

// Everything but model and added_tokens: the pipeline must be exactly the per-character one, so the
// ids are those Hugging Face gives.
Status check_pipeline(const nlohmann::json& j) {
  if (!has_string(j, "version", "1.0")) {
    return InvalidArgument("tokenizer.json: version must be \"1.0\", got ", got(j, "version"));
  }
  for (const char* key : {"truncation", "padding", "normalizer"}) {
    if (!is_null_or_absent(j, key)) {
      return InvalidArgument("tokenizer.json: ", key, " ", got(j, key),
                             " is not supported (the runner reads tokenizers without one: null)");
    }
  }
  const auto pre = j.find("pre_tokenizer");
  const bool split = pre != j.end() && pre->is_object() && has_string(*pre, "type", "Split");
  if (!split) {
    return InvalidArgument("tokenizer.json: pre_tokenizer ", got(j, "pre_tokenizer"),
                           " is not supported (want the per-character {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                           "\"[\\\\s\\\\S]\"}, \"behavior\": \"Isolated\", \"invert\": false}; with none HF looks up "
                           "the whole text as one word)");
  }
  const auto pattern = pre->find("pattern");
  const bool regex = pattern != pre->end() && pattern->is_object() && pattern->size() == 1 &&
                     pattern->contains("Regex") && (*pattern)["Regex"].is_string() &&
                     per_character_regex((*pattern)["Regex"].get<std::string>());
  if (!regex) {
    return InvalidArgument("tokenizer.json: pre_tokenizer.pattern ", got(*pre, "pattern"),
                           " is not supported (want {\"Regex\": \"[\\\\s\\\\S]\"}: one pre-token per character)");
  }
  if (!has_string(*pre, "behavior", "Isolated")) {
    return InvalidArgument("tokenizer.json: pre_tokenizer.behavior must be \"Isolated\", got ", got(*pre, "behavior"));
  }
  const auto invert = pre->find("invert");
  if (invert != pre->end() && !(invert->is_boolean() && !invert->get<bool>())) {
    return InvalidArgument("tokenizer.json: pre_tokenizer.invert must be false, got ", short_dump(*invert));
  }
  const auto dec = j.find("decoder");
  if (dec == j.end() || !dec->is_object() || !has_string(*dec, "type", "Fuse")) {
    return InvalidArgument("tokenizer.json: decoder ", got(j, "decoder"),
                           " is not supported (want {\"type\": \"Fuse\"}: tokens concatenated; with none HF joins "
                           "them with spaces)");
  }
  const auto post = j.find("post_processor");
  const bool typed = post != j.end() && post->is_object() && post->contains("type") && (*post)["type"].is_string();
  if (post != j.end() && !post->is_null() && !typed) {
    return InvalidArgument("tokenizer.json: post_processor must be null or an object with a \"type\", got ",
                           short_dump(*post));
  }
  return Status::Ok();
}

}  // namespace

Status Tokenizer::parse(const std::string& json_text, Tokenizer* out) {
  return no_throw("tokenizer.json", [&]() -> Status { return parse_checked(json_text, out); });
}

Status Tokenizer::parse_checked(const std::string& json_text, Tokenizer* out) {
  MOEKIT_RETURN_IF_ERROR(check_json_depth("tokenizer.json", json_text.data(), json_text.size()));
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("tokenizer.json: the ", json_text.size(), "-byte text is not valid JSON");
  if (!j.is_object()) return InvalidArgument("tokenizer.json: the file must be a JSON object, got ", j.type_name());
  const auto model = j.find("model");
  if (model == j.end() || !model->is_object()) {
    return InvalidArgument("tokenizer.json: model must be an object {\"type\": \"WordLevel\", ...}, got ", got(j, "model"));
  }
  const auto type = model->find("type");
  if (type == model->end() || !type->is_string()) {
    return InvalidArgument("tokenizer.json: model.type must be a string, got ", got(*model, "type"));
  }
  if (type->get<std::string>() != "WordLevel") {
    return InvalidArgument("tokenizer.json: model.type ", short_dump(*type),
                           " is not supported (the runner reads character-level WordLevel tokenizers)");
  }
  MOEKIT_RETURN_IF_ERROR(check_pipeline(j));

  // model.vocab: token -> id, the ids exactly 0..n-1.
  const auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object() || vocab->empty()) {
    return InvalidArgument("tokenizer.json: model.vocab must be a non-empty object {token: id}, got ", got(*model, "vocab"));
  }
  if (vocab->size() > size_t(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("tokenizer.json: model.vocab has ", vocab->size(), " entries (at most 2^31 - 1)");
  }
  const size_t n = vocab->size();
  Tokenizer t;
  t.vocab_.resize(n);
  t.special_.assign(n, false);
  std::vector<bool> seen(n, false), added(n, false);
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const nlohmann::json& v = it.value();
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= int64_t(n)) {
      return InvalidArgument("tokenizer.json: model.vocab[", short_dump(it.key()), "] must be an id in [0, ", n,
                             ") (ids are 0..n-1), got ", short_dump(v));
    }
    const size_t id = size_t(v.get<int64_t>());
    if (seen[id]) {
      return InvalidArgument("tokenizer.json: model.vocab[", short_dump(it.key()), "] = ", id, " duplicates model.vocab[",
                             short_dump(t.vocab_[id]), "]");
    }
    seen[id] = true;
    t.vocab_[id] = it.key();
  }
  // (n distinct ids in [0, n): none is missing.) HF maps unknown characters to unk_token ("<unk>"
  // when absent) if the vocabulary has it, and refuses them otherwise, as the runner does.
  const auto unk = model->find("unk_token");
  if (unk != model->end() && !unk->is_string()) {
    return InvalidArgument("tokenizer.json: model.unk_token must be a string, got ", short_dump(*unk));
  }
  const std::string unk_token = unk == model->end() ? "<unk>" : unk->get<std::string>();
  if (vocab->contains(unk_token)) {
    return InvalidArgument("tokenizer.json: model.unk_token ", short_dump(unk_token),
                           " is in model.vocab (the runner refuses unknown characters, as HF does without one)");
  }

  // added_tokens: entries of model.vocab matched before the characters; the special ones have roles.
  const auto adds = j.find("added_tokens");
  if (adds == j.end() || !adds->is_array()) {
    return InvalidArgument("tokenizer.json: added_tokens must be an array (with <pad>, <bos> and <eos>), got ",
                           got(j, "added_tokens"));
  }
  for (size_t i = 0; i < adds->size(); ++i) {
    const nlohmann::json& a = (*adds)[i];
    if (!a.is_object()) {
      return InvalidArgument("tokenizer.json: added_tokens[", i, "] must be an object, got ", a.type_name());
    }
    const auto content = a.find("content");
    if (content == a.end() || !content->is_string() || content->get<std::string>().empty()) {
      return InvalidArgument("tokenizer.json: added_tokens[", i, "].content must be a non-empty string, got ",
                             got(a, "content"));
    }
    const auto in_vocab = vocab->find(content->get<std::string>());
    if (in_vocab == vocab->end()) {
      return InvalidArgument("tokenizer.json: added_tokens[", i, "].content ", short_dump(*content),
                             " is not in model.vocab");
    }
    if (!has_integer_equal(a, "id", in_vocab->get<int64_t>())) {
      return InvalidArgument("tokenizer.json: added_tokens[", i, "].id must be ", in_vocab->get<int64_t>(), " (the id of ",
                             short_dump(*content), " in model.vocab), got ", got(a, "id"));
    }
    for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized"}) {
      const auto f = a.find(flag);
      if (f != a.end() && !(f->is_boolean() && !f->get<bool>())) {
        return InvalidArgument("tokenizer.json: added_tokens[", i, "].", flag, " must be false, got ", short_dump(*f));
      }
    }
    const auto special = a.find("special");
    if (special != a.end() && !special->is_boolean()) {
      return InvalidArgument("tokenizer.json: added_tokens[", i, "].special must be a boolean, got ", short_dump(*special));
    }
    const size_t id = size_t(in_vocab->get<int64_t>());
    if (added[id]) {
      return InvalidArgument("tokenizer.json: added_tokens[", i, "] ", short_dump(*content), " is listed twice");
    }
    added[id] = true;
    t.special_[id] = special != a.end() && special->get<bool>();
    t.added_by_byte_[uint8_t(t.vocab_[id][0])].push_back(int32_t(id));
  }
  for (std::vector<int32_t>& v : t.added_by_byte_) {  // longest first: HF matches leftmost-longest
    std::stable_sort(v.begin(), v.end(),
                     [&](int32_t a, int32_t b) { return t.vocab_[size_t(a)].size() > t.vocab_[size_t(b)].size(); });
  }
  for (auto [name, id] : {std::make_pair("<pad>", &t.pad_id_), std::make_pair("<bos>", &t.bos_id_),
                          std::make_pair("<eos>", &t.eos_id_)}) {
    const auto it = vocab->find(name);
    if (it == vocab->end() || !t.special_[size_t(it->get<int64_t>())]) {
      return InvalidArgument("tokenizer.json: added_tokens has no special token \"", name,
                             "\" (the pad, bos and eos roles go by content)");
    }
    *id = int32_t(it->get<int64_t>());
  }

  // Every other entry is one character, looked up by code point.
  for (size_t i = 0; i < n; ++i) {
    if (added[i]) continue;
    const std::string& s = t.vocab_[i];
    uint32_t cp = 0;
    size_t len = 0;
    if (s.empty() || !next_code_point(s, 0, &cp, &len) || len != s.size()) {
      return InvalidArgument("tokenizer.json: model.vocab[", short_dump(s), "] (id ", i,
                             ") must be exactly one character (or an added token)");
    }
    if (cp < 128) {
      t.ascii_[cp] = int32_t(i);
    } else {
      t.non_ascii_[cp] = int32_t(i);
    }
  }
  *out = std::move(t);
  return Status::Ok();
}

Status Tokenizer::load(const std::string& path, Tokenizer* out) {
  std::string text;
  MOEKIT_RETURN_IF_ERROR(read_regular_file("tokenizer.json", path, kMaxJsonFileBytes, &text));
  const Status s = parse(text, out);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return Status::Ok();
}

Status Tokenizer::encode(const std::string& text, std::vector<int32_t>* ids) const {
  return no_throw("tokenizer: encode", [&]() -> Status { return encode_checked(text, ids); });
}

Status Tokenizer::encode_checked(const std::string& text, std::vector<int32_t>* ids) const {
  if (ids == nullptr) return InvalidArgument("tokenizer: ids must not be null");
  std::vector<int32_t> result;
  result.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    // Added tokens first (HF splits the text on them before pre-tokenizing), longest first.
    bool matched = false;
    for (const int32_t a : added_by_byte_[uint8_t(text[at])]) {
      const std::string& content = vocab_[size_t(a)];
      if (text.compare(at, content.size(), content) == 0) {
        result.push_back(a);
        at += content.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    uint32_t cp = 0;
    size_t len = 0;
    if (!next_code_point(text, at, &cp, &len)) {
      return InvalidArgument("tokenizer: text is not UTF-8 at byte ", at, " (", byte_hex(uint8_t(text[at])), ")");
    }
    int32_t id = -1;
    if (cp < 128) {
      id = ascii_[cp];
    } else if (const auto it = non_ascii_.find(cp); it != non_ascii_.end()) {
      id = it->second;
    }
    if (id < 0) {
      return InvalidArgument("tokenizer: character ", code_point_name(cp), " at byte ", at,
                             " is not in the vocabulary (unknown characters are an error)");
    }
    result.push_back(id);
    at += len;
  }
  *ids = std::move(result);
  return Status::Ok();
}

Status Tokenizer::decode(const std::vector<int32_t>& ids, std::string* text) const {
  return no_throw("tokenizer: decode", [&]() -> Status { return decode_checked(ids, text); });
}

Status Tokenizer::decode_checked(const std::vector<int32_t>& ids, std::string* text) const {
  if (text == nullptr) return InvalidArgument("tokenizer: text must not be null");
  std::string result;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return InvalidArgument("tokenizer: ids[", i, "] = ", id, " is outside [0, ", vocab_size(), ")");
    }
    if (!is_special(id)) result += vocab_[size_t(id)];
  }
  *text = std::move(result);
  return Status::Ok();
}

}  // namespace moekit::model
