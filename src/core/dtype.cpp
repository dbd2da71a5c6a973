// dtype names and parsing (moekit/core/dtype.h). The conversions themselves are header-only.
#include "moekit/core/dtype.h"

#include <cstring>

namespace moekit {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::fp8_e4m3fn: return "fp8_e4m3fn";
    case DType::fp8_e4m3fnuz: return "fp8_e4m3fnuz";
    case DType::i32: return "i32";
  }
  return "?";
}

bool parse_dtype(const char* s, DType* out) {
  struct Alias {
    const char* name;
    DType d;
  };
  static const Alias kAliases[] = {
      {"f32", DType::f32},          {"float32", DType::f32},          {"bf16", DType::bf16},
      {"bfloat16", DType::bf16},    {"f16", DType::f16},              {"float16", DType::f16},
      {"fp8_e4m3fn", DType::fp8_e4m3fn}, {"e4m3fn", DType::fp8_e4m3fn}, {"fp8", DType::fp8_e4m3fn},
      {"fp8_e4m3fnuz", DType::fp8_e4m3fnuz}, {"e4m3fnuz", DType::fp8_e4m3fnuz},
      {"i32", DType::i32},          {"int32", DType::i32},
  };
  if (s == nullptr) return false;
  for (const Alias& a : kAliases) {
    if (std::strcmp(s, a.name) == 0) {
      *out = a.d;
      return true;
    }
  }
  return false;
}

}  // namespace moekit
