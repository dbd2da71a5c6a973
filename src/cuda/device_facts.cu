// current_device_facts: cudaDeviceGetAttribute once per device, then a cached copy.
#include "cuda/device_facts.h"

#include "cuda/cuda_utils.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

namespace moekit::cuda {

namespace {

Status query(int dev, DeviceFacts* f) {
  int l2 = 0, coop = 0;
  const cudaDeviceAttr attrs[] = {cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                  cudaDevAttrL2CacheSize, cudaDevAttrComputeCapabilityMajor,
                                  cudaDevAttrComputeCapabilityMinor, cudaDevAttrCooperativeLaunch};
  int* outs[] = {&f->sm_count, &f->smem_optin_bytes, &l2, &f->cc_major, &f->cc_minor, &coop};
  for (int i = 0; i < 6; ++i) {
    MOEKIT_RETURN_IF_ERROR(check_cuda(cudaDeviceGetAttribute(outs[i], attrs[i], dev), "device facts"));
  }
  f->l2_bytes = l2;
  f->cooperative_launch = coop != 0;
  return Status::Ok();
}

}  // namespace

Status current_device_facts(DeviceFacts* out) {
  static std::mutex mu;
  static std::vector<DeviceFacts> cache;  // by device index; sm_count 0 = not asked yet
  int dev = 0;
  MOEKIT_RETURN_IF_ERROR(check_cuda(cudaGetDevice(&dev), "device facts: current device"));
  std::lock_guard<std::mutex> lock(mu);
  if (dev >= int(cache.size())) cache.resize(dev + 1);
  if (cache[dev].sm_count == 0) MOEKIT_RETURN_IF_ERROR(query(dev, &cache[dev]));
  *out = cache[dev];
  return Status::Ok();
}

DeviceFacts current_device_facts_or_zero() {
  DeviceFacts f;
  if (!current_device_facts(&f).ok()) return DeviceFacts{};
  return f;
}

}  // namespace moekit::cuda
