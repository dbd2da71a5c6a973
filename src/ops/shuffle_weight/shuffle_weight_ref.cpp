// shuffle_weight_ref / unshuffle_weight_ref (SPEC 4): scalar, host-only reference kernels.
//
// Each [N, K] matrix of the batch is moved element by element (raw bits, 1, 2 or 4 bytes) to or
// from the closed-form offset shuffle_index() of moekit/ops/layout.h. The independent oracle
// (src/testing/oracle_layout_quant.cpp) instead materialises the 5-D view and its permutation.
// Test: tests/test_shuffle_weight.cpp.
#include <cstring>

#include "moekit/ops/layout.h"
#include "ref/ref_kernels.h"

namespace moekit::ref {

namespace {

Status supports(const ShuffleWeightParams& p) {
  return require_host({{"in", &p.in}, {"out", &p.out}});
}

// inverse = false: dst[shuffle_index(n, c)] = src[n*K + c]; true: the other way round.
void permute(const ShuffleWeightParams& p, bool inverse) {
  const int eb = dtype_size(p.in.dtype);
  const int64_t N = p.in.size(-2), K = p.in.size(-1);
  const int64_t matrices = p.in.numel() / (N * K);
  const auto* src = static_cast<const unsigned char*>(p.in.data);
  auto* dst = static_cast<unsigned char*>(p.out.data);
  for (int64_t b = 0; b < matrices; ++b) {
    const int64_t base = b * N * K;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < K; ++c) {
        const int64_t plain = base + n * K + c;
        const int64_t shuffled = base + shuffle_index(n, c, K, eb);
        const int64_t from = inverse ? shuffled : plain, to = inverse ? plain : shuffled;
        std::memcpy(dst + to * eb, src + from * eb, size_t(eb));
      }
    }
  }
}

Status run_shuffle(const ShuffleWeightParams& p, const RunContext&) {
  permute(p, /*inverse=*/false);
  return Status::Ok();
}

Status run_unshuffle(const ShuffleWeightParams& p, const RunContext&) {
  permute(p, /*inverse=*/true);
  return Status::Ok();
}

}  // namespace

void register_shuffle_weight(Registry& r) {
  r.add({"shuffle_weight_ref", OpKind::shuffle_weight, MoeVariant::none, Backend::ref,
         "any dtype of 1|2|4 bytes, raw bits; row_major -> shuffled_16x16", 0,
         erase_supports<ShuffleWeightParams, supports>, nullptr, erase_run<ShuffleWeightParams, run_shuffle>});
  r.add({"unshuffle_weight_ref", OpKind::unshuffle_weight, MoeVariant::none, Backend::ref,
         "any dtype of 1|2|4 bytes, raw bits; shuffled_16x16 -> row_major", 0,
         erase_supports<ShuffleWeightParams, supports>, nullptr,
         erase_run<ShuffleWeightParams, run_unshuffle>});
}

}  // namespace moekit::ref
