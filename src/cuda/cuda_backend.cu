// CUDA backend registration for Hopper (sm_90a). The kernels arrive with their own issues; this
// file holds the plumbing: the device probe and the (so far empty) kernel table.
#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"

namespace moekit::cuda {

namespace {

Status probe() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return BackendError("no usable CUDA device (", cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
  }
  if (count == 0) return BackendError("no CUDA device");
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return BackendError("cannot query CUDA device ", dev);
  if (prop.major != 9 || prop.minor != 0) {
    return Unsupported("kernels are built for sm_90a; device ", dev, " (", prop.name, ") is sm_", prop.major,
                       prop.minor);
  }
  return Status::Ok();
}

}  // namespace

void register_kernels(Registry& r) { r.set_backend_probe(Backend::cuda, probe); }

}  // namespace moekit::cuda
