// Argument checks shared by the routing front doors (SPEC 1.1 topk_softmax, 1.2 grouped_topk,
// 1.3 sigmoid_topk): the gating logits [T, Eg] they read and the topk_weights / topk_ids [T, k]
// they write. Internal header. Tests: the validation tests of tests/test_topk_softmax.cpp,
// tests/test_grouped_topk.cpp and tests/test_sigmoid_topk.cpp.
#pragma once

#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"

namespace moekit::check {

// gating: present, f32 / bf16 / f16, 2-D [T, Eg], row-strided, Eg >= 1.
Status routing_gating(const TensorView& gating);

// topk_weights: present, f32, [T, k], contiguous; topk_ids: present, i32, [T, k], contiguous; both
// on gating's device; neither overlaps the other or gating. T = gating.shape[0]: call after
// routing_gating(gating) succeeded.
Status routing_outputs(const TensorView& gating, const TensorView& topk_weights, const TensorView& topk_ids,
                       int k);

}  // namespace moekit::check
