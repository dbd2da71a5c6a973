// The safetensors reader (include/moekit/model/safetensors.h): a hand-built valid file (values,
// metadata, scalar, zero-size tensor, header padding), open() from disk, then every rejection --
// each malformed file gives an InvalidArgument naming the problem, never a crash; and hostile files
// (issue 28): a folder, a FIFO or a device in place of the file, a header nested a million deep.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "moekit/model/safetensors.h"

namespace moekit::model {
namespace {

// 8-byte little-endian length + header + data.
std::vector<uint8_t> blob(const std::string& header, const std::vector<uint8_t>& data, int64_t claimed_len = -1) {
  const uint64_t n = claimed_len >= 0 ? uint64_t(claimed_len) : header.size();
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Status parse(const std::vector<uint8_t>& b, SafetensorsFile* f = nullptr) {
  SafetensorsFile tmp;
  return SafetensorsFile::parse(b.data(), b.size(), f ? f : &tmp);
}

// "a": f32 [2] at [0, 8), "b": bf16 [1, 3] at [8, 14), "s": i32 scalar at [14, 18), "z": f16 [0, 4].
const std::string kHeader =
    R"({"__metadata__": {"format": "pt"}, "b": {"dtype": "BF16", "shape": [1, 3], "data_offsets": [8, 14]},)"
    R"( "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
    R"( "s": {"dtype": "I32", "shape": [], "data_offsets": [14, 18]},)"
    R"( "z": {"dtype": "F16", "shape": [0, 4], "data_offsets": [18, 18]}}    )";

std::vector<uint8_t> data18() {
  std::vector<uint8_t> d(18);
  const float a[2] = {1.5f, -2.0f};
  std::memcpy(d.data(), a, 8);
  const uint16_t b[3] = {0x3F80, 0x4000, 0xC040};  // bf16 1, 2, -3
  std::memcpy(d.data() + 8, b, 6);
  const int32_t s = 42;
  std::memcpy(d.data() + 14, &s, 4);
  return d;
}

TEST(Safetensors, ParsesAValidFile) {
  const std::vector<uint8_t> b = blob(kHeader, data18());
  SafetensorsFile f;
  const Status st = parse(b, &f);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // sorted by offset
  EXPECT_EQ(f.metadata().at("format"), "pt");
  TensorView v;
  ASSERT_TRUE(f.view(*f.find("a"), &v).ok());
  EXPECT_EQ(v.dtype, DType::f32);
  EXPECT_EQ(v.ptr<const float>()[1], -2.0f);
  ASSERT_TRUE(f.view(*f.find("b"), &v).ok());
  EXPECT_EQ(v.ndim, 2);
  EXPECT_EQ(v.shape[1], 3);
  EXPECT_EQ(load_as_f32(v.data, v.dtype, 2), -3.0f);
  ASSERT_TRUE(f.view(*f.find("s"), &v).ok());
  EXPECT_EQ(v.ndim, 1);  // a scalar views as [1]
  EXPECT_EQ(v.ptr<const int32_t>()[0], 42);
  EXPECT_EQ(f.find("z")->end - f.find("z")->begin, 0u);
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, OpensFromDiskAndNamesThePathOnError) {
  const std::string path = ::testing::TempDir() + "moekit_test.safetensors";
  const std::vector<uint8_t> b = blob(kHeader, data18());
  std::FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  ASSERT_EQ(std::fwrite(b.data(), 1, b.size(), fp), b.size());
  std::fclose(fp);
  SafetensorsFile f;
  ASSERT_TRUE(SafetensorsFile::open(path, &f).ok());
  TensorView v;
  ASSERT_TRUE(f.view(*f.find("a"), &v).ok());
  EXPECT_EQ(v.ptr<const float>()[0], 1.5f);
  const Status missing = SafetensorsFile::open(path + ".missing", &f);
  EXPECT_EQ(missing.code(), StatusCode::invalid_argument);
  EXPECT_NE(missing.message().find("cannot open"), std::string::npos);
  std::remove(path.c_str());
}

void expect_rejected(const std::vector<uint8_t>& b, const std::string& needle) {
  const Status st = parse(b);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::vector<uint8_t> d = data18();
  expect_rejected({1, 2, 3}, "shorter than the 8-byte header length");
  expect_rejected(blob("{}", {}, 1000), "runs past the end of the file");
  expect_rejected(blob("{}", {}, int64_t(1) << 40), "exceeds the format's");
  expect_rejected(blob("{\"a\": ", {}), "not valid JSON");
  expect_rejected(blob("[1, 2]", {}), "must be a JSON object");
  expect_rejected(blob(R"({"a": 3})", {}), "tensor 'a' must be an object");
  expect_rejected(blob(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", {0, 0, 0, 0}), "has no dtype");
  expect_rejected(blob(R"({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}})", {0, 0, 0, 0}),
                  "unknown dtype 'Q4'");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", {0, 0, 0, 0}),
                  "has no shape array");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", {0, 0, 0, 0}),
                  "shape entry -1");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", {0, 0, 0, 0}),
                  "shape entry 1.5");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", {0, 0, 0, 0}),
                  "needs data_offsets");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", {0, 0, 0, 0}),
                  "begin <= end");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", {0, 0, 0, 0}),
                  "ends at byte 8 of a 4-byte data section");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", {0, 0, 0, 0}),
                  "needs 8 bytes, its data_offsets span 4");
  // Overflowing shapes: the product is never formed.
  expect_rejected(blob(R"({"a": {"dtype": "F64", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})",
                       {0, 0, 0, 0}),
                  "more than 2^64");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                       R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                       std::vector<uint8_t>(12)),
                  "(a gap)");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                       R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                       std::vector<uint8_t>(8)),
                  "(an overlap)");
  expect_rejected(blob(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(6)),
                  "cover 4 bytes of a 6-byte data section");
  expect_rejected(blob(R"({"__metadata__": {"k": 1}})", {}), "__metadata__ value of 'k' must be a string");
  expect_rejected(blob(R"({"__metadata__": [1]})", {}), "__metadata__ must be an object");
  // A valid header with an unsupported-by-moekit dtype parses; view() refuses it by name.
  SafetensorsFile f;
  ASSERT_TRUE(parse(blob(R"({"d": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", std::vector<uint8_t>(8)),
                    &f)
                  .ok());
  TensorView v;
  const Status st = f.view(*f.find("d"), &v);
  EXPECT_NE(st.message().find("tensor 'd' dtype F64 has no moekit dtype"), std::string::npos) << st.message();
}

