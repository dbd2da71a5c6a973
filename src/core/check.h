// Argument checks shared by every op's validate_<op>() (internal header).
//
// Each returns ok or an invalid_argument Status whose message starts with the argument's name and
// shows the offending value, e.g. "topk_ids: shape must be [4, 2], got [4, 3]".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"

namespace moekit::check {

using Dims = std::vector<int64_t>;
// The shape of t as a vector (empty for an absent tensor).
inline Dims dims_of(const TensorView& t) { return Dims(t.shape, t.shape + (t.ndim > 0 ? t.ndim : 0)); }
// "[4, 2]"
std::string dims_str(const Dims& d);

// "[4, 2]" with -1 printed as "*".
std::string shape_str(std::initializer_list<int64_t> dims);

Status present(const TensorView& t, const char* name);
Status absent(const TensorView& t, const char* name, const char* why);
// ndim within kMaxDims, dtype / layout / device known values, non-negative sizes, the byte span
// at most kMaxSpanBytes (no size derived from the shape can overflow), data non-null when it has
// elements.
Status well_formed(const TensorView& t, const char* name);
Status dtype_in(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
// Exact shape; -1 accepts any size in that position.
Status shape_is(const TensorView& t, const char* name, std::initializer_list<int64_t> dims);
Status contiguous(const TensorView& t, const char* name);
// 2-D, last dim contiguous, row stride >= row length.
Status row_strided(const TensorView& t, const char* name);
Status layout_is(const TensorView& t, const char* name, Layout l);
// All present tensors in the list live on the same device as `ref`.
Status same_device(const TensorView& ref, const char* ref_name, const TensorView& t, const char* name);

// The most bytes one view may span: 2^62 leaves room for sums of a few such sizes in int64.
constexpr int64_t kMaxSpanBytes = int64_t(1) << 62;
// Bytes from data to the end of the view's farthest element, at least numel * element size (0
// for an empty view); false when that is over kMaxSpanBytes or overflows.
bool span_bytes(const TensorView& t, int64_t* bytes);

// Whether the byte ranges [data, data + span) of two tensors intersect (an empty tensor overlaps
// nothing; strided views count the whole range they span). A predicate, not a Status: each op
// words its own aliasing rule.
bool overlaps(const TensorView& a, const TensorView& b);

// A tensor and its argument name, for the list checks below.
using Named = std::pair<const TensorView*, const char*>;
// No present output overlaps another output or any present input: "topk_ids: must not overlap
// gating". For ops whose kernels write outputs while they still read inputs (no in-place form).
Status outputs_disjoint(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs);

}  // namespace moekit::check
