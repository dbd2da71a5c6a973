// The character tokenizer (include/moekit/model/tokenizer.h): the ids the Python tokenizer gives
// (tests/data/tokenizer_golden.json, written by tools/train/tokenizer.py --golden), round trips,
// every text of the bundled test split, non-ASCII vocabularies, then every rejection -- unknown
// characters, malformed UTF-8, out-of-range ids and each malformed tokenizer.json -- with a message
// naming the problem and the outputs left untouched; and hostile files (issue 28): a folder, a FIFO,
// a device or an oversized file in place of tokenizer.json, JSON nested a million levels deep.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "scratch_dir.h"
#include "test_data_dir.h"
#include "moekit/model/tokenizer.h"

namespace moekit::model {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

nlohmann::json golden() { return read_json(testing::test_data_dir() + "/tokenizer_golden.json"); }

Tokenizer default_tokenizer() {
  Tokenizer t;
  const Status s = Tokenizer::parse(golden()["tokenizer"].dump(), &t);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return t;
}

// A tokenizer.json with the given vocab (specials pad 0, bos 1, eos 2).
std::string with_vocab(const std::vector<std::string>& chars) {
  nlohmann::json vocab = {"<pad>", "<bos>", "<eos>"};
  for (const std::string& c : chars) vocab.push_back(c);
  return nlohmann::json{{"type", "moekit-char"}, {"version", 1}, {"vocab", vocab},
                        {"special_tokens", {{"pad", 0}, {"bos", 1}, {"eos", 2}}}}
      .dump();
}

void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "'" << s.message() << "' lacks '" << needle << "'";
}

TEST(Tokenizer, ParsesTheDefaultVocabulary) {
  const Tokenizer t = default_tokenizer();
  EXPECT_EQ(t.vocab_size(), 99);  // 3 specials, "\n", printable ASCII 32..126
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.is_special(2));
  EXPECT_FALSE(t.is_special(3));
  EXPECT_EQ(t.token(2), "<eos>");
  EXPECT_EQ(t.token(3), "\n");
  EXPECT_EQ(t.token(98), "~");
}

TEST(Tokenizer, GivesThePythonIds) {
  const Tokenizer t = default_tokenizer();
  const nlohmann::json cases = golden()["cases"];
  ASSERT_GE(cases.size(), 4u);
  for (const nlohmann::json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    std::vector<int32_t> ids;
    ASSERT_TRUE(t.encode(text, &ids).ok()) << text;
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << text;
    std::string back;
    ASSERT_TRUE(t.decode(ids, &back).ok());
    EXPECT_EQ(back, text);
  }
}

TEST(Tokenizer, EmptyTextGivesNoIds) {
  const Tokenizer t = default_tokenizer();
  std::vector<int32_t> ids = {5, 6};
  ASSERT_TRUE(t.encode("", &ids).ok());
  EXPECT_TRUE(ids.empty());
  std::string text = "x";
  ASSERT_TRUE(t.decode({}, &text).ok());
  EXPECT_EQ(text, "");
}

TEST(Tokenizer, RoundTripsEveryCharacterOfTheVocabulary) {
  const Tokenizer t = default_tokenizer();
  std::string all;
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (!t.is_special(id)) all += t.token(id);
  }
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode(all, &ids).ok());
  ASSERT_EQ(ids.size(), all.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], int32_t(i) + 3);  // in vocabulary order
  std::string back;
  ASSERT_TRUE(t.decode(ids, &back).ok());
  EXPECT_EQ(back, all);
}

TEST(Tokenizer, DecodeSkipsSpecialTokens) {
  const Tokenizer t = default_tokenizer();
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode("4+4=8", &ids).ok());
  ids.insert(ids.begin(), t.bos_id());
  ids.push_back(t.eos_id());
  ids.push_back(t.pad_id());
  std::string text;
  ASSERT_TRUE(t.decode(ids, &text).ok());
  EXPECT_EQ(text, "4+4=8");
}

