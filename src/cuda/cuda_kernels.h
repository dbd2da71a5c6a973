// The CUDA backend's per-op registration hooks: each src/ops/<op>/<op>_sm90.cu adds its rows.
#pragma once

#include "moekit/registry.h"

namespace moekit::cuda {

// Adds every CUDA kernel (cuda_kernels.cpp calls the per-op hooks below).
void register_cuda_kernels(Registry& r);

// Per-op hooks (src/ops/<op>/<op>_sm90*.cu / .cpp).
void register_topk_softmax_sm90(Registry& r);
void register_grouped_topk_sm90(Registry& r);
void register_sigmoid_topk_sm90(Registry& r);
void register_sort_tokens_sm90(Registry& r);
void register_quantize_fp8_sm90(Registry& r);
void register_convert_fp8_sm90(Registry& r);

void register_fused_moe_sm90(Registry& r);  // src/ops/fused_moe/fused_moe_sm90.cpp

// Device tensors required: returns unsupported naming the first host tensor.

Status require_device(std::initializer_list<std::pair<const char*, const void*>> tensors);

}  // namespace moekit::cuda
