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
  // Enum fields hold any byte a caller stores there: an unknown value would take no path's checks.
  if (int(t.dtype) >= kNumDTypes) return InvalidArgument(name, ": dtype ", int(t.dtype), " is not a DType");
  if (int(t.layout) >= kNumLayouts) return InvalidArgument(name, ": layout ", int(t.layout), " is not a Layout");
  if (t.device != Device::cpu && t.device != Device::cuda) {
    return InvalidArgument(name, ": device ", int(t.device), " is not a Device");
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return InvalidArgument(name, ": size of dim ", i, " is negative (", t.shape[i], ")");
  }
  // Every size the kernels derive from the shape (element and byte counts, the last element's
  // offset) must fit with room to spare: a wrapped product would make a huge view look empty.
  int64_t bytes = 0;
  if (!span_bytes(t, &bytes)) {
    return InvalidArgument(name, ": ", t.describe(), " with strides ", dims_str(Dims(t.stride, t.stride + t.ndim)),
                           " spans more than 2^62 bytes");
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return InvalidArgument(name, ": data is null but the tensor has ", t.numel(), " elements");
  }
  return Status::Ok();
}

bool span_bytes(const TensorView& t, int64_t* bytes) {
  *bytes = 0;
  if (t.ndim <= 0 || t.ndim > kMaxDims || t.numel() == 0) return true;
  int64_t elems = 1, last = 0;  // the element count and the last element's offset, in elements
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return false;
    int64_t step = 0;
    const int64_t stride = t.stride[i] < 0 ? -t.stride[i] : t.stride[i];
    if (__builtin_mul_overflow(elems, t.shape[i], &elems) || t.stride[i] == INT64_MIN ||
        __builtin_mul_overflow(t.shape[i] - 1, stride, &step) || __builtin_add_overflow(last, step, &last)) {
      return false;
    }
  }
  const int64_t extent = std::max(elems, last + 1);
  return !__builtin_mul_overflow(extent, int64_t(dtype_size(t.dtype)), bytes) && *bytes <= kMaxSpanBytes;
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
  int64_t na = 0, nb = 0;
  if (!span_bytes(a, &na) || !span_bytes(b, &nb)) return true;  // unvalidated: assume the worst
  if (na == 0 || nb == 0) return false;
  const auto* a0 = static_cast<const unsigned char*>(a.data);
  const auto* b0 = static_cast<const unsigned char*>(b.data);
  return a0 < b0 + nb && b0 < a0 + na;
}

Status outputs_disjoint(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (!o->first->present()) continue;
    for (auto other = o + 1; other != outputs.end(); ++other) {
      if (other->first->present() && overlaps(*o->first, *other->first)) {
        return InvalidArgument(o->second, ": must not overlap ", other->second);
      }
    }
    for (const Named& in : inputs) {
      if (in.first->present() && overlaps(*o->first, *in.first)) {
        return InvalidArgument(o->second, ": must not overlap ", in.second);
      }
    }
  }
  return Status::Ok();
}

}  // namespace moekit::check
