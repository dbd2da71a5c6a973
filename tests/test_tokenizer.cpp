// The character tokenizer (include/moekit/model/tokenizer.h): the ids the Python tokenizer gives
// (tests/data/tokenizer_golden.json, written by tools/train/tokenizer.py --golden: the Hugging Face
// tokenizer.json and the ids `tokenizers` gives), special tokens matched inside the text (longest
// first), round trips, every text of the bundled test split, non-ASCII vocabularies, then every
// rejection -- unknown characters, malformed UTF-8, out-of-range ids and each tokenizer.json outside
// the per-character WordLevel family -- with a message naming the field and the outputs left
// untouched; and hostile files (issue 28): a folder, a FIFO, a device or an oversized file in place
// of tokenizer.json, JSON nested a million levels deep.
// Run: ./build/tests/moekit_tests --gtest_filter='Tokenizer*'.
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <fstream>
#include <functional>
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

nlohmann::json added_token(int id, const std::string& content, bool special = true) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", special}};
}

// A tokenizer.json of the golden file's family with the given characters after <pad> 0, <bos> 1 and
// <eos> 2 (ids 3, 4, ...).
nlohmann::json hf_json(const std::vector<std::string>& chars) {
  nlohmann::json j = golden()["tokenizer"];
  nlohmann::json vocab = {{"<pad>", 0}, {"<bos>", 1}, {"<eos>", 2}};
  for (const std::string& c : chars) vocab[c] = int(vocab.size());
  j["model"]["vocab"] = vocab;
  return j;
}

std::string with_vocab(const std::vector<std::string>& chars) { return hf_json(chars).dump(); }

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
    // decode gives the text back unless it held special tokens (which decode to nothing).
    if (std::none_of(ids.begin(), ids.end(), [&](int32_t id) { return t.is_special(id); })) {
      std::string back;
      ASSERT_TRUE(t.decode(ids, &back).ok());
      EXPECT_EQ(back, text);
    }
  }
}

TEST(Tokenizer, SpecialTokensInTheTextAreMatched) {
  // Hugging Face splits the text on the added tokens' contents before pre-tokenizing: "<eos>" in a
  // text is the eos id, "<bos" (no ">") stays characters. decode(skip_special_tokens=True) drops them
  // (the golden file holds this case too; `tokenizers` gives "ab<bos>" back).
  const Tokenizer t = default_tokenizer();
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode("a<eos>b<bos<pad>>", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{69, 2, 70, 32, 70, 83, 87, 0, 34}));
  std::string back;
  ASSERT_TRUE(t.decode(ids, &back).ok());
  EXPECT_EQ(back, "ab<bos>");
  ASSERT_TRUE(t.encode("<eos><eos", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 32, 73, 83, 87}));
}

TEST(Tokenizer, AddedTokensMatchLongestFirst) {
  // "<eos>>" (special) and "ab" (not special) are added tokens: at each position the longest
  // content wins ("<eos>>" over "<eos>"), a non-special one decodes to its content; the ids are
  // those `tokenizers` gives for the same file.
  nlohmann::json j = hf_json({"<", ">", "a", "b", "c"});
  j["model"]["vocab"]["<eos>>"] = 8;
  j["model"]["vocab"]["ab"] = 9;
  j["added_tokens"].push_back(added_token(8, "<eos>>"));
  j["added_tokens"].push_back(added_token(9, "ab", /*special=*/false));
  Tokenizer t;
  const Status s = Tokenizer::parse(j.dump(), &t);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(t.is_special(8));
  EXPECT_FALSE(t.is_special(9));
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode("<eos>><<eos>abcab", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{8, 3, 2, 9, 7, 9}));
  std::string back;
  ASSERT_TRUE(t.decode(ids, &back).ok());
  EXPECT_EQ(back, "<abcab");
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

