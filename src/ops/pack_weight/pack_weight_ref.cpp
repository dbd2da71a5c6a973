// pack_weight_ref / unpack_weight_ref (moekit/ops/layout.h): scalar, host-only reference kernels.
//
// Each [N, K] matrix of the batch is moved element by element (raw 16-bit values) to or from the
// closed-form offset vnni2_index() of the cpu_vnni2_n32 layout. The independent oracle
// (src/testing/check_pack_weight.cpp) instead writes the packed tensor sequentially, walking the
// 4-D view [N/32][K/2][32][2] in order. Test: tests/test_pack_weight.cpp.
#include <cstdint>
#include <cstring>

#include "moekit/ops/layout.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {

Status supports(const PackWeightParams& p) { return require_host({{"in", &p.in}, {"out", &p.out}}); }

// inverse = false: dst[vnni2_index(n, c)] = src[n*K + c]; true: the other way round.
void permute(const PackWeightParams& p, bool inverse) {
  const int64_t N = p.in.size(-2), K = p.in.size(-1);
  const int64_t matrices = p.in.numel() / (N * K);
  const auto* src = p.in.ptr<const unsigned char>();
  auto* dst = p.out.ptr<unsigned char>();
  const int64_t eb = dtype_size(p.in.dtype);  // 2 (bf16, f16) or 1 (fp8)
  for (int64_t b = 0; b < matrices; ++b) {
    const int64_t base = b * N * K;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < K; ++c) {
        const int64_t plain = base + n * K + c, packed = base + vnni2_index(n, c, K);
        if (inverse) {
          std::memcpy(dst + plain * eb, src + packed * eb, size_t(eb));
        } else {
          std::memcpy(dst + packed * eb, src + plain * eb, size_t(eb));
        }
      }
    }
  }
}

Status run_pack(const PackWeightParams& p, const RunContext&) {
  permute(p, /*inverse=*/false);
  return Status::Ok();
}

Status run_unpack(const PackWeightParams& p, const RunContext&) {
  permute(p, /*inverse=*/true);
  return Status::Ok();
}

}  // namespace

void register_pack_weight(Registry& r) {
  r.add({"pack_weight_ref", OpKind::pack_weight, MoeVariant::none, Backend::ref,
         "bf16|f16|fp8 raw bits; row_major -> cpu_vnni2_n32", 0, erase_supports<PackWeightParams, supports>, nullptr,
         erase_run<PackWeightParams, run_pack>});
  r.add({"unpack_weight_ref", OpKind::unpack_weight, MoeVariant::none, Backend::ref,
         "bf16|f16|fp8 raw bits; cpu_vnni2_n32 -> row_major", 0, erase_supports<PackWeightParams, supports>, nullptr,
         erase_run<PackWeightParams, run_unpack>});
}

}  // namespace moekit::ref