TEST(Tokenizer, EncodesEveryTextOfTheBundledTestSplit) {
  const Tokenizer t = default_tokenizer();
  std::ifstream in(testing::models_dir() + "/data/arith_test.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const nlohmann::json p = nlohmann::json::parse(line);
    const std::string text = p["prompt"].get<std::string>() + p["target"].get<std::string>();
    std::vector<int32_t> ids;
    ASSERT_TRUE(t.encode(text, &ids).ok()) << p["id"];
    EXPECT_EQ(ids.size(), text.size());
    ++n;
  }
  EXPECT_EQ(n, 500);
}

TEST(Tokenizer, NonAsciiVocabulary) {
  Tokenizer t;
  ASSERT_TRUE(Tokenizer::parse(with_vocab({"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}), &t).ok());
  std::vector<int32_t> ids;
  const std::string text = "\xF0\x9F\x98\x80" "a\xE2\x82\xAC\xC3\xA9";  // U+1F600 a U+20AC U+00E9
  ASSERT_TRUE(t.encode(text, &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{6, 3, 5, 4}));
  std::string back;
  ASSERT_TRUE(t.decode(ids, &back).ok());
  EXPECT_EQ(back, text);
}

TEST(Tokenizer, SpecialTokensMayShareAnId) {
  Tokenizer t;
  const std::string j = R"({"type": "moekit-char", "version": 1, "vocab": ["<eos>", "a"],
                           "special_tokens": {"pad": 0, "bos": 0, "eos": 0}, "unknown": "error", "extra": 1})";
  ASSERT_TRUE(Tokenizer::parse(j, &t).ok());
  EXPECT_EQ(t.vocab_size(), 2);
  EXPECT_EQ(t.eos_id(), 0);
}

TEST(Tokenizer, UnknownCharacterIsAnErrorNamingIt) {
  const Tokenizer t = default_tokenizer();
  std::vector<int32_t> ids = {7, 7};
  expect_error(t.encode("ab\xC3\xA9", &ids), "character U+00E9 at byte 2 is not in the vocabulary");
  expect_error(t.encode("a\tb", &ids), "character U+0009 at byte 1");
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 7}));  // untouched
}

TEST(Tokenizer, MalformedUtf8IsAnError) {
  const Tokenizer t = default_tokenizer();
  std::vector<int32_t> ids = {7};
  expect_error(t.encode("a\x80", &ids), "not UTF-8 at byte 1 (0x80)");           // lone continuation byte
  expect_error(t.encode("ab\xC3", &ids), "not UTF-8 at byte 2 (0xC3)");          // truncated sequence
  expect_error(t.encode("\xC3(", &ids), "not UTF-8 at byte 0");                   // bad continuation
  expect_error(t.encode("\xC0\x80", &ids), "not UTF-8 at byte 0 (0xC0)");        // overlong NUL
  expect_error(t.encode("\xED\xA0\x80", &ids), "not UTF-8 at byte 0 (0xED)");    // surrogate U+D800
  expect_error(t.encode("\xF4\x90\x80\x80", &ids), "not UTF-8 at byte 0");        // past U+10FFFF
  expect_error(t.encode("\xFF", &ids), "not UTF-8 at byte 0 (0xFF)");
  EXPECT_EQ(ids, (std::vector<int32_t>{7}));
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const Tokenizer t = default_tokenizer();
  std::string text = "keep";
  expect_error(t.decode({3, 99}, &text), "ids[1] = 99 is outside [0, 99)");
  expect_error(t.decode({-1}, &text), "ids[0] = -1 is outside [0, 99)");
  EXPECT_EQ(text, "keep");
}

TEST(Tokenizer, NullOutputsAreErrors) {
  const Tokenizer t = default_tokenizer();
  expect_error(t.encode("a", nullptr), "ids must not be null");
  expect_error(t.decode({3}, nullptr), "text must not be null");
}

