// TensorView sizes and the shared argument checks (src/core/check.h) on hostile shapes: products
// of sizes that overflow int64, enum fields holding unknown values, strided spans and overlap.
// Run: ./build/tests/moekit_tests --gtest_filter='TensorView.*'
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "moekit/core/tensor_view.h"

namespace moekit {
namespace {

int64_t p2(int e) { return int64_t(1) << e; }

// [2^21, 2^22, 2^21] is 2^64 elements: the plain product wrapped to 0, so a null pointer passed
// as "an empty tensor" and fused_moe then read through it.
TEST(TensorView, NumelAndNbytesSaturateInsteadOfWrapping) {
  const TensorView t = TensorView::contiguous(nullptr, DType::bf16, {p2(21), p2(22), p2(21)});
  EXPECT_EQ(t.numel(), INT64_MAX);
  EXPECT_EQ(t.nbytes(), INT64_MAX);
  const TensorView big = TensorView::contiguous(nullptr, DType::f32, {p2(31), p2(31)});
  EXPECT_EQ(big.numel(), p2(62));
  EXPECT_EQ(big.nbytes(), INT64_MAX);  // 2^64 bytes
  EXPECT_EQ(TensorView::contiguous(nullptr, DType::f32, {p2(40), 0, p2(40)}).numel(), 0);
}

TEST(TensorView, WellFormedRejectsSizesThatOverflow) {
  int x = 0;
  const TensorView wrap = TensorView::contiguous(nullptr, DType::bf16, {p2(21), p2(22), p2(21)});
  Status s = check::well_formed(wrap, "w1");
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("w1: [2097152, 4194304, 2097152] bf16 cpu"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("spans more than 2^62 bytes"), std::string::npos) << s.message();
  // Fits as elements, not as bytes.
  EXPECT_FALSE(check::well_formed(TensorView::contiguous(&x, DType::f32, {p2(31), p2(31)}), "t").ok());
  // A huge stride on a small shape: the last element's offset overflows.
  TensorView strided = TensorView::contiguous(&x, DType::f32, {2, 2});
  strided.stride[0] = INT64_MAX / 2;
  EXPECT_FALSE(check::well_formed(strided, "t").ok());
  strided.stride[0] = INT64_MIN;
  EXPECT_FALSE(check::well_formed(strided, "t").ok());
  // Large but representable views stay valid (validation never reads the data).
  EXPECT_TRUE(check::well_formed(TensorView::contiguous(&x, DType::bf16, {p2(20), p2(20), p2(20)}), "t").ok());
}

// Enum fields hold whatever byte the caller stored: Layout(9) took the shuffled path without its
// checks, and an unknown dtype had size 0.
TEST(TensorView, WellFormedRejectsUnknownEnumValues) {
  int x = 0;
  TensorView t = TensorView::contiguous(&x, DType::f32, {1});
  t.layout = static_cast<Layout>(9);
  Status s = check::well_formed(t, "w1");
  EXPECT_NE(s.message().find("w1: layout 9 is not a Layout"), std::string::npos) << s.message();
  t = TensorView::contiguous(&x, DType::f32, {1});
  t.dtype = static_cast<DType>(99);
  s = check::well_formed(t, "x");
  EXPECT_NE(s.message().find("x: dtype 99 is not a DType"), std::string::npos) << s.message();
  t = TensorView::contiguous(&x, DType::f32, {1});
  t.device = static_cast<Device>(7);
  s = check::well_formed(t, "x");
  EXPECT_NE(s.message().find("x: device 7 is not a Device"), std::string::npos) << s.message();
}

TEST(TensorView, SpanAndOverlapCountStridedRows) {
  float buf[64] = {};
  // A [4, 8] view with row stride 16: 56 elements from the first to the last, not 32.
  TensorView rows = TensorView::contiguous(buf, DType::f32, {4, 8});
  rows.stride[0] = 16;
  int64_t bytes = 0;
  ASSERT_TRUE(check::span_bytes(rows, &bytes));
  EXPECT_EQ(bytes, (3 * 16 + 8) * 4);
  const TensorView tail = TensorView::contiguous(buf + 50, DType::f32, {4});  // inside row 3
  EXPECT_TRUE(check::overlaps(rows, tail));
  const TensorView after = TensorView::contiguous(buf + 56, DType::f32, {8});
  EXPECT_FALSE(check::overlaps(rows, after));
  EXPECT_FALSE(check::overlaps(rows, TensorView::contiguous(buf, DType::f32, {0})));
}

}  // namespace
}  // namespace moekit
