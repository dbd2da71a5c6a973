// The reference backend's registration hooks: each src/ops/<op>/<op>_ref.cpp adds its rows.
#pragma once

#include "moekit/registry.h"

namespace moekit::ref {

void register_topk_softmax(Registry& r);
void register_grouped_topk(Registry& r);
void register_sigmoid_topk(Registry& r);
void register_sort_tokens(Registry& r);
void register_shuffle_weight(Registry& r);  // shuffle_weight and unshuffle_weight
void register_quantize_fp8(Registry& r);
void register_convert_fp8(Registry& r);
void register_fused_moe(Registry& r);
void register_pack_weight(Registry& r);  // pack_weight and unpack_weight

// Adds every reference kernel and the (always available) backend probe.
void register_kernels(Registry& r);

// Ref kernels need host tensors; returns unsupported naming the first device tensor.
Status require_host(std::initializer_list<std::pair<const char*, const void*>> tensors);

}  // namespace moekit::ref