TEST(Tokenizer, AnEmptyTokenizerRejectsEverything) {
  const Tokenizer t;
  std::vector<int32_t> ids;
  expect_error(t.encode("a", &ids), "character U+0061 at byte 0");
  std::string text;
  expect_error(t.decode({0}, &text), "outside [0, 0)");
}

TEST(Tokenizer, ParseErrorsNameTheField) {
  const std::string specials = R"("special_tokens": {"pad": 0, "bos": 1, "eos": 2})";
  const std::string head = R"({"type": "moekit-char", "version": 1, )";
  const struct {
    std::string json, needle;
  } cases[] = {
      {"{\"type\": ", "is not valid JSON"},
      {"[1, 2]", "must be a JSON object, got array"},
      {R"({"version": 1, "vocab": ["a"]})", "type must be \"moekit-char\", got nothing"},
      {R"({"type": "bpe", "version": 1})", "type must be \"moekit-char\", got \"bpe\""},
      {R"({"type": "moekit-char", "version": 2})", "version must be 1, got 2"},
      {R"({"type": "moekit-char", "version": "1"})", "version must be 1, got \"1\""},
      {head + R"("unknown": "replace", "vocab": ["a", "b", "c"], )" + specials + "}", "unknown must be \"error\""},
      {head + specials + "}", "vocab must be a non-empty array"},
      {head + R"("vocab": "abc", )" + specials + "}", "vocab must be a non-empty array"},
      {head + R"("vocab": [], )" + specials + "}", "vocab must be a non-empty array"},
      {head + R"("vocab": ["<p>", "<b>", "<e>", 5])" + ", " + specials + "}", "vocab[3] must be a string, got number"},
      {head + R"("vocab": ["<p>", "<b>", "<e>", "ab"], )" + specials + "}", "vocab[3] must be exactly one character, got \"ab\""},
      {head + R"("vocab": ["<p>", "<b>", "<e>", ""], )" + specials + "}", "vocab[3] must be exactly one character"},
      {head + R"("vocab": ["<p>", "<b>", "<e>", "a", "b", "a"], )" + specials + "}", "vocab[5] \"a\" (U+0061) duplicates vocab[3]"},
      {head + R"("vocab": ["<p>", "<b>", "<e>", "\u00e9", "\u00e9"], )" + specials + "}", "vocab[4] \"é\" (U+00E9) duplicates vocab[3]"},
      {head + R"("vocab": ["a", "b", "c"]})", "special_tokens must be an object"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": [0, 1, 2]})", "special_tokens must be an object"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": {"pad": 0, "eos": 2}})", "special_tokens has no 'bos'"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": {"pad": 0, "bos": 1, "eos": 3}})",
       "special_tokens.eos must be an id in [0, 3), got 3"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": {"pad": -1, "bos": 1, "eos": 2}})",
       "special_tokens.pad must be an id in [0, 3), got -1"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": {"pad": 0, "bos": 1.5, "eos": 2}})",
       "special_tokens.bos must be an id in [0, 3), got 1.5"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": {"pad": 0, "bos": 1, "eos": 18446744073709551615}})",
       "special_tokens.eos must be an id in [0, 3)"},
      {head + R"("vocab": ["a", "b", "c"], "special_tokens": {"pad": 0, "bos": 1, "eos": 2, "unk": 2}})",
       "special_tokens has unknown key 'unk'"},
  };
  for (const auto& c : cases) {
    Tokenizer t;
    const Status s = Tokenizer::parse(c.json, &t);
    SCOPED_TRACE(c.json);
    expect_error(s, c.needle);
    EXPECT_EQ(s.message().rfind("tokenizer: ", 0), 0u) << s.message();
  }
}

