// Tokenizers against transformers' ids (reference/goldens/tokenizers.py): every golden string,
// every tokenizer, ids and attention masks compared exactly.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io_test_folder.h"
#include "runtime/error.h"
#include "test_util.h"
#include "tokenizers/bpe_tokenizer.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"
#include "tokenizers/unicode.h"

namespace tessera::tokenizers {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* kGolden = "tokenizers/golden_ids.json";

const json& golden() {
  static const json g = read_json_file(test::fixture_path(kGolden));
  return g;
}

std::string mask_string(const std::vector<int64_t>& mask) {
  std::string s;
  for (int64_t m : mask) s.push_back(m ? '1' : '0');
  return s;
}

// Compares one golden column against `encode(string)`; reports up to 5 mismatching strings.
template <typename Fn>
void expect_matches(const std::string& column, Fn encode) {
  const json& strings = golden().at("strings");
  const json& expected = golden().at(column);
  ASSERT_EQ(strings.size(), expected.size()) << column;
  int failures = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    std::string text = strings[i].get<std::string>();
    std::vector<int64_t> want = expected[i].at("ids").get<std::vector<int64_t>>();
    std::string want_mask = expected[i].at("mask").get<std::string>();
    Encoding got = encode(text);
    if (got.ids != want || mask_string(got.attention_mask) != want_mask) {
      if (++failures <= 5)
        ADD_FAILURE() << column << " string #" << i << " " << json(text).dump()
                      << "\n  expected ids " << test::show_ids(want) << "\n  actual   ids "
                      << test::show_ids(got.ids) << "\n  expected mask " << want_mask
                      << "\n  actual   mask " << mask_string(got.attention_mask);
    }
  }
  EXPECT_EQ(failures, 0) << column << ": " << failures << " of " << strings.size()
                         << " strings differ";
}

#define REQUIRE_GOLDEN() \
  if (!test::has_fixture(kGolden)) GTEST_SKIP() << "missing fixture " << kGolden

TEST(ClipTokenizer, MatchesTransformersPaddedWithEndOfText) {
  REQUIRE_GOLDEN();
  ClipTokenizer tok = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip"));
  EXPECT_EQ(tok.bos_id(), 49406);
  EXPECT_EQ(tok.eos_id(), 49407);
  EXPECT_EQ(tok.pad_id(), 49407);
  EXPECT_EQ(tok.model_max_length(), 77);
  expect_matches("clip", [&](const std::string& s) { return tok.encode(s); });
}

TEST(ClipTokenizer, MatchesTransformersPaddedWithBang) {
  REQUIRE_GOLDEN();
  // SD3's tokenizer_2: the same vocabulary with pad_token "!" (id 0).
  test::TempDir tmp;  // unique per process: ctest runs this binary several times at once
  const fs::path dir = tmp.path();
  for (const char* f : {"vocab.json", "merges.txt"})
    fs::copy_file(test::fixture_path(std::string("tokenizers/clip/") + f), dir / f,
                  fs::copy_options::overwrite_existing);
  json cfg = read_json_file(test::fixture_path("tokenizers/clip/tokenizer_config.json"));
  cfg["pad_token"] = "!";
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  fs::remove(dir / "special_tokens_map.json");
  ClipTokenizer tok = ClipTokenizer::from_folder(dir);
  EXPECT_EQ(tok.pad_id(), 0);
  expect_matches("clip_pad_bang", [&](const std::string& s) { return tok.encode(s); });
}

TEST(T5Tokenizer, MatchesTransformersAt77_256_512) {
  REQUIRE_GOLDEN();
  T5Tokenizer tok = T5Tokenizer::from_folder(test::fixture_path("tokenizers/t5"));
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  for (int64_t n : {77, 256, 512})
    expect_matches("t5_" + std::to_string(n),
                   [&](const std::string& s) { return tok.encode(s, n); });
}

TEST(T5Tokenizer, WithoutTokenizerJsonUsesT5Layout) {
  REQUIRE_GOLDEN();
  test::TempDir tmp;
  const fs::path dir = tmp.path();
  fs::copy_file(test::fixture_path("tokenizers/t5/spiece.model"), dir / "spiece.model",
                fs::copy_options::overwrite_existing);
  T5Tokenizer tok = T5Tokenizer::from_folder(dir);
  expect_matches("t5_77", [&](const std::string& s) { return tok.encode(s, 77); });
}