TEST(Tokenizer, RolesGoByContentNotPosition) {
  // The specials anywhere in the vocabulary (here after the characters); unknown keys are ignored.
  nlohmann::json j = golden()["tokenizer"];
  j["model"]["vocab"] = {{"a", 0}, {"<eos>", 1}, {"<pad>", 2}, {"<bos>", 3}};
  j["added_tokens"] = {added_token(3, "<bos>"), added_token(1, "<eos>"), added_token(2, "<pad>")};
  j["extra"] = 1;
  Tokenizer t;
  const Status s = Tokenizer::parse(j.dump(), &t);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(t.vocab_size(), 4);
  EXPECT_EQ(t.pad_id(), 2);
  EXPECT_EQ(t.bos_id(), 3);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_FALSE(t.is_special(0));
  EXPECT_FALSE(t.is_special(4));
  EXPECT_FALSE(t.is_special(-1));
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
  using Edit = std::function<void(nlohmann::json&)>;
  const auto set_vocab = [](nlohmann::json v) { return Edit([v](nlohmann::json& j) { j["model"]["vocab"] = v; }); };
  const nlohmann::json specials = {{"<pad>", 0}, {"<bos>", 1}, {"<eos>", 2}};
  const auto plus = [&](const char* k, nlohmann::json v) {
    nlohmann::json r = specials;
    r[k] = v;
    return r;
  };
  const struct {
    Edit edit;
    std::string needle;
  } cases[] = {
      {[](nlohmann::json& j) { j.erase("model"); }, "model must be an object {\"type\": \"WordLevel\", ...}, got nothing"},
      {[](nlohmann::json& j) { j["model"]["type"] = "BPE"; },
       "model.type \"BPE\" is not supported (the runner reads character-level WordLevel tokenizers)"},
      {[](nlohmann::json& j) { j["model"]["type"] = "Unigram"; }, "model.type \"Unigram\" is not supported"},
      {[](nlohmann::json& j) { j["model"]["type"] = 5; }, "model.type must be a string, got 5"},
      {[](nlohmann::json& j) { j["version"] = "2.0"; }, "version must be \"1.0\", got \"2.0\""},
      {[](nlohmann::json& j) { j.erase("version"); }, "version must be \"1.0\", got nothing"},
      {[](nlohmann::json& j) { j["normalizer"] = {{"type", "NFC"}}; },
       "normalizer {\"type\":\"NFC\"} is not supported"},
      {[](nlohmann::json& j) { j["truncation"] = {{"max_length", 8}}; }, "truncation {\"max_length\":8} is not supported"},
      {[](nlohmann::json& j) { j["padding"] = {{"pad_id", 0}}; }, "padding {\"pad_id\":0} is not supported"},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer null is not supported"},
      {[](nlohmann::json& j) { j.erase("pre_tokenizer"); }, "pre_tokenizer nothing is not supported"},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}}; },
       "pre_tokenizer {\"type\":\"ByteLevel\"} is not supported"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pattern"] = {{"Regex", "."}}; },
       "pre_tokenizer.pattern {\"Regex\":\".\"} is not supported"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["pattern"] = {{"String", " "}}; },
       "pre_tokenizer.pattern {\"String\":\" \"} is not supported"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["behavior"] = "Removed"; },
       "pre_tokenizer.behavior must be \"Isolated\", got \"Removed\""},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["invert"] = true; }, "pre_tokenizer.invert must be false, got true"},
      {[](nlohmann::json& j) { j["decoder"] = nullptr; }, "decoder null is not supported"},
      {[](nlohmann::json& j) { j["decoder"] = {{"type", "ByteLevel"}}; }, "decoder {\"type\":\"ByteLevel\"} is not supported"},
      {[](nlohmann::json& j) { j["post_processor"] = 5; }, "post_processor must be null or an object with a \"type\", got 5"},
      {[](nlohmann::json& j) { j["model"].erase("vocab"); }, "model.vocab must be a non-empty object {token: id}, got nothing"},
      {set_vocab(nlohmann::json::object()), "model.vocab must be a non-empty object"},
      {set_vocab({"<pad>", "<bos>", "<eos>"}), "model.vocab must be a non-empty object"},
      {set_vocab(plus("a", 4)), "model.vocab[\"a\"] must be an id in [0, 4) (ids are 0..n-1), got 4"},
      {set_vocab(plus("a", -1)), "model.vocab[\"a\"] must be an id in [0, 4) (ids are 0..n-1), got -1"},
      {set_vocab(plus("a", "3")), "model.vocab[\"a\"] must be an id in [0, 4) (ids are 0..n-1), got \"3\""},
      {set_vocab(plus("a", 2)), "model.vocab[\"a\"] = 2 duplicates model.vocab[\"<eos>\"]"},
      {set_vocab(plus("ab", 3)), "model.vocab[\"ab\"] (id 3) must be exactly one character (or an added token)"},
      {set_vocab(plus("", 3)), "model.vocab[\"\"] (id 3) must be exactly one character"},
      {set_vocab(plus("<unk>", 3)), "model.unk_token \"<unk>\" is in model.vocab"},
      {[](nlohmann::json& j) { j["model"]["unk_token"] = 5; }, "model.unk_token must be a string, got 5"},
      {[](nlohmann::json& j) {
         j["model"].erase("unk_token");
         j["model"]["vocab"]["<unk>"] = 99;
       },
       "model.unk_token \"<unk>\" is in model.vocab"},  // HF's default unk_token
      {[](nlohmann::json& j) { j.erase("added_tokens"); }, "added_tokens must be an array (with <pad>, <bos> and <eos>)"},
      {[](nlohmann::json& j) { j["added_tokens"][1] = 7; }, "added_tokens[1] must be an object, got number"},
      {[](nlohmann::json& j) { j["added_tokens"][1]["id"] = 5; },
       "added_tokens[1].id must be 1 (the id of \"<bos>\" in model.vocab), got 5"},
      {[](nlohmann::json& j) { j["added_tokens"][1].erase("id"); }, "added_tokens[1].id must be 1"},
      {[](nlohmann::json& j) { j["added_tokens"].push_back(added_token(99, "<sep>")); },
       "added_tokens[3].content \"<sep>\" is not in model.vocab"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["content"] = ""; }, "added_tokens[0].content must be a non-empty string"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip must be false, got true"},
      {[](nlohmann::json& j) { j["added_tokens"][2]["normalized"] = true; },
       "added_tokens[2].normalized must be false, got true"},
      {[](nlohmann::json& j) { j["added_tokens"][2]["single_word"] = 1; }, "added_tokens[2].single_word must be false, got 1"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["special"] = "yes"; },
       "added_tokens[0].special must be a boolean, got \"yes\""},
      {[](nlohmann::json& j) { j["added_tokens"].push_back(added_token(2, "<eos>")); }, "added_tokens[3] \"<eos>\" is listed twice"},
      {[](nlohmann::json& j) { j["added_tokens"][2]["special"] = false; }, "added_tokens has no special token \"<eos>\""},
      {[](nlohmann::json& j) { j["added_tokens"].erase(1); }, "added_tokens has no special token \"<bos>\""},
  };
  for (const auto& c : cases) {
    nlohmann::json j = golden()["tokenizer"];
    c.edit(j);
    Tokenizer t;
    const Status s = Tokenizer::parse(j.dump(), &t);
    SCOPED_TRACE(c.needle);
    expect_error(s, c.needle);
    EXPECT_EQ(s.message().rfind("tokenizer.json: ", 0), 0u) << s.message();
    EXPECT_EQ(t.vocab_size(), 0);  // untouched
  }
  for (const auto& [text, needle] : {std::pair<std::string, std::string>{"{\"model\": ", "is not valid JSON"},
                                     {"[1, 2]", "must be a JSON object, got array"}}) {
    Tokenizer t;
    expect_error(Tokenizer::parse(text, &t), needle);
  }
}

