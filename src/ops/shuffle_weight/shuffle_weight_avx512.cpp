// shuffle_weight_avx512 / unshuffle_weight_avx512: the CPU backend's AITER (16, 16) weight layout
// (SPEC 4, contract moekit/ops/layout.h), bit-exact, any element size (1, 2 or 4 bytes).
//
// In bytes the layout is a transpose of 16-byte vectors: a tile of 16 rows x 32 elements (32 * eb
// bytes per row = 2 * eb vectors) is stored vector-column major, vector v of row r at
// tile_base + (v * 16 + r) * 16, tiles in row-block-major order (shuffle_index() of layout.h, times
// the element size). So the kernel is a blocked copy: per 16-row block, per tile, per vector column,
// 16 x 16-byte moves that fill 256 contiguous destination bytes; unshuffle is the same copy with
// source and destination swapped. Threads take whole 16-row blocks (of every matrix of the batch)
// in fixed contiguous ranges; each destination byte has one writer: deterministic and identical to
// the reference. Test: tests/test_shuffle_weight.cpp (Cpu* cases) and every case of
// src/testing/check_layout_quant.cpp (these kernels against the *_ref ones).
#include <cstdint>

#include "cpu/cpu_simd.h"
#include "cpu/thread_pool.h"
#include "moekit/ops/layout.h"

namespace moekit::cpu {

void register_shuffle_weight_avx512(Registry& r);

namespace {

// Bytes below which the call stays on the calling thread (waking the pool costs more).
constexpr int64_t kSerialBytes = int64_t(1) << 18;

Status supports(const ShuffleWeightParams& p) {
  return require_host_tensors("shuffle_weight_avx512", {{"in", &p.in}, {"out", &p.out}});
}

// 16-row blocks [w0, w1) over every matrix (w = matrix * N/16 + row block). inverse = false:
// plain -> shuffled; true: shuffled -> plain.
MOEKIT_CPU_AVX512 void row_blocks(const ShuffleWeightParams& p, bool inverse, int64_t w0, int64_t w1) {
  const int64_t eb = dtype_size(p.in.dtype);
  const int64_t N = p.in.size(-2), K = p.in.size(-1);
  const int64_t row_bytes = K * eb, tiles = K / kShuffleTileK;
  const int64_t tile_bytes = kShuffleTileN * kShuffleTileK * eb, vecs = kShuffleTileK * eb / kShuffleVecBytes;
  const auto* src = static_cast<const uint8_t*>(p.in.data);
  auto* dst = static_cast<uint8_t*>(p.out.data);
  for (int64_t w = w0; w < w1; ++w) {
    // The block's first byte is the same in both layouts: rows before it fill whole tiles.
    const int64_t block = (w / (N / kShuffleTileN) * N + w % (N / kShuffleTileN) * kShuffleTileN) * row_bytes;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t plain0 = block + tile * kShuffleTileK * eb;  // row 0 of the tile, plain layout
      const int64_t shuf0 = block + tile * tile_bytes;          // the tile, shuffled layout
      for (int64_t v = 0; v < vecs; ++v) {
        for (int64_t r = 0; r < kShuffleTileN; ++r) {
          const int64_t plain = plain0 + r * row_bytes + v * kShuffleVecBytes;
          const int64_t shuf = shuf0 + (v * kShuffleTileN + r) * kShuffleVecBytes;
          const int64_t from = inverse ? shuf : plain, to = inverse ? plain : shuf;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + to), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + from)));
        }
      }
    }
  }
}

void permute(const ShuffleWeightParams& p, bool inverse) {
  const int64_t N = p.in.size(-2), K = p.in.size(-1);
  const int64_t blocks = p.in.numel() / (N * K) * (N / kShuffleTileN);
  parallel_for_if(p.in.numel() * dtype_size(p.in.dtype) >= kSerialBytes, blocks,
                  [&](int64_t w0, int64_t w1) { row_blocks(p, inverse, w0, w1); });
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

void register_shuffle_weight_avx512(Registry& r) {
  r.add({"shuffle_weight_avx512", OpKind::shuffle_weight, MoeVariant::none, Backend::cpu,
         "any dtype of 1|2|4 bytes, raw bits; row_major -> shuffled_16x16; blocked 16-byte copy", 50,
         erase_supports<ShuffleWeightParams, supports>, nullptr, erase_run<ShuffleWeightParams, run_shuffle>});
  r.add({"unshuffle_weight_avx512", OpKind::unshuffle_weight, MoeVariant::none, Backend::cpu,
         "any dtype of 1|2|4 bytes, raw bits; shuffled_16x16 -> row_major; blocked 16-byte copy", 50,
         erase_supports<ShuffleWeightParams, supports>, nullptr, erase_run<ShuffleWeightParams, run_unshuffle>});
}

}  // namespace moekit::cpu
