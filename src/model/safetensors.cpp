// The safetensors reader (include/moekit/model/safetensors.h). Every check runs before the object
// is filled; messages name the tensor and the offending value (JSON values cut to ~100 characters).
// Tests: tests/test_safetensors.cpp; fuzz target tests/fuzz/fuzz_safetensors.cpp.
#include "moekit/model/safetensors.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/model_io.h"

namespace moekit::model {

namespace {

constexpr uint64_t kMaxHeader = 100ull * 1000 * 1000;  // the format's header cap

int dtype_bytes(const std::string& d) {
  static const std::map<std::string, int> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
  const auto it = kSizes.find(d);
  return it == kSizes.end() ? 0 : it->second;
}

// A JSON value as a non-negative integer that fits int64 (shape entries, offsets).
bool as_count(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = uint64_t(s);
  } else {
    return false;
  }
  return *out <= uint64_t(std::numeric_limits<int64_t>::max());
}

}  // namespace

Status SafetensorsFile::parse(const uint8_t* data, size_t size, SafetensorsFile* out) {
  return no_throw("safetensors", [&]() -> Status { return parse_checked(data, size, out); });
}

Status SafetensorsFile::parse_checked(const uint8_t* data, size_t size, SafetensorsFile* out) {
  if (data == nullptr && size > 0) return InvalidArgument("safetensors: null data with size ", size);
  if (size < 8) return InvalidArgument("safetensors: file of ", size, " bytes is shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeader) return InvalidArgument("safetensors: header length ", n, " exceeds the format's ", kMaxHeader);
  if (n > size - 8) {
    return InvalidArgument("safetensors: header length ", n, " runs past the end of the file (", size - 8,
                           " bytes after the length)");
  }
  const char* hb = reinterpret_cast<const char*>(data + 8);
  MOEKIT_RETURN_IF_ERROR(check_json_depth("safetensors: the header", hb, size_t(n)));
  const nlohmann::json h = nlohmann::json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded()) return InvalidArgument("safetensors: the ", n, "-byte header is not valid JSON");
  if (!h.is_object()) return InvalidArgument("safetensors: the header must be a JSON object, got ", h.type_name());
  const uint64_t data_size = size - 8 - n;

  SafetensorsFile f;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return InvalidArgument("safetensors: __metadata__ must be an object, got ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return InvalidArgument("safetensors: __metadata__ value of '", m.key(), "' must be a string, got ",
                                 m.value().type_name());
        }
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) return InvalidArgument("safetensors: tensor '", name, "' must be an object, got ", v.type_name());
    SafetensorsTensor t;
    t.name = name;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return InvalidArgument("safetensors: tensor '", name, "' has no dtype string");
    t.dtype = dt->get<std::string>();
    t.elem_bytes = dtype_bytes(t.dtype);
    if (t.elem_bytes == 0) return InvalidArgument("safetensors: tensor '", name, "' has unknown dtype '", t.dtype, "'");
    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return InvalidArgument("safetensors: tensor '", name, "' has no shape array");
    if (sh->size() > 16) return InvalidArgument("safetensors: tensor '", name, "' has ", sh->size(), " dims (at most 16)");
    // numel x elem_bytes without overflow (a product past 2^64 cannot match any byte range).
    uint64_t bytes = uint64_t(t.elem_bytes);
    bool too_big = false;
    for (const nlohmann::json& d : *sh) {
      uint64_t e = 0;
      if (!as_count(d, &e)) {
        return InvalidArgument("safetensors: tensor '", name, "' shape entry ", short_dump(d),
                               " is not a non-negative integer");
      }
      t.shape.push_back(int64_t(e));
      if (e != 0 && bytes > std::numeric_limits<uint64_t>::max() / e) too_big = true;
      bytes = too_big ? bytes : bytes * e;
    }
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      return InvalidArgument("safetensors: tensor '", name, "' needs data_offsets [begin, end]");
    }
    if (!as_count((*off)[0], &t.begin) || !as_count((*off)[1], &t.end) || t.begin > t.end) {
      return InvalidArgument("safetensors: tensor '", name, "' data_offsets ", short_dump(*off),
                             " must be non-negative integers with begin <= end");
    }
    if (t.end > data_size) {
      return InvalidArgument("safetensors: tensor '", name, "' ends at byte ", t.end, " of a ", data_size,
                             "-byte data section");
    }
    bool zero = false;
    for (int64_t e : t.shape) zero |= e == 0;
    if (zero) bytes = 0;
    if ((too_big && !zero) || bytes != t.end - t.begin) {
      return InvalidArgument("safetensors: tensor '", name, "' shape ", short_dump(*sh), " of ", t.dtype, " needs ",
                             too_big && !zero ? std::string("more than 2^64") : std::to_string(bytes),
                             " bytes, its data_offsets span ", t.end - t.begin);
    }
    f.tensors_.push_back(std::move(t));
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const SafetensorsTensor& t : f.tensors_) {
    if (t.begin != at) {
      return InvalidArgument("safetensors: tensor '", t.name, "' starts at byte ", t.begin, " but the previous data ends at ",
                             at, t.begin > at ? " (a gap)" : " (an overlap)");
    }
    at = t.end;
  }
  if (at != data_size) {
    return InvalidArgument("safetensors: the tensors cover ", at, " bytes of a ", data_size, "-byte data section");
  }
  f.data_ = data + 8 + n;
  *out = std::move(f);
  return Status::Ok();
}

Status SafetensorsFile::open(const std::string& path, SafetensorsFile* out) {
  return no_throw("safetensors: " + path, [&]() -> Status {
    std::vector<uint8_t> bytes;
    MOEKIT_RETURN_IF_ERROR(read_regular_file("safetensors", path, kNoSizeCap, &bytes));
    SafetensorsFile f;
    const Status s = parse(bytes.data(), bytes.size(), &f);
    if (!s.ok()) return Status(s.code(), path + ": " + s.message());
    // The data section pointer moves with the vector's buffer (std::move keeps the allocation).
    const size_t data_at = size_t(f.data_ - bytes.data());
    f.owned_ = std::move(bytes);
    f.data_ = f.owned_.data() + data_at;
    *out = std::move(f);
    return Status::Ok();
  });
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SafetensorsFile::view(const SafetensorsTensor& t, TensorView* out) const {
  static const std::map<std::string, DType> kTypes = {{"F32", DType::f32},
                                                      {"F16", DType::f16},
                                                      {"BF16", DType::bf16},
                                                      {"F8_E4M3", DType::fp8_e4m3fn},
                                                      {"I32", DType::i32}};
  const auto it = kTypes.find(t.dtype);
  if (it == kTypes.end()) return InvalidArgument("safetensors: tensor '", t.name, "' dtype ", t.dtype, " has no moekit dtype");
  if (t.shape.size() > size_t(kMaxDims)) {
    return InvalidArgument("safetensors: tensor '", t.name, "' has ", t.shape.size(), " dims (moekit views take ", kMaxDims,
                           ")");
  }
  const std::vector<int64_t> dims = t.shape.empty() ? std::vector<int64_t>{1} : t.shape;  // a scalar as [1]
  *out = TensorView::contiguous(const_cast<uint8_t*>(bytes(t)), it->second, int(dims.size()), dims.data());
  return Status::Ok();
}

}  // namespace moekit::model