TEST(Tokenizer, AcceptsTheOtherPerCharacterRegexAndNoPostProcessor) {
  nlohmann::json j = golden()["tokenizer"];
  j["pre_tokenizer"]["pattern"]["Regex"] = "[\\S\\s]";
  j["post_processor"] = nullptr;
  Tokenizer t;
  const Status s = Tokenizer::parse(j.dump(), &t);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode("a\n\nb", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{69, 3, 3, 70}));
}

TEST(Tokenizer, AFailedParseLeavesTheOutputUntouched) {
  Tokenizer t = default_tokenizer();
  expect_error(Tokenizer::parse(with_vocab({"a", "bc"}), &t), "must be exactly one character");
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
    out << R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})";
  }
  expect_error(Tokenizer::load(path, &t), path + ": tokenizer.json: model.type \"BPE\" is not supported");
  std::remove(path.c_str());
  expect_error(Tokenizer::load(path, &t), "tokenizer.json: cannot open '" + path + "'");
  EXPECT_EQ(t.vocab_size(), 99);
}

TEST(Tokenizer, LoadRefusesWhatIsNotARegularFile) {
  // Before issue 28 a folder read as an empty text and a FIFO blocked the load forever; a link to
  // /dev/zero would read until memory ran out. Each is refused before it is opened for reading.
  testing::ScratchDir d;
  Tokenizer t = default_tokenizer();
  const std::string folder = d.folder("tokenizer.json");
  expect_error(Tokenizer::load(folder, &t), "tokenizer.json: " + folder + " is a directory, not a regular file");
  const std::string fifo = d.fifo("fifo.json");
  expect_error(Tokenizer::load(fifo, &t), "tokenizer.json: " + fifo + " is a FIFO, not a regular file");
  const std::string zero = d.link("zero.json", "/dev/zero");
  expect_error(Tokenizer::load(zero, &t), zero + " is a character device, not a regular file");
  expect_error(Tokenizer::load("", &t), "tokenizer.json: empty path");
  EXPECT_EQ(t.vocab_size(), 99);  // untouched
}

