// CUDA backend registration for Hopper (sm_90a): the device probe, the device memory and timing
// operations the harness and CLI use (DeviceOps; time_graph lives in cuda_timing.cu), and the kernel
// table (rows added by each op's _sm90.cu file through the hooks in cuda/cuda_kernels.h).
#include <cuda_runtime.h>

#include <sstream>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_timing.h"
#include "cuda/cuda_utils.h"

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

Status dev_alloc(size_t bytes, void** out) {
  *out = nullptr;
  if (bytes == 0) return Status::Ok();
  return check_cuda(cudaMalloc(out, bytes), "cudaMalloc");
}
void dev_free(void* p) {
  if (p != nullptr) cudaFree(p);
}
Status to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  // cudaMemcpy from pageable memory may return before the DMA into dst is done, and work on a
  // cudaStreamNonBlocking stream does not wait for it: the legacy stream is synchronized so the
  // data is on the device, for every stream, when this returns (a CUDA-graph replay on a
  // non-blocking stream read half-copied inputs without this).
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D"));
  return check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after H2D");
}
Status to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  return check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
Status dev_memset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  return check_cuda(cudaMemset(dst, value, bytes), "cudaMemset");
}
Status dev_sync() { return check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
Status mem_info(size_t* free_bytes, size_t* total_bytes) {
  return check_cuda(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}
std::string describe() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "no device";
  std::ostringstream os;
  os << prop.name << ", " << prop.multiProcessorCount << " SMs, " << (prop.l2CacheSize >> 20) << " MiB L2, sm_"
     << prop.major << prop.minor;
  return os.str();
}

const DeviceOps kOps = {dev_alloc, dev_free, to_device, to_host, dev_memset, dev_sync, describe, time_graph, mem_info};

}  // namespace

void register_kernels(Registry& r) {
  r.set_backend_probe(Backend::cuda, probe);
  r.set_device_ops(Backend::cuda, &kOps);
  register_cuda_kernels(r);
}

}  // namespace moekit::cuda
