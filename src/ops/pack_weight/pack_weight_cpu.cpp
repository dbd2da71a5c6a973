// pack_weight_cpu / unpack_weight_cpu (moekit/ops/layout.h): the CPU backend's weight pre-packing.
// A K-pair is one word (32 bits for bf16 / f16, 16 for fp8), so cpu_vnni2_n32 ([N/32][K/2][32][2])
// is, per 32-row panel, the transpose of a [32][K/2] word matrix into [K/2][32]. Panels (matrix x panel)
// are split over the threads with a fixed partition (each output word written once: deterministic)
// and moved in blocks of 16 K-pairs, so each of the 32 rows is read 64 contiguous bytes at a time
// and the packed side is written sequentially. Portable C++ (no ISA requirement).
// Test: tests/test_pack_weight.cpp (PackWeight.CpuKernelsMatchRef + the check hooks).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/thread_pool.h"
#include "moekit/ops/layout.h"
#include "ref/ref_kernels.h"

namespace moekit::cpu {

void register_pack_weight_cpu(Registry& r);

namespace {

constexpr int64_t kPairBlock = 16;  // K-pairs per block

Status supports(const PackWeightParams& p) { return ref::require_host({{"in", &p.in}, {"out", &p.out}}); }

// inverse = false: packed <- plain (pack); true: plain <- packed (unpack). N % 32 == 0, K even
// (the front door checked them).
void permute(const PackWeightParams& p, bool inverse) {
  const int64_t N = p.in.size(-2), K = p.in.size(-1), KP = K / 2;
  const int64_t panels = N / kVnniPanelN, matrices = N * K == 0 ? 0 : p.in.numel() / (N * K);
  // Words are moved with memcpy: the buffers hold 16-bit values (no 32-bit aliasing, any alignment).
  const auto* src = p.in.ptr<const unsigned char>();
  auto* dst = p.out.ptr<unsigned char>();
  const int64_t wb = 2 * dtype_size(p.in.dtype);  // bytes per K-pair word: 4 or 2
  parallel_for(matrices * panels, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t base = (t / panels) * N * KP;           // this matrix, in words
      const int64_t plain0 = base + (t % panels) * kVnniPanelN * KP;  // the panel's first plain word
      const int64_t packed0 = plain0;                       // a panel occupies the same word range
      for (int64_t q0 = 0; q0 < KP; q0 += kPairBlock) {
        const int64_t nq = std::min(KP, q0 + kPairBlock) - q0;
        for (int64_t j = 0; j < kVnniPanelN; ++j) {
          // Row j's words q0 .. q0 + nq (contiguous) <-> column j of packed rows q0 .. (stride 32 words).
          unsigned char* plain = (inverse ? dst : const_cast<unsigned char*>(src)) + (plain0 + j * KP + q0) * wb;
          unsigned char* packed = (inverse ? const_cast<unsigned char*>(src) : dst) + (packed0 + q0 * kVnniPanelN + j) * wb;
          if (wb == 4) {
            if (inverse) {
              for (int64_t q = 0; q < nq; ++q) std::memcpy(plain + 4 * q, packed + 4 * kVnniPanelN * q, 4);
            } else {
              for (int64_t q = 0; q < nq; ++q) std::memcpy(packed + 4 * kVnniPanelN * q, plain + 4 * q, 4);
            }
          } else if (inverse) {
            for (int64_t q = 0; q < nq; ++q) std::memcpy(plain + 2 * q, packed + 2 * kVnniPanelN * q, 2);
          } else {
            for (int64_t q = 0; q < nq; ++q) std::memcpy(packed + 2 * kVnniPanelN * q, plain + 2 * q, 2);
          }
        }
      }
    }
  });
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

void register_pack_weight_cpu(Registry& r) {
  r.add({"pack_weight_cpu", OpKind::pack_weight, MoeVariant::none, Backend::cpu,
         "bf16|f16|fp8 raw bits; row_major -> cpu_vnni2_n32, K-pair word transposes per panel, threads over panels", 50,
         erase_supports<PackWeightParams, supports>, nullptr, erase_run<PackWeightParams, run_pack>});
  r.add({"unpack_weight_cpu", OpKind::unpack_weight, MoeVariant::none, Backend::cpu,
         "bf16|f16|fp8 raw bits; cpu_vnni2_n32 -> row_major, threads over panels", 50,
         erase_supports<PackWeightParams, supports>, nullptr, erase_run<PackWeightParams, run_unpack>});
}

}  // namespace moekit::cpu
