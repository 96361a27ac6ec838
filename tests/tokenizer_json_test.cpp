// Tokenizer folders in the form transformers 5's save_pretrained writes (tokenizer.json +
// tokenizer_config.json, no vocab.json / merges.txt / spiece.model), the other file forms of the
// same tokenizers, and tokenizer.json components, against transformers' ids
// (reference/goldens/tokenizers.py: golden_ids.json and golden_ids_json_form.json).
#include "tokenizers/tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io_test_folder.h"
#include "runtime/error.h"
#include "test_util.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace tessera::tokenizers {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* kForms = "tokenizers/golden_ids_json_form.json";
const char* kGolden = "tokenizers/golden_ids.json";

const json& forms() {
  static const json g = read_json_file(test::fixture_path(kForms));
  return g;
}
const json& golden() {
  static const json g = read_json_file(test::fixture_path(kGolden));
  return g;
}

#define REQUIRE_FORMS()                                          \
  if (!test::has_fixture(kForms) || !test::has_fixture(kGolden)) \
  GTEST_SKIP() << "missing fixture " << kForms

// Compares ids (and the mask when the golden has one) for every string; reports up to 5.
template <typename Fn>
void expect_column(const json& strings, const json& expected, const std::string& what, Fn encode) {
  ASSERT_EQ(strings.size(), expected.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string text = strings[i].get<std::string>();
    const bool padded = expected[i].is_object();
    std::vector<int64_t> want =
        (padded ? expected[i].at("ids") : expected[i]).get<std::vector<int64_t>>();
    Encoding got = encode(text);
    bool ok = got.ids == want;
    if (padded) {
      std::string mask;
      for (int64_t m : got.attention_mask) mask.push_back(m ? '1' : '0');
      ok = ok && mask == expected[i].at("mask").get<std::string>();
    }
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << what << " string #" << i << " " << json(text).dump() << "\n  expected "
                    << test::show_ids(want) << "\n  actual   " << test::show_ids(got.ids);
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << strings.size() << " differ";
}

Encoding unpadded(std::vector<int64_t> ids) {
  return Encoding{std::move(ids), {}, 0};
}

// A whole-file TokenizerJson with its post-processor, truncated and padded as transformers'
// __call__(padding="max_length", truncation=True).
Encoding encode_file(const TokenizerJson& t, const std::string& text, int64_t max_length,
                     int64_t pad_id) {
  std::vector<int64_t> ids = t.tokenize(text);
  const PostProcessor& post = t.post_processor();
  truncate_ids(ids, max_length, int64_t(post.prefix.size() + post.suffix.size()), Side::right);
  ids.insert(ids.begin(), post.prefix.begin(), post.prefix.end());
  ids.insert(ids.end(), post.suffix.begin(), post.suffix.end());
  return pad_encoding(std::move(ids), max_length, pad_id, Side::right, true);
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The test that failed before tokenizer.json support: a CLIP folder with only tokenizer.json +
// tokenizer_config.json (written by save_pretrained from the published-style config, so
// <|startoftext|> is a normalized added token).
TEST(TokenizerJsonForm, ClipFolderWithOnlyTokenizerJson) {
  REQUIRE_FORMS();
  ClipTokenizer tok = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip_small_json"));
  EXPECT_EQ(tok.bos_id(), 2512);
  EXPECT_EQ(tok.eos_id(), 2513);
  expect_column(forms().at("clip_small_strings"), forms().at("clip_small"), "clip_small_json",
                [&](const std::string& s) { return tok.encode(s); });
}

TEST(TokenizerJsonForm, ClipSmallVocabJsonFormMatchesTheSameIds) {
  REQUIRE_FORMS();
  // vocab.json + merges.txt with the published config's AddedToken objects (normalized: true).
  ClipTokenizer tok = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip_small"));
  expect_column(forms().at("clip_small_strings"), forms().at("clip_small"), "clip_small",
                [&](const std::string& s) { return tok.encode(s); });
}

// The full CLIP vocabulary in tokenizer.json form, built here from the vocab.json fixture with
// the layout transformers wrote for clip_small_json (merges as "a b" strings this time).
fs::path full_clip_json(const fs::path& dir, const std::string& pad) {
  json tj = read_json_file(test::fixture_path("tokenizers/clip_small_json/tokenizer.json"));
  tj["model"]["vocab"] = read_json_file(test::fixture_path("tokenizers/clip/vocab.json"));
  json merges = json::array();
  std::ifstream in(test::fixture_path("tokenizers/clip/merges.txt"));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  tj["model"]["merges"] = merges;
  tj["added_tokens"][0]["id"] = 49406;
  tj["added_tokens"][0]["normalized"] = false;  // as the plain config of tokenizers/clip
  tj["added_tokens"][1]["id"] = 49407;
  tj["post_processor"]["cls"][1] = 49406;
  tj["post_processor"]["sep"][1] = 49407;
  write_file(dir / "tokenizer.json", tj.dump());
  json cfg = read_json_file(test::fixture_path("tokenizers/clip_small_json/tokenizer_config.json"));
  cfg["pad_token"] = pad;
  write_file(dir / "tokenizer_config.json", cfg.dump());
  return dir;
}

TEST(TokenizerJsonForm, FullClipVocabularyMatchesEveryClipGolden) {
  REQUIRE_FORMS();
  test::TempDir tmp;
  ClipTokenizer tok = ClipTokenizer::from_folder(full_clip_json(tmp.path(), "<|endoftext|>"));
  EXPECT_EQ(tok.pad_id(), 49407);
  auto enc = [&](const std::string& s) { return tok.encode(s); };
  expect_column(golden().at("strings"), golden().at("clip"), "clip", enc);
  expect_column(forms().at("strings"), forms().at("clip"), "clip (tricky)", enc);
  // The vocab.json form on the tricky strings too.
  ClipTokenizer slow = ClipTokenizer::from_folder(test::fixture_path("tokenizers/clip"));
  expect_column(forms().at("strings"), forms().at("clip"), "clip vocab.json (tricky)",
                [&](const std::string& s) { return slow.encode(s); });
  expect_column(golden().at("random_strings"), golden().at("random_clip"), "random_clip",
                [&](const std::string& s) { return unpadded(tok.tokenize(s)); });
  test::TempDir tmp2;
  ClipTokenizer bang = ClipTokenizer::from_folder(full_clip_json(tmp2.path(), "!"));
  EXPECT_EQ(bang.pad_id(), 0);
  expect_column(golden().at("strings"), golden().at("clip_pad_bang"), "clip_pad_bang",
                [&](const std::string& s) { return bang.encode(s); });
}

TEST(TokenizerJsonForm, T5FolderWithoutSpieceModel) {
  REQUIRE_FORMS();
  ASSERT_FALSE(fs::exists(test::fixture_path("tokenizers/t5_json/spiece.model")));
  T5Tokenizer tok = T5Tokenizer::from_folder(test::fixture_path("tokenizers/t5_json"));
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  for (int64_t n : {77, 256, 512})
    expect_column(golden().at("strings"), golden().at("t5_" + std::to_string(n)),
                  "t5_json " + std::to_string(n),
                  [&](const std::string& s) { return tok.encode(s, n); });
  expect_column(forms().at("strings"), forms().at("t5_77"), "t5_json (tricky)",
                [&](const std::string& s) { return tok.encode(s, 77); });
  expect_column(golden().at("random_strings"), golden().at("random_t5"), "random_t5",
                [&](const std::string& s) { return unpadded(tok.tokenize(s)); });
}

TEST(TokenizerJsonForm, T5SpieceModelOnly) {
  REQUIRE_FORMS();
  test::TempDir tmp;
  fs::copy_file(test::fixture_path("tokenizers/t5/spiece.model"),
                fs::path(tmp.path()) / "spiece.model");
  T5Tokenizer tok = T5Tokenizer::from_folder(tmp.path());
  for (int64_t n : {77, 256, 512})
    expect_column(golden().at("strings"), golden().at("t5_" + std::to_string(n)),
                  "t5 spiece " + std::to_string(n),
                  [&](const std::string& s) { return tok.encode(s, n); });
  expect_column(forms().at("strings"), forms().at("t5_77"), "t5 spiece (tricky)",
                [&](const std::string& s) { return tok.encode(s, 77); });
}

TEST(TokenizerJsonForm, MistralTrickyStrings) {
  REQUIRE_FORMS();
  BpeTokenizer tok =
      BpeTokenizer::from_tokenizer_json(test::fixture_path("tokenizers/mistral/tokenizer.json"));
  EncodeOptions o;
  o.max_length = 0;
  expect_column(forms().at("strings"), forms().at("mistral_plain"), "mistral_plain (tricky)",
                [&](const std::string& s) { return tok.encode(s, o); });
}

// Each file run whole as tokenizers' Tokenizer.from_file does (transformers' generic class).
TEST(TokenizerJson, WholeFilesMatchTheirTokenizers) {
  REQUIRE_FORMS();
  TokenizerJson clip =
      TokenizerJson::from_file(test::fixture_path("tokenizers/clip_small_json/tokenizer.json"));
  expect_column(forms().at("clip_small_strings"), forms().at("clip_small"), "file clip_small",
                [&](const std::string& s) { return encode_file(clip, s, 77, 2513); });
  TokenizerJson t5 =
      TokenizerJson::from_file(test::fixture_path("tokenizers/t5_json/tokenizer.json"));
  expect_column(golden().at("strings"), golden().at("t5_256"), "file t5",
                [&](const std::string& s) { return encode_file(t5, s, 256, 0); });
  expect_column(forms().at("strings"), forms().at("t5_77"), "file t5 (tricky)",
                [&](const std::string& s) { return encode_file(t5, s, 77, 0); });
}

TEST(TokenizerJson, ComponentsMatchTokenizers) {
  REQUIRE_FORMS();
  int files = 0;
  for (const auto& [key, column] : forms().items()) {
    if (key.rfind("component_", 0) != 0 || key == "component_strings") continue;
    const std::string name = key.substr(10);
    TokenizerJson t = TokenizerJson::from_file(
        test::fixture_path("tokenizers/components/" + name + "/tokenizer.json"));
    expect_column(forms().at("component_strings"), column, name, [&](const std::string& s) {
      std::vector<int64_t> ids = t.tokenize(s);
      const PostProcessor& post = t.post_processor();
      ids.insert(ids.begin(), post.prefix.begin(), post.prefix.end());
      ids.insert(ids.end(), post.suffix.begin(), post.suffix.end());
      return unpadded(ids);
    });
    ++files;
  }
  EXPECT_GE(files, 7);
}

TEST(TokenizerJson, FoldersWithoutTokenizerFilesNameWhatWasLookedFor) {
  test::TempDir tmp;
  std::string m = error_of([&] { ClipTokenizer::from_folder(tmp.path()); });
  EXPECT_NE(m.find("tokenizer.json"), std::string::npos) << m;
  EXPECT_NE(m.find("vocab.json"), std::string::npos) << m;
  m = error_of([&] { T5Tokenizer::from_folder(tmp.path()); });
  EXPECT_NE(m.find("tokenizer.json"), std::string::npos) << m;
  EXPECT_NE(m.find("spiece.model"), std::string::npos) << m;
}

TEST(TokenizerJson, UnsupportedComponentsNameTypeAndFile) {
  REQUIRE_FORMS();
  test::TempDir tmp;
  const fs::path file = fs::path(tmp.path()) / "tokenizer.json";
  const json base =
      read_json_file(test::fixture_path("tokenizers/components/strip_prepend/tokenizer.json"));
  auto refused = [&](const char* field, const json& value, const std::string& name) {
    json tj = base;
    if (std::string(field) == "model")
      tj["model"]["type"] = value;
    else
      tj[field] = value;
    write_file(file, tj.dump());
    std::string m = error_of([&] { TokenizerJson::from_file(file); });
    EXPECT_NE(m.find(name), std::string::npos) << field << ": " << m;
    EXPECT_NE(m.find(file.string()), std::string::npos) << field << ": " << m;
  };
  refused("normalizer", json{{"type", "NFKC"}}, "'NFKC'");
  refused("normalizer", json{{"type", "Replace"}, {"pattern", {{"Regex", "\\d"}}}, {"content", ""}},
          "\\d");
  refused("pre_tokenizer", json{{"type", "Whitespace"}}, "'Whitespace'");
  refused("pre_tokenizer",
          json{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}},
          "\\w+");
  refused("pre_tokenizer", json{{"type", "Metaspace"}, {"prepend_scheme", "first"}}, "'first'");
  refused("post_processor", json{{"type", "Unknown"}}, "'Unknown'");
  refused("model", "WordPiece", "'WordPiece'");
  // A T5 folder whose tokenizer.json is not a Unigram model.
  fs::copy_file(test::fixture_path("tokenizers/mistral/tokenizer.json"), file,
                fs::copy_options::overwrite_existing);
  std::string m = error_of([&] { T5Tokenizer::from_folder(tmp.path()); });
  EXPECT_NE(m.find("Unigram"), std::string::npos) << m;
}

}  // namespace
}  // namespace tessera::tokenizers
