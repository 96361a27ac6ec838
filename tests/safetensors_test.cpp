// safetensors reader/writer: round trips for every dtype, zero-copy mapping, and the one-line
// errors for malformed files (fixtures from tests/fixtures/malformed/make_malformed.py).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "io_test_folder.h"
#include "ops/copy.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

Tensor sample(DType t, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  if (t == DType::i64 || t == DType::i32) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(i * 7919 - 40000);
    return Tensor::from_ints(v, shape, t);
  }
  if (t == DType::boolean) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(i % 3 == 0);
    return Tensor::from_ints(v, shape, t);
  }
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(float(i) * 0.37f - 3.1f);
  return Tensor::from_floats(v, shape, t);
}

constexpr DType kAll[] = {DType::f32, DType::bf16,    DType::f16,    DType::i64,
                          DType::i32, DType::boolean, DType::f8e4m3, DType::f8e5m2};

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  std::map<std::string, Tensor> in;
  for (DType t : kAll) {
    in[std::string("t_") + dtype_name(t)] = sample(t, {3, 5});
    in[std::string("scalar_") + dtype_name(t)] = sample(t, {});
    in[std::string("empty_") + dtype_name(t)] = sample(t, {0, 4});
  }
  in["strided"] = sample(DType::f32, {4, 6}).transpose(0, 1);  // written contiguous
  const std::string path = dir / "all.safetensors";
  save_safetensors(path, in, {{"format", "pt"}, {"note", "tessera"}});
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "tessera");
  ASSERT_EQ(f->entries().size(), in.size());
  for (const auto& [name, t] : in) {
    SCOPED_TRACE(name);
    const Tensor got = f->get(name);
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(got.shape(), t.shape());
    EXPECT_TRUE(test::bit_equal(got, t));
  }
  // The data section starts 8-aligned, as the reference writer pads it.
  uint64_t header_len = 0;
  std::memcpy(&header_len, f->mapping(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
}

TEST(Safetensors, TensorsAreZeroCopyViewsOfTheMapping) {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
  save_safetensors(path, {{"a", sample(DType::bf16, {16, 8})}, {"b", sample(DType::f32, {3})}});
  Tensor a;
  const char* base = nullptr;
  size_t size = 0;
  {
    auto f = SafetensorsFile::open(path);
    base = static_cast<const char*>(f->mapping());
    size = f->mapping_size();
    a = f->get("a");
    const char* p = static_cast<const char*>(a.raw_data());
    EXPECT_GE(p, base);
    EXPECT_LE(p + a.nbytes(), base + size);
    EXPECT_FALSE(a.storage()->owned());
    auto loaded = load_safetensors(path);
    EXPECT_FALSE(loaded.at("b").storage()->owned());
  }
  // The tensor keeps the file mapped after the SafetensorsFile handle is gone.
  EXPECT_TRUE(test::bit_equal(a, sample(DType::bf16, {16, 8})));
}

TEST(Safetensors, MisalignedDataIsCopiedNotViewed) {
  TempDir dir;
  // A 10-byte header puts the data at byte 18: not 4-aligned for f32.
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const float vals[2] = {1.5f, -2.25f};
  std::string file(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(file.data(), &len, 8);
  file += header;
  ASSERT_NE(file.size() % 4, 0u);
  file.append(reinterpret_cast<const char*>(vals), 8);
  test::write_text(dir / "odd.safetensors", file);
  auto f = SafetensorsFile::open(dir / "odd.safetensors");
  const Tensor a = f->get("a");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw_data()) % 4, 0u);
  EXPECT_TRUE(a.storage()->owned());
  EXPECT_EQ(a.to_floats(), (std::vector<float>{1.5f, -2.25f}));
}

TEST(Safetensors, EmptyHeaderObjectIsAValidFile) {
  TempDir dir;
  save_safetensors(dir / "none.safetensors", {});
  auto f = SafetensorsFile::open(dir / "none.safetensors");
  EXPECT_TRUE(f->entries().empty());
}

struct MalformedCase {
  const char* file;
  const char* message;
};

const MalformedCase kMalformed[] = {
    {"empty.safetensors", "empty file"},
    {"truncated.safetensors", "truncated file (5 bytes"},
    {"header_past_end.safetensors", "header length 1000 runs past the end of the file (16 bytes"},
    {"huge_header_length.safetensors", "header length 18446744073709551615 exceeds the 100000000"},
    {"invalid_json.safetensors", "header is not valid JSON"},
    {"invalid_utf8.safetensors", "header is not valid JSON"},
    {"header_not_object.safetensors", "header is a JSON array, expected an object"},
    {"entry_not_object.safetensors", "tensor 'a' entry is a number"},
    {"missing_dtype.safetensors", "tensor 'a' has no dtype string"},
    {"offsets_out_of_range.safetensors",
     "tensor 'a' offsets [0, 64] are out of range (data section is 16 bytes)"},
    {"overlapping_offsets.safetensors", "tensors 'a' [0, 16] and 'b' [8, 24] overlap"},
    {"unknown_dtype.safetensors", "tensor 'a' has unknown dtype 'Q4_K'"},
    {"shape_mismatch.safetensors",
     "tensor 'a' shape (2, 3) of F32 needs 24 bytes but offsets [0, 16] give 16"},
    {"negative_dim.safetensors", "tensor 'a' shape [-1,4] has a negative dimension"},
    {"non_integer_dim.safetensors", "tensor 'a' shape [2.5,4] has a non-integer dimension"},
    {"metadata_not_string.safetensors", "__metadata__ value for 'format' is a number"},
    {"duplicate_tensor.safetensors", "tensor 'a' appears twice in the header"},
    {"deep_nesting.safetensors", "header nests deeper than 16 levels"},
};