TEST(BpeTokenizer, MistralPlainMatchesTransformers) {
  REQUIRE_GOLDEN();
  BpeTokenizer tok =
      BpeTokenizer::from_tokenizer_json(test::fixture_path("tokenizers/mistral/tokenizer.json"));
  EncodeOptions o;
  o.max_length = 0;
  o.add_special_tokens = true;
  expect_matches("mistral_plain", [&](const std::string& s) { return tok.encode(s, o); });
}

TEST(BpeTokenizer, Flux2ChatTemplateMatchesPipeline) {
  REQUIRE_GOLDEN();
  BpeTokenizer tok =
      BpeTokenizer::from_tokenizer_json(test::fixture_path("tokenizers/mistral/tokenizer.json"));
  EXPECT_EQ(tok.padding_side(), Side::left);
  EXPECT_EQ(tok.pad_id(), 11);
  std::string system = golden().at("mistral_system_message").get<std::string>();
  expect_matches("mistral_chat_512",
                 [&](const std::string& s) { return tok.encode_flux2_chat(s, system, 512); });
}

// Seeded strings across scripts, marks and whitespace, unpadded and without special tokens:
// checks the Unicode tables (classes, lowercase, NFC) beyond the hand-picked strings.
template <typename Fn>
void expect_random_matches(const std::string& column, Fn tokenize) {
  const json& strings = golden().at("random_strings");
  const json& expected = golden().at(column);
  ASSERT_EQ(strings.size(), expected.size()) << column;
  int failures = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    std::string text = strings[i].get<std::string>();
    std::vector<int64_t> want = expected[i].get<std::vector<int64_t>>();
    std::vector<int64_t> got = tokenize(text);
    if (got != want && ++failures <= 5)
      ADD_FAILURE() << column << " random string #" << i << " " << json(text).dump()
                    << "\n  expected " << test::show_ids(want) << "\n  actual   "
                    << test::show_ids(got);
  }
  EXPECT_EQ(failures, 0) << column << ": " << failures << " of " << strings.size() << " differ";
}

TEST(Tokenizers, RandomUnicodeStringsMatchTransformers) {
  REQUIRE_GOLDEN();
  ClipTokenizer clip = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip"));
  T5Tokenizer t5 = T5Tokenizer::from_folder(test::fixture_path("tokenizers/t5"));
  BpeTokenizer mistral =
      BpeTokenizer::from_tokenizer_json(test::fixture_path("tokenizers/mistral/tokenizer.json"));
  expect_random_matches("random_clip", [&](const std::string& s) { return clip.tokenize(s); });
  expect_random_matches("random_t5", [&](const std::string& s) { return t5.tokenize(s); });
  expect_random_matches("random_mistral",
                        [&](const std::string& s) { return mistral.tokenize(s, false); });
}

TEST(BpeTokenizer, Llama3PatternAsPublishedMistralCheckpoints) {
  REQUIRE_GOLDEN();
  // The published Mistral Small 3.x tokenizer.json splits with Llama 3's pattern; swap it in.
  test::TempDir tmp;
  const fs::path dir = tmp.path();
  json tj = read_json_file(test::fixture_path("tokenizers/mistral/tokenizer.json"));
  std::string pattern = golden().at("mistral_llama3_pattern").get<std::string>();
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(dir / "tokenizer.json");
  const json& strings = golden().at("strings");
  const json& expected = golden().at("mistral_llama3_plain");
  int failures = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    std::vector<int64_t> want = expected[i].get<std::vector<int64_t>>();
    std::vector<int64_t> got = tok.tokenize(strings[i].get<std::string>(), false);
    if (got != want && ++failures <= 5)
      ADD_FAILURE() << "string #" << i << " " << strings[i].dump() << "\n  expected "
                    << test::show_ids(want) << "\n  actual   " << test::show_ids(got);
  }
  EXPECT_EQ(failures, 0);
  expect_random_matches("random_mistral_llama3",
                        [&](const std::string& s) { return tok.tokenize(s, false); });
  // Any other pattern is refused with the pattern in the message.
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  try {
    BpeTokenizer::from_tokenizer_json(dir / "tokenizer.json");
    ADD_FAILURE() << "unknown Split pattern accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\\w+"), std::string::npos) << e.what();
  }
}

