// The CUDA kernel table: calls each op's registration hook (added as kernels land).
#include "cuda/cuda_kernels.h"

#include "moekit/core/tensor_view.h"

namespace moekit::cuda {

Status require_device(std::initializer_list<std::pair<const char*, const void*>> tensors) {
  for (const auto& [name, p] : tensors) {
    const auto* t = static_cast<const TensorView*>(p);
    if (t->present() && t->device != Device::cuda) {
      return Unsupported("CUDA kernels need device tensors; ", name, " is on ", device_name(t->device));
    }
  }
  return Status::Ok();
}

void register_cuda_kernels(Registry& r) {
  register_topk_softmax_sm90(r);
  register_grouped_topk_sm90(r);
  register_sigmoid_topk_sm90(r);
  register_sort_tokens_sm90(r);
  register_quantize_fp8_sm90(r);
  register_convert_fp8_sm90(r);
  register_fused_moe_sm90(r);
}

}  // namespace moekit::cuda
