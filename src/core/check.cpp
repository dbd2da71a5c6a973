// Argument checks shared by the ops' validation (src/core/check.h).
#include "core/check.h"

#include <algorithm>
#include <sstream>

namespace moekit::check {

std::string dims_str(const Dims& d) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << ']';
  return os.str();
}

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::ostringstream os;
  os << '[';
  int i = 0;
  for (int64_t d : dims) {
    os << (i++ ? ", " : "");
    if (d < 0) os << '*';
    else os << d;
  }
  os << ']';
  return os.str();
}

namespace {
std::string actual_shape(const TensorView& t) {
  return dims_str(Dims(t.shape, t.shape + std::min(std::max(t.ndim, 0), kMaxDims)));
}
}  // namespace

Status present(const TensorView& t, const char* name) {
  if (!t.present()) return InvalidArgument(name, ": required but not given");
  return well_formed(t, name);
}

Status absent(const TensorView& t, const char* name, const char* why) {
  if (t.present()) return InvalidArgument(name, ": must not be given (", why, "), got ", t.describe());
  return Status::Ok();
}

Status well_formed(const TensorView& t, const char* name) {
  if (t.ndim < 0 || t.ndim > kMaxDims) {
    return InvalidArgument(name, ": ndim must be in [1, ", kMaxDims, "], got ", t.ndim);
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return InvalidArgument(name, ": size of dim ", i, " is negative (", t.shape[i], ")");
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return InvalidArgument(name, ": data is null but the tensor has ", t.numel(), " elements");
  }
  return Status::Ok();
}

Status dtype_in(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  std::string list;
  for (DType d : allowed) {
    if (t.dtype == d) return Status::Ok();
    list += (list.empty() ? "" : "|");
    list += dtype_name(d);
  }
  return InvalidArgument(name, ": dtype must be ", list, ", got ", dtype_name(t.dtype));
}

Status shape_is(const TensorView& t, const char* name, std::initializer_list<int64_t> dims) {
  bool ok = t.ndim == int(dims.size());
  int i = 0;
  for (int64_t d : dims) {
    if (ok && d >= 0 && t.shape[i] != d) ok = false;
    ++i;
  }
  if (!ok) return InvalidArgument(name, ": shape must be ", shape_str(dims), ", got ", actual_shape(t));
  return Status::Ok();
}

Status contiguous(const TensorView& t, const char* name) {
  if (!t.is_contiguous()) return InvalidArgument(name, ": must be contiguous (row-major strides)");
  return Status::Ok();
}

Status row_strided(const TensorView& t, const char* name) {
  if (!t.is_row_strided_2d()) {
    return InvalidArgument(name, ": must be 2-D with a contiguous last dim and row stride >= ",
                           t.ndim == 2 ? t.shape[1] : 0, ", got strides [", t.stride[0], ", ",
                           t.ndim >= 2 ? t.stride[1] : 0, "]");
  }
  return Status::Ok();
}

Status layout_is(const TensorView& t, const char* name, Layout l) {
  if (t.layout != l) {
    return InvalidArgument(name, ": layout must be ", layout_name(l), ", got ", layout_name(t.layout));
  }
  return Status::Ok();
}

Status same_device(const TensorView& ref, const char* ref_name, const TensorView& t, const char* name) {
  if (!t.present()) return Status::Ok();
  if (t.device != ref.device || t.device_index != ref.device_index) {
    return InvalidArgument(name, ": is on ", device_name(t.device), ":", t.device_index, " but ", ref_name,
                           " is on ", device_name(ref.device), ":", ref.device_index);
  }
  return Status::Ok();
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const unsigned char*>(a.data);
  const auto* b0 = static_cast<const unsigned char*>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace moekit::check
