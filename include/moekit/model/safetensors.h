// A safetensors reader (the checkpoint format of Hugging Face models): an 8-byte little-endian
// header length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]},
// optional "__metadata__": {string: string}}, possibly padded with spaces), then the data section.
// parse() validates everything before anything is used, and a bad file is an InvalidArgument
// naming what is wrong (never a crash, never an out-of-range read):
//   - the length prefix fits the buffer (and the spec's 100 MB header cap), the header is a JSON
//     object, every entry has a known dtype, a shape of non-negative integers and two offsets;
//   - shape x element size == end - begin, computed without overflow;
//   - the tensors' byte ranges, sorted by begin, tile the data section exactly (no gap, no
//     overlap, nothing past its end, nothing left over);
//   - "__metadata__" maps strings to strings;
//   - the header's arrays and objects nest at most 64 deep (checked before the JSON is parsed).
// open() reads only a regular file (links followed): a directory, FIFO or device is an
// InvalidArgument before anything is opened for reading; a file the machine cannot hold is
// OutOfMemory. Nothing throws.
// Tests: tests/test_safetensors.cpp (suite Safetensors); fuzzed by tests/fuzz/fuzz_safetensors.cpp
// (libFuzzer, -DMOEKIT_FUZZ=ON with clang).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"

namespace moekit::model {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // the file's dtype string, e.g. "BF16", "F8_E4M3"
  int elem_bytes = 0;           // bytes per element of that dtype
  std::vector<int64_t> shape;   // may be empty (a scalar)
  uint64_t begin = 0, end = 0;  // byte range inside the data section
};

class SafetensorsFile {
 public:
  // Validates a whole file held in memory (`data` must outlive the object when parsed in place).
  static Status parse(const uint8_t* data, size_t size, SafetensorsFile* out);
  // Reads `path` into memory, then parse(); the file's bytes are owned by the object.
  static Status open(const std::string& path, SafetensorsFile* out);

  // Tensors in file order of their data (ascending begin).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes (inside the data section).
  const uint8_t* bytes(const SafetensorsTensor& t) const { return data_ + t.begin; }
  // A contiguous host TensorView of the tensor, for the dtypes moekit has (F32, F16, BF16,
  // F8_E4M3 -> fp8_e4m3fn, I32); other dtypes are an InvalidArgument naming the tensor.
  Status view(const SafetensorsTensor& t, TensorView* out) const;

 private:
  static Status parse_checked(const uint8_t* data, size_t size, SafetensorsFile* out);  // parse() minus the catch

  std::vector<uint8_t> owned_;
  const uint8_t* data_ = nullptr;  // the data section
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moekit::model
