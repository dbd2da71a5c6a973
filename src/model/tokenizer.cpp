// The character-level tokenizer (include/moekit/model/tokenizer.h): tokenizer.json parsing with every
// field validated, UTF-8 decoding that rejects malformed input, encode and decode.
// Tests: tests/test_tokenizer.cpp (suite Tokenizer).
#include "moekit/model/tokenizer.h"

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

// A special_tokens entry: an integer id in [0, vocab).
Status special_id(const nlohmann::json& specials, const char* name, size_t vocab, int32_t* out) {
  const auto it = specials.find(name);
  if (it == specials.end()) return InvalidArgument("tokenizer: special_tokens has no '", name, "'");
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= int64_t(vocab)) {
    return InvalidArgument("tokenizer: special_tokens.", name, " must be an id in [0, ", vocab, "), got ",
                           short_dump(*it));
  }
  *out = int32_t(it->get<int64_t>());
  return Status::Ok();
}

}  // namespace

Status Tokenizer::parse(const std::string& json_text, Tokenizer* out) {
  return no_throw("tokenizer", [&]() -> Status { return parse_checked(json_text, out); });
}

Status Tokenizer::parse_checked(const std::string& json_text, Tokenizer* out) {
  MOEKIT_RETURN_IF_ERROR(check_json_depth("tokenizer", json_text.data(), json_text.size()));
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("tokenizer: the ", json_text.size(), "-byte text is not valid JSON");
  if (!j.is_object()) return InvalidArgument("tokenizer: the file must be a JSON object, got ", j.type_name());
  const auto type = j.find("type");
  if (type == j.end() || !type->is_string() || type->get<std::string>() != "moekit-char") {
    return InvalidArgument("tokenizer: type must be \"moekit-char\", got ",
                           type == j.end() ? "nothing" : short_dump(*type));
  }
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return InvalidArgument("tokenizer: version must be 1, got ", version == j.end() ? "nothing" : short_dump(*version));
  }
  const auto unknown = j.find("unknown");
  if (unknown != j.end() && !(unknown->is_string() && unknown->get<std::string>() == "error")) {
    return InvalidArgument("tokenizer: unknown must be \"error\" (the only policy), got ", short_dump(*unknown));
  }
  const auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_array() || vocab->empty()) {
    return InvalidArgument("tokenizer: vocab must be a non-empty array of strings");
  }
  if (vocab->size() > size_t(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("tokenizer: vocab has ", vocab->size(), " entries (at most 2^31 - 1)");
  }
  const auto specials = j.find("special_tokens");
  if (specials == j.end() || !specials->is_object()) {
    return InvalidArgument("tokenizer: special_tokens must be an object {\"pad\", \"bos\", \"eos\"}");
  }
  for (auto it = specials->begin(); it != specials->end(); ++it) {
    if (it.key() != "pad" && it.key() != "bos" && it.key() != "eos") {
      return InvalidArgument("tokenizer: special_tokens has unknown key '", it.key(), "' (pad, bos and eos only)");
    }
  }

  Tokenizer t;
  MOEKIT_RETURN_IF_ERROR(special_id(*specials, "pad", vocab->size(), &t.pad_id_));
  MOEKIT_RETURN_IF_ERROR(special_id(*specials, "bos", vocab->size(), &t.bos_id_));
  MOEKIT_RETURN_IF_ERROR(special_id(*specials, "eos", vocab->size(), &t.eos_id_));
  for (size_t i = 0; i < vocab->size(); ++i) {
    const nlohmann::json& v = (*vocab)[i];
    if (!v.is_string()) return InvalidArgument("tokenizer: vocab[", i, "] must be a string, got ", v.type_name());
    t.vocab_.push_back(v.get<std::string>());
    if (t.is_special(int32_t(i))) continue;
    const std::string& s = t.vocab_.back();
    uint32_t cp = 0;
    size_t len = 0;
    if (s.empty() || !next_code_point(s, 0, &cp, &len) || len != s.size()) {
      return InvalidArgument("tokenizer: vocab[", i, "] must be exactly one character, got ", short_dump(v));
    }
    int32_t* slot = cp < 128 ? &t.ascii_[cp] : nullptr;
    const auto found = t.non_ascii_.find(cp);
    const int32_t previous = slot ? *slot : (found == t.non_ascii_.end() ? -1 : found->second);
    if (previous >= 0) {
      return InvalidArgument("tokenizer: vocab[", i, "] ", short_dump(v), " (", code_point_name(cp), ") duplicates vocab[",
                             previous, "]");
    }
    if (slot) {
      *slot = int32_t(i);
    } else {
      t.non_ascii_[cp] = int32_t(i);
    }
  }
  *out = std::move(t);
  return Status::Ok();
}

Status Tokenizer::load(const std::string& path, Tokenizer* out) {
  std::string text;
  MOEKIT_RETURN_IF_ERROR(read_regular_file("tokenizer", path, kMaxJsonFileBytes, &text));
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
