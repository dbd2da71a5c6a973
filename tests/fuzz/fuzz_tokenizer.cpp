// libFuzzer target of tokenizer.json loading (Tokenizer::parse, include/moekit/model/tokenizer.h):
// any input must parse or be rejected with a Status -- never crash, overflow the stack on deep JSON
// or throw -- and an accepted tokenizer must round-trip: decoding every non-special id and encoding
// the text gives the same ids back, and an id past the vocabulary is refused. Build and run (clang;
// the seeds are the bundled tokenizer.json plus edge cases; new inputs go to the first folder):
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
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < t.vocab_size(); ++i) {
    if (!t.is_special(i)) ids.push_back(i);
  }
  std::string decoded;
  std::vector<int32_t> again;
  if (!t.decode(ids, &decoded).ok() || !t.encode(decoded, &again).ok() || again != ids) std::abort();
  if (t.decode({t.vocab_size()}, &decoded).ok() || t.decode({-1}, &decoded).ok()) std::abort();
  return 0;
}
