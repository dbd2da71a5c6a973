// moekit/core/tensor_view.h: a non-owning view of a strided tensor.
//
// The only way tensors cross the API: pointer, dtype, shape, strides (in ELEMENTS), device and the
// layout tag. An optional argument is "absent" when ndim == 0 (the default-constructed view); a
// present tensor may still hold zero elements (T = 0) and then data may be null.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "moekit/core/dtype.h"

namespace moekit {

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);

// Physical layout of a weight tensor's last two dimensions. Carried with the tensor so that a
// pre-shuffled weight can never be mistaken for a plain one (SPEC 4).
enum class Layout : uint8_t {  // kNumLayouts below counts them
  row_major,       // plain [.., N, K]
  shuffled_16x16,  // AITER shuffle_weight layout (16, 16) of SPEC 4
  cpu_vnni2_n32,   // CPU VNNI-2 panels: [N/32][K/2][32][2] per matrix (pack_weight, moekit/ops/layout.h);
                   //   bf16 / f16 / fp8 elements, N % 32 == 0, K % 2 == 0
};
constexpr int kNumLayouts = 3;
const char* layout_name(Layout l);

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;                    // 0 = absent (optional argument not given)
  int64_t shape[kMaxDims] = {};    // sizes
  int64_t stride[kMaxDims] = {};   // element strides
  Device device = Device::cpu;
  int device_index = 0;
  Layout layout = Layout::row_major;

  // A contiguous (row-major) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu, int device_index = 0);
  // Same, from a shape array (ndim entries).
  static TensorView contiguous(void* data, DType dtype, int ndim, const int64_t* shape,
                               Device device = Device::cpu, int device_index = 0);

  bool present() const { return ndim > 0; }
  int64_t size(int i) const { return shape[i < 0 ? ndim + i : i]; }
  // Element and byte counts; both saturate at INT64_MAX where the product of user sizes overflows
  // (validation rejects such views before any kernel sees them).
  int64_t numel() const;
  int64_t nbytes() const;
  // True when strides are exactly the row-major strides of shape (size-1 dims are ignored).
  bool is_contiguous() const;
  // True when the last dim has stride 1 and each other dim is contiguous except possibly dim 0's
  // stride (a row-strided 2-D matrix, e.g. a slice of a wider buffer).
  bool is_row_strided_2d() const;
  // "[8, 4096] bf16 cpu"
  std::string describe() const;

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

}  // namespace moekit
