// libFuzzer target of the safetensors reader (include/moekit/model/safetensors.h): any input must
// parse or be rejected with a Status, never crash or read out of bounds, and every accepted tensor
// must lie inside the input. Build and run (clang):
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMOEKIT_FUZZ=ON -DMOEKIT_CUDA=OFF \
//         -DMOEKIT_BUILD_TESTS=OFF -DMOEKIT_BUILD_TOOLS=OFF && cmake --build build-fuzz --target fuzz_safetensors
//   ./build-fuzz/fuzz_safetensors -max_total_time=60 tests/fuzz/corpus_safetensors
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "moekit/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moekit::model::SafetensorsFile f;
  if (!moekit::model::SafetensorsFile::parse(data, size, &f).ok()) return 0;
  for (const moekit::model::SafetensorsTensor& t : f.tensors()) {
    const uint8_t* p = f.bytes(t);
    if (p < data || p + (t.end - t.begin) > data + size) std::abort();  // an accepted tensor out of the input
    moekit::TensorView v;
    (void)f.view(t, &v);
  }
  return 0;
}