TEST(Tokenizer, AFailedParseLeavesTheOutputUntouched) {
  Tokenizer t = default_tokenizer();
  expect_error(Tokenizer::parse(with_vocab({"a", "a"}), &t), "duplicates");
  EXPECT_EQ(t.vocab_size(), 99);
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode("Q", &ids).ok());
}

TEST(Tokenizer, LoadsFromDiskAndNamesThePathOnError) {
  const std::string path = ::testing::TempDir() + "moekit_tokenizer.json";
  {
    std::ofstream out(path);
    out << golden()["tokenizer"].dump(1);
  }
  Tokenizer t;
  const Status ok = Tokenizer::load(path, &t);
  ASSERT_TRUE(ok.ok()) << ok.to_string();
  EXPECT_EQ(t.vocab_size(), 99);
  {
    std::ofstream out(path);
    out << R"({"type": "moekit-char", "version": 3})";
  }
  expect_error(Tokenizer::load(path, &t), path + ": tokenizer: version must be 1, got 3");
  std::remove(path.c_str());
  expect_error(Tokenizer::load(path, &t), "tokenizer: cannot open '" + path + "'");
  EXPECT_EQ(t.vocab_size(), 99);
}

TEST(Tokenizer, LoadRefusesWhatIsNotARegularFile) {
  // Before issue 28 a folder read as an empty text and a FIFO blocked the load forever; a link to
  // /dev/zero would read until memory ran out. Each is refused before it is opened for reading.
  testing::ScratchDir d;
  Tokenizer t = default_tokenizer();
  const std::string folder = d.folder("tokenizer.json");
  expect_error(Tokenizer::load(folder, &t), "tokenizer: " + folder + " is a directory, not a regular file");
  const std::string fifo = d.fifo("fifo.json");
  expect_error(Tokenizer::load(fifo, &t), "tokenizer: " + fifo + " is a FIFO, not a regular file");
  const std::string zero = d.link("zero.json", "/dev/zero");
  expect_error(Tokenizer::load(zero, &t), zero + " is a character device, not a regular file");
  expect_error(Tokenizer::load("", &t), "tokenizer: empty path");
  EXPECT_EQ(t.vocab_size(), 99);  // untouched
}

TEST(Tokenizer, LoadRefusesAFileOverTheSizeCap) {
  testing::ScratchDir d;
  const std::string big = d.sparse("tokenizer.json", 70ull << 20);  // 73.4 MB of nothing, no disk used
  Tokenizer t;
  expect_error(Tokenizer::load(big, &t), "tokenizer: " + big + " is 73.4 MB, over the 64 MiB limit");
}

TEST(Tokenizer, DeepJsonIsRefusedBeforeParsing) {
  // A million nested arrays under "type": the error message used to dump() the value, recursing
  // once per level until the stack overflowed.
  Tokenizer t;
  const std::string deep = R"({"type": )" + testing::nested_arrays(1000000) + "}";
  expect_error(Tokenizer::parse(deep, &t), "tokenizer: JSON nested deeper than 64 levels (at byte 72)");
  // 64 levels are fine for the scanner (the value is then just the wrong type); brackets inside
  // strings, escaped quotes included, do not count.
  const std::string ok_depth = R"({"type": )" + testing::nested_arrays(63) + "}";
  expect_error(Tokenizer::parse(ok_depth, &t), "type must be \"moekit-char\", got [[[[");
  const std::string in_string = R"({"type": "\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})";
  expect_error(Tokenizer::parse(in_string, &t), "type must be \"moekit-char\", got \"\\\"[[[");
}

TEST(Tokenizer, ErrorMessagesCutLongValues) {
  Tokenizer t;
  const Status s = Tokenizer::parse(R"({"type": ")" + std::string(100000, 'x') + "\"}", &t);
  expect_error(s, "type must be \"moekit-char\", got \"xxxx");
  EXPECT_LT(s.message().size(), 200u) << s.message().size();
  EXPECT_NE(s.message().find("..."), std::string::npos);
}

}  // namespace
}  // namespace moekit::model