// Truncating a valid file anywhere, and flipping any single byte of its header, never crashes and
// never yields a file whose tensors reach past the buffer.
TEST(Safetensors, TruncationsAndByteFlipsAreHandled) {
  const std::vector<uint8_t> b = blob(kHeader, data18());
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + long(n));
    EXPECT_FALSE(parse(cut).ok()) << "truncated to " << n;
  }
  for (size_t i = 0; i < 8 + kHeader.size(); ++i) {
    for (uint8_t x : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xFF)}) {
      std::vector<uint8_t> m = b;
      m[i] ^= x;
      SafetensorsFile f;
      if (!parse(m, &f).ok()) continue;
      for (const SafetensorsTensor& t : f.tensors()) EXPECT_LE(f.bytes(t) + (t.end - t.begin), m.data() + m.size());
    }
  }
}

TEST(Safetensors, OpenRefusesWhatIsNotARegularFile) {
  // Before issue 28 a folder threw out of open() (its "size" from seeking to the end is huge) and a
  // FIFO blocked in the open forever; now each is refused before it is opened for reading.
  testing::ScratchDir d;
  SafetensorsFile f;
  const std::string folder = d.folder("model.safetensors");
  Status s = SafetensorsFile::open(folder, &f);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("safetensors: " + folder + " is a directory, not a regular file"), std::string::npos)
      << s.message();
  const std::string fifo = d.fifo("fifo.safetensors");
  s = SafetensorsFile::open(fifo, &f);
  EXPECT_NE(s.message().find(fifo + " is a FIFO, not a regular file"), std::string::npos) << s.message();
  const std::string zero = d.link("zero.safetensors", "/dev/zero");
  s = SafetensorsFile::open(zero, &f);
  EXPECT_NE(s.message().find(zero + " is a character device, not a regular file"), std::string::npos) << s.message();
  s = SafetensorsFile::open("", &f);
  EXPECT_NE(s.message().find("safetensors: empty path"), std::string::npos) << s.message();
  // A link to a regular file is followed.
  const std::vector<uint8_t> b = blob(kHeader, data18());
  d.text("real.safetensors", std::string(b.begin(), b.end()));
  const std::string link = d.link("link.safetensors", d.file("real.safetensors"));
  s = SafetensorsFile::open(link, &f);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(f.tensors().size(), 4u);
}

TEST(Safetensors, DeepHeaderIsRefusedBeforeParsing) {
  // A million nested arrays as a shape entry: the error message used to dump() it, recursing once
  // per level until the stack overflowed.
  const std::string deep =
      R"({"a": {"dtype": "F32", "shape": [)" + testing::nested_arrays(1000000) + R"(], "data_offsets": [0, 0]}})";
  expect_rejected(blob(deep, {}), "safetensors: the header: JSON nested deeper than 64 levels");
  // Long values in messages are cut to ~100 characters.
  const std::string longv = R"({"a": {"dtype": "F32", "shape": [")" + std::string(100000, 'x') + R"("], "data_offsets": [0, 0]}})";
  const Status st = parse(blob(longv, {}));
  EXPECT_NE(st.message().find("shape entry \"xxxx"), std::string::npos) << st.message().substr(0, 300);
  EXPECT_LT(st.message().size(), 250u);
}

}  // namespace
}  // namespace moekit::model
