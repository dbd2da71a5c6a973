// TensorView helpers (moekit/core/tensor_view.h).
#include "moekit/core/tensor_view.h"

#include <cstdint>
#include <sstream>

namespace moekit {

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::row_major: return "row_major";
    case Layout::shuffled_16x16: return "shuffled_16x16";
    case Layout::cpu_vnni2_n32: return "cpu_vnni2_n32";
  }
  return "?";
}

TensorView TensorView::contiguous(void* data, DType dtype, int ndim, const int64_t* shape,
                                  Device device, int device_index) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  t.device = device;
  t.device_index = device_index;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return t;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device, int device_index) {
  int64_t dims[kMaxDims] = {};
  int n = 0;
  for (int64_t d : shape) {
    if (n < kMaxDims) dims[n] = d;
    ++n;
  }
  // More than kMaxDims dims yields an invalid view (ndim > kMaxDims) that validation rejects.
  TensorView t = contiguous(data, dtype, n > kMaxDims ? kMaxDims : n, dims, device, device_index);
  if (n > kMaxDims) t.ndim = n;
  return t;
}

int64_t TensorView::numel() const {
  if (ndim <= 0) return 0;
  int64_t n = 1;
  bool overflow = false;
  for (int i = 0; i < ndim && i < kMaxDims; ++i) {
    if (shape[i] == 0) return 0;
    overflow = overflow || __builtin_mul_overflow(n, shape[i], &n);
  }
  return overflow ? INT64_MAX : n;
}

int64_t TensorView::nbytes() const {
  int64_t b = 0;
  return __builtin_mul_overflow(numel(), int64_t(dtype_size(dtype)), &b) ? INT64_MAX : b;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // an empty tensor has no element whose address could be off
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

bool TensorView::is_row_strided_2d() const {
  if (ndim != 2) return false;
  return (shape[1] <= 1 || stride[1] == 1) && (shape[0] <= 1 || stride[0] >= shape[1]);
}

std::string TensorView::describe() const {
  if (!present()) return "(absent)";
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim && i < kMaxDims; ++i) os << (i ? ", " : "") << shape[i];
  os << "] " << dtype_name(dtype) << ' ' << device_name(device);
  if (layout != Layout::row_major) os << ' ' << layout_name(layout);
  return os.str();
}

}  // namespace moekit