TEST(Tokenizer, LoadRefusesAFileOverTheSizeCap) {
  testing::ScratchDir d;
  const std::string big = d.sparse("tokenizer.json", 70ull << 20);  // 73.4 MB of nothing, no disk used
  Tokenizer t;
  expect_error(Tokenizer::load(big, &t), "tokenizer.json: " + big + " is 73.4 MB, over the 64 MiB limit");
}

TEST(Tokenizer, DeepJsonIsRefusedBeforeParsing) {
  // A million nested arrays under "model": the error message used to dump() the value, recursing
  // once per level until the stack overflowed.
  Tokenizer t;
  const std::string deep = R"({"model": )" + testing::nested_arrays(1000000) + "}";
  expect_error(Tokenizer::parse(deep, &t), "tokenizer.json: JSON nested deeper than 64 levels (at byte 73)");
  // 64 levels are fine for the scanner (the value is then just the wrong type); brackets inside
  // strings, escaped quotes included, do not count.
  const std::string ok_depth = R"({"model": )" + testing::nested_arrays(63) + "}";
  expect_error(Tokenizer::parse(ok_depth, &t), "model must be an object {\"type\": \"WordLevel\", ...}, got [[[[");
  const std::string in_string = R"({"model": "\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})";
  expect_error(Tokenizer::parse(in_string, &t), "model must be an object {\"type\": \"WordLevel\", ...}, got \"\\\"[[[");
}

TEST(Tokenizer, ErrorMessagesCutLongValues) {
  Tokenizer t;
  const Status s = Tokenizer::parse(R"({"model": {"type": ")" + std::string(100000, 'x') + "\"}}", &t);
  expect_error(s, "model.type \"xxxx");
  EXPECT_LT(s.message().size(), 250u) << s.message().size();
  EXPECT_NE(s.message().find("..."), std::string::npos);
}

}  // namespace
}  // namespace moekit::model