TEST(Safetensors, MalformedFilesGiveOneLineErrorsNamingFileAndProblem) {
  for (const auto& c : kMalformed) {
    SCOPED_TRACE(c.file);
    const std::string path = test::fixture_path(std::string("malformed/") + c.file);
    ASSERT_TRUE(fs::exists(path)) << "run tests/fixtures/malformed/make_malformed.py";
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST(Safetensors, MissingFileAndFolderAreErrors) {
  TempDir dir;
  EXPECT_THROW(SafetensorsFile::open(dir / "absent.safetensors"), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.path()), Error);
}

TEST(Safetensors, ErrorMessagesEscapeControlCharactersInNames) {
  const std::string header =
      "{\"a\\nb\": {\"dtype\": \"F99\", \"shape\": [], \"data_offsets\": [0, 4]}}";
  try {
    parse_safetensors_header(header.data(), header.size(), 4, "mem", nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("a\\x0ab"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, EmptyTensorsMayShareOffsets) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  EXPECT_EQ(parse_safetensors_header(header.data(), header.size(), 8, "mem", nullptr).size(), 2u);
}

TEST(Safetensors, AbsurdShapesAreBoundedNotAllocated) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})";
  EXPECT_THROW(parse_safetensors_header(header.data(), header.size(), 8, "mem", nullptr), Error);
  const std::string big = R"({"a":{"dtype":"F32","shape":[99999999999999999999999],)"
                          R"("data_offsets":[0,18446744073709551615]}})";
  EXPECT_THROW(parse_safetensors_header(big.data(), big.size(), 8, "mem", nullptr), Error);
}

// A small in-process fuzz: random byte edits and truncations of a valid file must only ever
// give tessera::Error (the libFuzzer target in tests/fuzz does this at scale).
TEST(Safetensors, MutatedFilesOnlyThrowTesseraErrors) {
  TempDir dir;
  save_safetensors(dir / "v.safetensors",
                   {{"a", sample(DType::f32, {2, 3})}, {"b", sample(DType::bf16, {4})}},
                   {{"format", "pt"}});
  const std::string good = test::read_text(dir / "v.safetensors");
  std::mt19937 rng(1234);
  const char alphabet[] = "{}[]\",:0123456789-.eE \\u\xff";
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s = good;
    const int edits = 1 + int(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[pos] = char(rng());
          break;
        case 1:
          s[pos] = alphabet[rng() % (sizeof(alphabet) - 1)];
          break;
        case 2:
          s.resize(pos);
          break;
        default:
          s.insert(pos, 1, alphabet[rng() % (sizeof(alphabet) - 1)]);
          break;
      }
      if (s.empty()) break;
    }
    try {
      size_t start = 0;
      auto entries = parse_safetensors_buffer(s.data(), s.size(), "mut", nullptr, &start);
      for (const auto& e : entries) ASSERT_LE(start + e.end, s.size());
    } catch (const Error&) {
    }
  }
}

TEST(Safetensors, FailedWriteLeavesNoFileAndKeepsTheOldOne) {
  TempDir dir;
  // A folder that does not exist: the write fails up front and creates nothing.
  EXPECT_THROW(
      save_safetensors(dir / "no/such/dir/x.safetensors", {{"a", sample(DType::f32, {2})}}), Error);
  EXPECT_FALSE(fs::exists(dir / "no"));
  // A write that fails midway leaves the previous file untouched and no temporary behind.
  const std::string path = dir / "w.safetensors";
  save_safetensors(path, {{"a", sample(DType::f32, {2})}});
  const std::string before = test::read_text(path);
  EXPECT_THROW(write_file_atomically(path,
                                     [](std::FILE* fp) {
                                       std::fputs("partial", fp);
                                       return false;
                                     }),
               Error);
  EXPECT_THROW(write_file_atomically(path,
                                     [](std::FILE* fp) -> bool {
                                       std::fputs("partial", fp);
                                       throw Error("boom");
                                     }),
               Error);
  EXPECT_EQ(test::read_text(path), before);
  size_t files = 0;
  for (const auto& de : fs::directory_iterator(dir.path())) files += de.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(Safetensors, ReservedNamesAreRejectedOnSave) {
  TempDir dir;
  EXPECT_THROW(save_safetensors(dir / "x.safetensors", {{"__metadata__", sample(DType::f32, {1})}}),
               Error);
  EXPECT_FALSE(fs::exists(dir / "x.safetensors"));
}

// Written by the Python safetensors package (reference/goldens/io_safetensors.py): the reader must
// agree with the library that produces every published checkpoint.
TEST(Safetensors, ReadsFilesWrittenByThePythonLibrary) {
  const std::string rel = "io/python_written.safetensors";
  if (!test::has_fixture(rel)) GTEST_SKIP() << "missing fixture " << rel;
  auto f = SafetensorsFile::open(test::fixture_path(rel));
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const auto t = load_safetensors(test::fixture_path(rel));
  // Each low-precision tensor is stored next to its exact f32 value.
  for (const char* name : {"bf16", "f16", "f8e4m3", "f8e5m2"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(test::all_close(t.at(name), t.at(std::string(name) + "_as_f32"), 0, 0));
  }
  EXPECT_EQ(t.at("i64").to_ints(), t.at("i64_values").to_ints());
  EXPECT_EQ(t.at("i32").dtype(), DType::i32);
  EXPECT_EQ(t.at("bool").dtype(), DType::boolean);
  EXPECT_EQ(t.at("f32").shape(), (Shape{2, 3, 4}));
}

}  // namespace
}  // namespace tessera
