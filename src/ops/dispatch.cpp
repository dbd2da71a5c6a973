// The process-wide kernel table (every compiled backend) and dispatch(), which every op front
// door calls after validation (moekit/registry.h).
#include <exception>
#include <memory>
#include <new>

#include "cpu/cpu_backend.h"
#include "moekit/core/config.h"
#include "moekit/registry.h"
#include "ref/ref_kernels.h"
#if defined(MOEKIT_WITH_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moekit {

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    ref::register_kernels(reg);
    cpu::register_kernels(reg);
#if defined(MOEKIT_WITH_CUDA)
    cuda::register_kernels(reg);
#endif
    return reg;
  }();
  return r;
}

Status dispatch_workspace_size(OpKind op, MoeVariant variant, const void* params,
                               const RunOptions& opts, const std::string& shape_key, size_t* bytes) {
  const Kernel* k = nullptr;
  MOEKIT_RETURN_IF_ERROR(registry().select(op, variant, params, opts, shape_key, &k));
  *bytes = k->workspace_bytes ? k->workspace_bytes(params) : 0;
  return Status::Ok();
}

Status dispatch(OpKind op, MoeVariant variant, const void* params, const RunOptions& opts,
                const std::string& shape_key) {
  const Kernel* k = nullptr;
  MOEKIT_RETURN_IF_ERROR(registry().select(op, variant, params, opts, shape_key, &k));
  RunContext ctx;
  ctx.stream = opts.stream;
  ctx.deterministic = opts.deterministic || config().deterministic;
  const size_t need = k->workspace_bytes ? k->workspace_bytes(params) : 0;
  std::unique_ptr<unsigned char[]> owned;
  if (need > 0) {
    if (opts.workspace != nullptr) {
      if (opts.workspace_bytes < need) {
        return InvalidArgument("workspace: kernel ", k->name, " needs ", need, " bytes, got ",
                               opts.workspace_bytes);
      }
      ctx.workspace = opts.workspace;
      ctx.workspace_bytes = opts.workspace_bytes;
    } else if (k->backend == Backend::cuda) {
      return InvalidArgument("workspace: kernel ", k->name, " needs ", need,
                             " bytes of device workspace and none was given (query it with the op's "
                             "workspace_size function)");
    } else {
      owned.reset(new (std::nothrow) unsigned char[need]);
      if (!owned) return OutOfMemory("workspace: kernel ", k->name, " needs ", need, " bytes of host memory");
      ctx.workspace = owned.get();
      ctx.workspace_bytes = need;
    }
  }
  // The API never throws: an allocation inside a kernel (or an exception from a thread pool task)
  // becomes a Status here, the one place every op's call passes.
  return status_of([&] { return k->run(params, ctx); },
                   [&] { return std::string("kernel ") + k->name + " [" + shape_key + "]"; });
}


}  // namespace moekit
