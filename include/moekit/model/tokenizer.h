// The character-level tokenizer of the bundled models (models/<name>/tokenizer.json), the C++ twin of
// the Hugging Face `tokenizers` file that transformers' AutoTokenizer loads (tools/train/tokenizer.py
// writes it): both give the same ids. Format (the one family accepted):
//
//   {"version": "1.0", "truncation": null, "padding": null,
//    "added_tokens": [{"id": 0, "content": "<pad>", "single_word": false, "lstrip": false,
//                      "rstrip": false, "normalized": false, "special": true}, <bos> 1, <eos> 2],
//    "normalizer": null,
//    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated",
//                      "invert": false},
//    "post_processor": {"type": "TemplateProcessing", ...},       (ignored: encode adds nothing)
//    "decoder": {"type": "Fuse"},
//    "model": {"type": "WordLevel", "vocab": {"<pad>": 0, "<bos>": 1, "<eos>": 2, "\n": 3, ...},
//              "unk_token": "<unk>"}}
//
// - model.vocab maps token -> id with ids exactly 0..n-1. Every entry that is not an added token is
//   exactly one Unicode character (UTF-8). The pre-tokenizer splits the text into single characters
//   (the regex [\s\S], or [\S\s]); WordLevel then looks each one up.
// - added_tokens: each content is in model.vocab with the same id, all flags false except
//   "special". The special ones (special: true) include "<pad>", "<bos>" and "<eos>", whose ids are
//   pad_id(), bos_id() and eos_id().
// - encode() (HF encode with add_special_tokens=False) first matches the added tokens' contents in
//   the text, leftmost then longest first ("a<eos>b" -> a, <eos>, b), then maps every other
//   character to its id. A character outside the vocabulary, or bytes that are not UTF-8, is an
//   InvalidArgument naming the character (U+XXXX) and its byte offset: unk_token is never in the
//   vocabulary, so HF refuses the same texts ("Missing [UNK] token").
// - decode() (HF decode with skip_special_tokens=True) concatenates the entries (decoder Fuse);
//   special tokens decode to nothing; an id outside [0, vocab_size) is an InvalidArgument naming it
//   and its position.
// Refused, each naming the field and its value: another model type (BPE, Unigram, ...), a normalizer,
// a pre-tokenizer that is not per character (null makes HF look up whole texts; the regex "." does
// not match "\n"), a decoder other than Fuse (null makes HF join tokens with spaces), truncation or
// padding, a vocab with gaps or an unk_token inside it. Unknown top-level keys are ignored.
// Outputs are written only on success. JSON nested deeper than 64 levels is refused before it is
// parsed; load() reads only a regular file (links followed) of at most 64 MiB. Nothing throws: a
// failed allocation is OutOfMemory.
// Tests: tests/test_tokenizer.cpp (suite Tokenizer), which also checks the ids the Python tokenizer
// gives (tests/data/tokenizer_golden.json); fuzzing: tests/fuzz/fuzz_tokenizer.cpp.
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
  // An added token marked "special" (pad, bos, eos and any other); false outside the vocabulary.
  bool is_special(int32_t id) const { return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)]; }
  // The vocabulary entry of an id in [0, vocab_size) (a special token's own string, e.g. "<eos>").
  const std::string& token(int32_t id) const { return vocab_[size_t(id)]; }

 private:
  // The public entry points minus their catch (src/model/model_io.h no_throw).
  static Status parse_checked(const std::string& json_text, Tokenizer* out);
  Status encode_checked(const std::string& text, std::vector<int32_t>* ids) const;
  Status decode_checked(const std::vector<int32_t>& ids, std::string* text) const;

  std::vector<std::string> vocab_;                    // [vocab_size] the entry of each id
  std::vector<bool> special_;                         // [vocab_size] added token with special: true
  int32_t pad_id_ = -1, bos_id_ = -1, eos_id_ = -1;
  std::array<int32_t, 128> ascii_;                    // id of each ASCII code point, -1 if absent
  std::unordered_map<uint32_t, int32_t> non_ascii_;   // id of each code point >= 128
  // Added tokens by first byte, longest content first (encode tries them before the characters).
  std::array<std::vector<int32_t>, 256> added_by_byte_;
};

}  // namespace moekit::model
