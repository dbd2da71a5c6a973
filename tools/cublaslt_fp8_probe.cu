// Which cuBLASLt fp8 GEMMs (e4m3 x e4m3 -> bf16 / f16, "TN", f32 accumulation) this device and
// cuBLASLt accept, per pair of scale modes and per GEMM shape: for each it prints the heuristic's
// status and the status of one cublasLtMatmul on zero-filled operands. The cuBLAS fp8 baseline
// (src/cuda/moe_baseline_cublas_fp8.cu) is shaped by what it found on the H200 with cuBLASLt 13.1:
// a SCALAR_32F scale pointer only 4-byte aligned ("off4") is refused by cublasLtMatmul, and
// BLK128x128 (A) x VEC128 (B) has no algorithm for n < 16. Not built by CMake; on a GPU machine:
//   nvcc -O1 -gencode=arch=compute_90a,code=sm_90a tools/cublaslt_fp8_probe.cu -lcublasLt -lcublas -o probe
//   ./probe
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

const char* mode_name(int m) {
  switch (m) {
    case -1: return "unset";
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return "OUTER";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128";
    default: return "?";
  }
}

struct Case {
  int mode_a, mode_b;  // -1: attribute left unset (SCALAR by default)
  int scale_offset;    // bytes added to the A scale pointer
};

}  // namespace

int main() {
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  std::printf("cublasLt version %zu\n", cublasLtGetVersion());
  const size_t big = size_t(64) << 20, scales = size_t(4) << 20, ws_bytes = size_t(32) << 20;
  void *a, *b, *d, *sa, *sb, *ws;
  if (cudaMalloc(&a, big) != cudaSuccess || cudaMalloc(&b, big) != cudaSuccess || cudaMalloc(&d, 2 * big) != cudaSuccess ||
      cudaMalloc(&sa, scales) != cudaSuccess || cudaMalloc(&sb, scales) != cudaSuccess ||
      cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
    return 1;
  }
  cudaMemset(a, 0, big);
  cudaMemset(b, 0, big);
  cudaMemset(sa, 0, scales);
  cudaMemset(sb, 0, scales);
  const int S = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, O = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
            V = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, B = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const Case cases[] = {{-1, -1, 0}, {S, S, 0}, {S, S, 4}, {-1, -1, 4}, {O, O, 0}, {B, V, 0},
                        {V, B, 0},   {V, V, 0}, {B, B, 0}, {O, S, 0},   {S, O, 0}};
  const int64_t shapes[][3] = {{512, 1, 256},   {512, 11, 256},   {512, 16, 256},    {512, 17, 256},
                               {512, 64, 256},  {512, 128, 256},  {4096, 11, 4096},  {4096, 128, 4096},
                               {4096, 512, 4096}};
  for (const cudaDataType out_t : {CUDA_R_16BF, CUDA_R_16F}) {
    for (const Case& c : cases) {
      for (const auto& s : shapes) {
        const int64_t m = s[0], n = s[1], k = s[2];
        cublasLtMatmulDesc_t desc;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (c.mode_a >= 0) {
          const int32_t v = c.mode_a;
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &v, sizeof v);
        }
        if (c.mode_b >= 0) {
          const int32_t v = c.mode_b;
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &v, sizeof v);
        }
        const void* sa_off = static_cast<const char*>(sa) + c.scale_offset;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa_off, sizeof sa_off);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
        cublasLtMatrixLayout_t la, lb, ld;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k);
        cublasLtMatrixLayoutCreate(&ld, out_t, uint64_t(m), uint64_t(n), m);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        const uint64_t ws_limit = ws_bytes;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit,
                                             sizeof ws_limit);
        cublasLtMatmulHeuristicResult_t res[4];
        int found = 0;
        const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 4, res, &found);
        const char* run = "-";
        if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
          const float alpha = 1.0f, beta = 0.0f;
          const cublasStatus_t ms =
              cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &res[0].algo, ws, ws_bytes, nullptr);
          const cudaError_t ce = cudaDeviceSynchronize();
          if (ce != cudaSuccess) {
            std::printf("CUDA error %s\n", cudaGetErrorString(ce));
            return 1;
          }
          run = cublasGetStatusString(ms);
        }
        std::printf("%s A=%-6s B=%-6s a_scale+%d m=%5lld n=%4lld k=%5lld heuristic: %s (%d found) matmul: %s\n",
                    out_t == CUDA_R_16BF ? "bf16" : "f16 ", mode_name(c.mode_a), mode_name(c.mode_b), c.scale_offset,
                    (long long)m, (long long)n, (long long)k, cublasGetStatusString(hs), found, run);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
      }
    }
  }
  return 0;
}
