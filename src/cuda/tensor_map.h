// Host side of the Hopper bulk tensor copy (TMA): encoding a 2-D tensor map for a K-contiguous bf16 /
// f16 / fp8 matrix, boxes of 128 bytes (K) x box_rows rows with the 128-byte swizzle that the wgmma descriptors of
// cuda/sm90/wgmma_desc.h expect (8-row atoms of 1024 bytes).
// cuTensorMapEncodeTiled is a driver API entry point; it is looked up once through the runtime
// (cudaGetDriverEntryPointByVersion) so the library links no libcuda and the static runtime stays
// enough. CUDA-only header: include only from .cu files.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.h"
#include "moekit/core/status.h"

namespace moekit::cuda {

// cuTensorMapEncodeTiled, or nullptr when the driver lacks it (looked up once, thread-safe).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Tensor map of a row-major [rows, cols] matrix of `type` (elem_bytes each: 2 for bf16 / f16, 1 for
// fp8 codes as UINT8, 4 for f32) with row stride ld elements; boxes of swizzle_bytes (128 or 64)
// bytes of columns x box_rows rows, swizzled at that width. Reads past the matrix (rows >= rows)
// land as zeros. Requires: base 16-byte aligned, ld * elem_bytes % 16 == 0.
inline Status encode_tensor_map_2d(CUtensorMap* map, const void* base, CUtensorMapDataType type, uint32_t elem_bytes,
                                   uint64_t rows, uint64_t cols, uint64_t ld, uint32_t box_rows, const char* what,
                                   uint32_t swizzle_bytes = 128) {
  if (swizzle_bytes != 128 && swizzle_bytes != 64) {
    return InvalidArgument(what, ": swizzle of ", swizzle_bytes, " bytes (128 or 64)");
  }
  const PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (enc == nullptr) return BackendError(what, ": the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {ld * elem_bytes};
  const cuuint32_t box[2] = {swizzle_bytes / elem_bytes, box_rows};  // one swizzle row of columns
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = enc(map, type, 2,
                         const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return BackendError(what, ": cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for [", rows, ", ", cols,
                        "] ld ", ld);
  }
  return Status::Ok();
}

// 16-bit elements (bf16 or f16).
inline Status encode_tensor_map_2d(CUtensorMap* map, const void* base, bool bf16, uint64_t rows, uint64_t cols,
                                   uint64_t ld, uint32_t box_rows, const char* what) {
  return encode_tensor_map_2d(map, base, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                              rows, cols, ld, box_rows, what);
}

}  // namespace moekit::cuda
