// Reference backend registration: scalar, single-threaded, float accumulation (the oracle).
#include "moekit/core/tensor_view.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {
Status probe() { return Status::Ok(); }
}  // namespace

Status require_host(std::initializer_list<std::pair<const char*, const void*>> tensors) {
  for (const auto& [name, p] : tensors) {
    const auto* t = static_cast<const TensorView*>(p);
    if (t->present() && t->device != Device::cpu) {
      return Unsupported("reference kernels need host tensors; ", name, " is on ", device_name(t->device));
    }
  }
  return Status::Ok();
}

void register_kernels(Registry& r) {
  r.set_backend_probe(Backend::ref, probe);
  register_topk_softmax(r);
  register_grouped_topk(r);
  register_sigmoid_topk(r);
  register_sort_tokens(r);
  register_shuffle_weight(r);
  register_quantize_fp8(r);
  register_convert_fp8(r);
  register_fused_moe(r);
  register_pack_weight(r);
}

}  // namespace moekit::ref
