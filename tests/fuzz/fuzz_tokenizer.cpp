// libFuzzer target of tokenizer.json loading (Tokenizer::parse, include/moekit/model/tokenizer.h):
// any input must parse or be rejected with a Status -- never crash, overflow the stack on deep JSON
// or throw -- and an accepted tokenizer must round-trip: every entry of the vocabulary encodes to
// its own id (a character, or an added token's content), decoding all ids gives the non-special
// entries concatenated, and an id past the vocabulary is refused. Build and run (clang; the seeds
// are the bundled Hugging Face tokenizer.json plus edge cases; new inputs go to the first folder):
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMOEKIT_FUZZ=ON -DMOEKIT_CUDA=OFF \
//         -DMOEKIT_BUILD_TESTS=OFF -DMOEKIT_BUILD_TOOLS=OFF && cmake --build build-fuzz --target fuzz_tokenizer
//   mkdir -p /tmp/corpus_tokenizer && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
//     ./build-fuzz/fuzz_tokenizer -max_total_time=300 -jobs=1 /tmp/corpus_tokenizer tests/fuzz/corpus_tokenizer
// Results: docs/models.md ("The C++ model runner").
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "moekit/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moekit::model::Tokenizer t;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!moekit::model::Tokenizer::parse(text, &t).ok()) return 0;
  // NOTE: the round trip is per entry: the concatenation of several can spell an added token
  // ("<", "eos", ">" ...), which encode then matches as one id, as Hugging Face does.
  std::vector<int32_t> all, again;
  std::string want, decoded;
  for (int32_t i = 0; i < t.vocab_size(); ++i) {
    all.push_back(i);
    if (!t.is_special(i)) want += t.token(i);
    if (!t.encode(t.token(i), &again).ok() || again != std::vector<int32_t>{i}) std::abort();
  }
  if (!t.decode(all, &decoded).ok() || decoded != want) std::abort();
  if (!t.is_special(t.pad_id()) || !t.is_special(t.bos_id()) || !t.is_special(t.eos_id())) std::abort();
  if (t.decode({t.vocab_size()}, &decoded).ok() || t.decode({-1}, &decoded).ok()) std::abort();
  return 0;
}