TEST(Tokenizers, ArbitraryBytesDoNotCrash) {
  REQUIRE_GOLDEN();
  ClipTokenizer clip = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip"));
  T5Tokenizer t5 = T5Tokenizer::from_folder(test::fixture_path("tokenizers/t5"));
  BpeTokenizer mistral =
      BpeTokenizer::from_tokenizer_json(test::fixture_path("tokenizers/mistral/tokenizer.json"));
  uint32_t state = 12345;
  for (int n = 0; n < 200; ++n) {
    std::string bytes;
    for (int k = 0; k < n % 64; ++k) {
      state = state * 1664525u + 1013904223u;
      bytes.push_back(char(state >> 24));
    }
    EXPECT_EQ(clip.encode(bytes).ids.size(), 77u);
    EXPECT_EQ(t5.encode(bytes, 64).ids.size(), 64u);
    EXPECT_EQ(mistral.encode_flux2_chat(bytes, "sys", 128).ids.size(), 128u);
  }
}

TEST(Tokenizers, ReportTruncatedTokenCount) {
  REQUIRE_GOLDEN();
  ClipTokenizer clip = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip"));
  T5Tokenizer t5 = T5Tokenizer::from_folder(test::fixture_path("tokenizers/t5"));
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "cat ";
  EXPECT_EQ(clip.encode(long_prompt).num_truncated, 100 - 75);
  EXPECT_EQ(clip.encode("a cat").num_truncated, 0);
  Encoding e = t5.encode(long_prompt, 77);
  EXPECT_EQ(int64_t(t5.tokenize(long_prompt).size()) - 76, e.num_truncated);
  EXPECT_EQ(e.ids.back(), t5.eos_id());
}

TEST(T5Tokenizer, TruncatedModelIsAnError) {
  REQUIRE_GOLDEN();
  test::TempDir tmp;
  const fs::path dir = tmp.path();
  std::ifstream in(test::fixture_path("tokenizers/t5/spiece.model"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir / "spiece.model", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  EXPECT_THROW(T5Tokenizer::from_folder(dir), Error);
}

TEST(Tokenizers, BatchToTensors) {
  Encoding a{{1, 2, 0}, {1, 1, 0}}, b{{3, 4, 5}, {1, 1, 1}};
  auto [ids, mask] = to_tensors({a, b});
  EXPECT_EQ(ids.shape(), (Shape{2, 3}));
  EXPECT_EQ(ids.dtype(), DType::i64);
  EXPECT_EQ(ids.to_ints(), (std::vector<int64_t>{1, 2, 0, 3, 4, 5}));
  EXPECT_EQ(mask.to_ints(), (std::vector<int64_t>{1, 1, 0, 1, 1, 1}));
  EXPECT_THROW(to_tensors({a, Encoding{{1}, {1}}}), Error);
}

TEST(Tokenizers, UnicodeNormalisation) {
  EXPECT_EQ(nfc(U"e\u0301"), U"\u00e9");
  EXPECT_EQ(nfc(U"\u212b"), U"\u00c5");                               // singleton decomposition
  EXPECT_EQ(nfc(U"a\u0323\u0302"), U"\u1ead");                        // reordered marks compose
  EXPECT_EQ(nfc(U"\u1100\u1161\u11a8"), U"\uac01");                   // Hangul L V T
  EXPECT_EQ(to_lower(U"\u0130"), U"i\u0307");                         // one to two code points
  EXPECT_EQ(to_lower(U"\u03a3\u039f\u03a3"), U"\u03c3\u03bf\u03c3");  // no final-sigma rule
  EXPECT_EQ(utf8_to_u32("\xff"
                        "a"),
            U"\ufffda");
}

TEST(Tokenizers, ErrorsNameTheFile) {
  test::TempDir tmp;
  const fs::path dir = tmp.path();
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { ClipTokenizer::from_folder(dir); }).find("vocab.json"),
            std::string::npos);
  EXPECT_NE(message([&] { T5Tokenizer::from_folder(dir); }).find("spiece.model"),
            std::string::npos);
  std::ofstream(dir / "tokenizer.json") << "{\"model\": [1, 2";
  std::string m = message([&] { BpeTokenizer::from_tokenizer_json(dir / "tokenizer.json"); });
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  fs::remove(dir / "tokenizer.json");  // read before vocab.json / spiece.model when present
  std::ofstream(dir / "vocab.json") << "{\"<|startoftext|>\": 0, \"<|endoftext|>\": 1}";
  EXPECT_NE(message([&] { ClipTokenizer::from_folder(dir); }).find("merges.txt"),
            std::string::npos);
  std::ofstream(dir / "spiece.model") << "not a model";
  m = message([&] { T5Tokenizer::from_folder(dir); });
  EXPECT_NE(m.find("spiece.model"), std::string::npos) << m;
  EXPECT_NE(m.find("sentencepiece model"), std::string::npos) << m;
}

}  // namespace
}  // namespace tessera::tokenizers
