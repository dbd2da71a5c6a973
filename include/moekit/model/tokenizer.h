// The character-level tokenizer of the bundled models (models/<name>/tokenizer.json), the C++ twin of
// tools/train/tokenizer.py: both read the same file and give the same ids. Format (docs/models.md):
//
//   {"type": "moekit-char", "version": 1,
//    "vocab": ["<pad>", "<bos>", "<eos>", "\n", " ", "!", ..., "~"],
//    "special_tokens": {"pad": 0, "bos": 1, "eos": 2},
//    "unknown": "error"}
//
// - id i is vocab[i]; special_tokens names exactly the ids pad, bos and eos (they may coincide).
//   Every other entry is exactly one Unicode character (UTF-8), and no two are equal.
// - encode() maps each character of a UTF-8 text to its id and adds no special token. A character
//   outside the vocabulary, or bytes that are not UTF-8, is an InvalidArgument naming the character
//   (U+XXXX) and its byte offset: "unknown": "error" is the only policy (the key may be omitted).
// - decode() concatenates the entries; special tokens decode to nothing; an id outside
//   [0, vocab_size) is an InvalidArgument naming it and its position.
// Outputs are written only on success. Unknown top-level keys are ignored. JSON nested deeper than
// 64 levels is refused before it is parsed; load() reads only a regular file (links followed) of at
// most 64 MiB. Nothing throws: a failed allocation is OutOfMemory.
// Tests: tests/test_tokenizer.cpp (suite Tokenizer), which also checks the ids the Python tokenizer
// gives (tests/data/tokenizer_golden.json).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "moekit/core/status.h"

namespace moekit::model {

class Tokenizer {
 public:
  // An empty tokenizer (vocab_size 0: encode rejects every character, decode every id).
  Tokenizer() { ascii_.fill(-1); }

  // Parses the text of a tokenizer.json. Every problem is an InvalidArgument naming the field.
  static Status parse(const std::string& json_text, Tokenizer* out);
  // Reads `path`, then parse(); messages are prefixed with the path.
  static Status load(const std::string& path, Tokenizer* out);

  // UTF-8 text -> ids (no special tokens added). *ids is replaced on success, untouched on error.
  Status encode(const std::string& text, std::vector<int32_t>* ids) const;
  // ids -> UTF-8 text, special tokens skipped. *text is replaced on success, untouched on error.
  Status decode(const std::vector<int32_t>& ids, std::string* text) const;

  int32_t vocab_size() const { return int32_t(vocab_.size()); }
  int32_t pad_id() const { return pad_id_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool is_special(int32_t id) const { return id == pad_id_ || id == bos_id_ || id == eos_id_; }
  // The vocabulary entry of an id in [0, vocab_size) (a special token's own string, e.g. "<eos>").
  const std::string& token(int32_t id) const { return vocab_[size_t(id)]; }

 private:
  // The public entry points minus their catch (src/model/model_io.h no_throw).
  static Status parse_checked(const std::string& json_text, Tokenizer* out);
  Status encode_checked(const std::string& text, std::vector<int32_t>* ids) const;
  Status decode_checked(const std::vector<int32_t>& ids, std::string* text) const;

  std::vector<std::string> vocab_;
  int32_t pad_id_ = -1, bos_id_ = -1, eos_id_ = -1;
  std::array<int32_t, 128> ascii_;                    // id of each ASCII code point, -1 if absent
  std::unordered_map<uint32_t, int32_t> non_ascii_;   // id of each code point >= 128
};

}  // namespace moekit::model
