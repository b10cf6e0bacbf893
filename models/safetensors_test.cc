#include "models/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/temp_dir_for_test.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}
template <typename T>
std::vector<uint8_t> Bytes(std::initializer_list<T> values) {
  return Bytes(std::data(values), values.size() * sizeof(T));
}
// n bytes with values seed, seed+1, ...: distinct per tensor so mix-ups show.
std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i);
  return v;
}
std::vector<uint8_t> ViewBytes(const TensorView& v) { return Bytes(v.data, v.nbytes()); }

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}
std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A raw safetensors file: 8-byte little-endian length (of `header` unless `length` is
// given), the header text, then the data.
std::string RawFile(const std::string& header, const std::string& data,
                    std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

class SafetensorsTest : public TempDirTest {
 protected:
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

};

TEST_F(SafetensorsTest, WriteSafetensorsRoundTrip) {
  std::map<std::string, TensorBytes> tensors;
  tensors["b.f32"] = {DType::kF32, {2, 2}, Bytes<float>({1.f, -2.f, 0.5f, 3.25f})};
  tensors["a.bf16"] = {DType::kBF16, {3}, Bytes<uint16_t>({0x3fc0, 0xc010, 0x4040})};
  tensors["c.u32"] = {DType::kU32, {1, 2}, Bytes<uint32_t>({7, 0xffffffffu})};
  tensors["d.i64"] = {DType::kI64, {}, Bytes<int64_t>({-5})};
  tensors["e.empty"] = {DType::kF16, {0, 4}, {}};
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), tensors, {{"format", "mlx"}}).ok());

  auto file = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsHeader& h = (*file)->header();
  EXPECT_EQ(h.data_offset % 8, 0u) << "header must be padded to 8 bytes";
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "mlx"}}));
  ASSERT_EQ(h.tensors.size(), tensors.size());
  uint64_t expected_begin = 0;  // data is laid out in name order, contiguously
  for (const auto& [name, t] : tensors) {
    const TensorEntry& e = h.tensors.at(name);
    EXPECT_EQ(e.begin, expected_begin) << name;
    expected_begin = e.end;
    auto view = (*file)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, t.dtype) << name;
    EXPECT_EQ(view->shape, t.shape) << name;
    EXPECT_EQ(ViewBytes(*view), t.bytes) << name;
  }
  EXPECT_EQ((*file)->Get("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, WriteSafetensorsRejectsWrongByteCount) {
  std::map<std::string, TensorBytes> tensors;
  tensors["w"] = {DType::kF32, {3}, Pattern(8, 0)};
  absl::Status s = WriteSafetensors(Path("t.safetensors"), tensors, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
}

// MLX's own writer: NUL-terminated header, unaligned data offsets.
TEST_F(SafetensorsTest, ReadsFileWrittenByMlx) {
  auto file =
      SafetensorsFile::Open(std::string(RING_SOURCE_DIR) + "/tests/data/mlx_small.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->header().metadata.at("format"), "mlx");

  auto f32 = (*file)->Get("w.f32");
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_THAT(f32->shape, ElementsAre(2, 3));
  EXPECT_THAT(ToFloatVector(*f32), ElementsAre(0, 1, 2, 3, 4, 5));

  auto bf16 = (*file)->Get("w.bf16");
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  EXPECT_THAT(ToFloatVector(*bf16), ElementsAre(1.5f, -2.25f, 3.0f));

  auto f16 = (*file)->Get("h.f16");
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(f16->dtype, DType::kF16);
  EXPECT_THAT(ToFloatVector(*f16), ElementsAre(0.5f, -0.25f));

  auto u8 = (*file)->Get("s.u8");
  ASSERT_TRUE(u8.ok());
  EXPECT_EQ(ViewBytes(*u8), (std::vector<uint8_t>{127, 128, 0}));

  auto u32 = (*file)->Get("q.u32");
  ASSERT_TRUE(u32.ok());
  EXPECT_EQ(u32->dtype, DType::kU32);
  EXPECT_THAT(u32->shape, ElementsAre(2, 2));
  uint32_t q[4];
  std::memcpy(q, u32->data, sizeof(q));  // MLX does not align offsets
  EXPECT_THAT(q, ElementsAre(1u, 2u, 3u, 0xffffffffu));
}

TEST_F(SafetensorsTest, CheckpointWriterSingleShard) {
  CheckpointWriter writer(dir_.string());
  ASSERT_TRUE(writer.Add("z", DType::kU8, {4}, Pattern(4, 10)).ok());
  ASSERT_TRUE(writer.Add("a", DType::kF32, {2}, Bytes<float>({1.f, 2.f})).ok());
  ASSERT_TRUE(writer.Finish(6).ok());
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));  // as mlx-lm

  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->Names(), ElementsAre("a", "z"));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 0);
  auto z = (*ckpt)->Get("z");
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(ViewBytes(*z), Pattern(4, 10));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 1);

  auto file = SafetensorsFile::Open(Path("model.safetensors"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->header().metadata.at("format"), "mlx");
  EXPECT_LT((*file)->header().tensors.at("a").begin, (*file)->header().tensors.at("z").begin);
}

TEST_F(SafetensorsTest, CheckpointWriterShardsAndCheckpointOpensLazily) {
  // Budget 64 bytes: a | b c | d (alone: larger than the budget) | e.
  CheckpointWriter writer(dir_.string(), /*max_shard_bytes=*/64);
  ASSERT_TRUE(writer.Add("a", DType::kU8, {40}, Pattern(40, 1)).ok());
  ASSERT_TRUE(writer.Add("c", DType::kU8, {40}, Pattern(40, 2)).ok());
  ASSERT_TRUE(writer.Add("b", DType::kF32, {4}, Pattern(16, 3)).ok());
  ASSERT_TRUE(writer.Add("d", DType::kU16, {50}, Pattern(100, 4)).ok());
  ASSERT_TRUE(writer.Add("e", DType::kU8, {8}, Pattern(8, 5)).ok());
  ASSERT_TRUE(writer.Finish(/*total_parameters=*/162).ok());

  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir_)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_THAT(files,
              ElementsAre("model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                          "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                          "model.safetensors.index.json"));

  const auto index = nlohmann::json::parse(ReadFile(dir_ / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 204);
  EXPECT_EQ(index["metadata"]["total_parameters"], 162);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["e"], "model-00004-of-00004.safetensors");

  // Each shard's header and data are sorted by name even though c was added before b.
  auto shard2 = SafetensorsFile::Open(Path("model-00002-of-00004.safetensors"));
  ASSERT_TRUE(shard2.ok());
  EXPECT_EQ((*shard2)->header().tensors.at("b").begin, 0u);
  EXPECT_EQ((*shard2)->header().tensors.at("c").begin, 16u);
  EXPECT_EQ((*shard2)->header().metadata.at("format"), "mlx");

  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->Names(), ElementsAre("a", "b", "c", "d", "e"));
  EXPECT_TRUE((*ckpt)->Has("d"));
  EXPECT_FALSE((*ckpt)->Has("f"));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 0);

  auto d = (*ckpt)->Describe("d");  // header only: maps nothing
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->dtype, DType::kU16);
  EXPECT_THAT(d->shape, ElementsAre(50));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 0);

  auto e = (*ckpt)->Get("e");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(ViewBytes(*e), Pattern(8, 5));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 1);
  ASSERT_TRUE((*ckpt)->Get("b").ok());
  auto c = (*ckpt)->Get("c");  // same shard as b
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(ViewBytes(*c), Pattern(40, 2));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 2);
  EXPECT_EQ((*ckpt)->Get("f").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, CheckpointGetIsThreadSafe) {
  CheckpointWriter writer(dir_.string(), /*max_shard_bytes=*/16);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(writer.Add("t" + std::to_string(i), DType::kU8, {16}, Pattern(16, i)).ok());
  }
  ASSERT_TRUE(writer.Finish().ok());
  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 8; ++i) {
        auto v = (*ckpt)->Get("t" + std::to_string(i));
        if (!v.ok() || ViewBytes(*v) != Pattern(16, i)) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, 0);
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 8);
}

TEST_F(SafetensorsTest, CheckpointWriterRejectsBadInput) {
  CheckpointWriter writer(dir_.string());
  EXPECT_EQ(writer.Add("w", DType::kF32, {3}, Pattern(8, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Add("w", DType::kF32, {-1}, {}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(writer.Add("w", DType::kU8, {2}, Pattern(2, 0)).ok());
  EXPECT_EQ(writer.Add("w", DType::kU8, {2}, Pattern(2, 0)).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(writer.Finish().ok());
  EXPECT_EQ(writer.Add("x", DType::kU8, {1}, Pattern(1, 0)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SafetensorsTest, UnfinishedWriterLeavesNoFiles) {
  {
    CheckpointWriter writer(dir_.string(), /*max_shard_bytes=*/4);
    ASSERT_TRUE(writer.Add("a", DType::kU8, {8}, Pattern(8, 0)).ok());  // flushed at once
    ASSERT_TRUE(writer.Add("b", DType::kU8, {8}, Pattern(8, 0)).ok());
    EXPECT_FALSE(fs::is_empty(dir_));
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SafetensorsTest, CheckpointWithoutIndexReadsAllSafetensorsFiles) {
  std::map<std::string, TensorBytes> x, y;
  x["x.w"] = {DType::kU8, {3}, Pattern(3, 1)};
  y["y.w"] = {DType::kU8, {2}, Pattern(2, 9)};
  ASSERT_TRUE(WriteSafetensors(Path("part-a.safetensors"), x, {}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("part-b.safetensors"), y, {}).ok());
  WriteFile(dir_ / "README.md", "not a shard");

  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT((*ckpt)->Names(), ElementsAre("x.w", "y.w"));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 0);
  auto d = (*ckpt)->Describe("y.w");
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(d->shape, ElementsAre(2));
  auto v = (*ckpt)->Get("y.w");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(ViewBytes(*v), Pattern(2, 9));
  EXPECT_EQ((*ckpt)->NumFilesOpened(), 1);

  // The same name in two files is ambiguous without an index.
  ASSERT_TRUE(WriteSafetensors(Path("part-c.safetensors"), x, {}).ok());
  auto dup = Checkpoint::Open(dir_.string());
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(), AllOf(HasSubstr("x.w"), HasSubstr("part-a.safetensors"),
                                            HasSubstr("part-c.safetensors")));
}

TEST_F(SafetensorsTest, CheckpointOpenErrors) {
  EXPECT_EQ(Checkpoint::Open(Path("missing")).status().code(), absl::StatusCode::kNotFound);
  auto empty = Checkpoint::Open(dir_.string());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr(dir_.string()));

  // A corrupt shard in an index-less directory fails Open, naming the file.
  WriteFile(dir_ / "model.safetensors", RawFile("{not json", ""));
  auto bad = Checkpoint::Open(dir_.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsTest, IndexErrorsNameIndexShardAndTensor) {
  std::map<std::string, TensorBytes> t;
  t["present"] = {DType::kU8, {1}, Pattern(1, 0)};
  ASSERT_TRUE(WriteSafetensors(Path("shard.safetensors"), t, {}).ok());
  const fs::path index = dir_ / "model.safetensors.index.json";

  WriteFile(index, R"({"weight_map": {"present": "shard.safetensors", "w": "gone.safetensors"}})");
  auto missing = Checkpoint::Open(dir_.string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr("model.safetensors.index.json"),
                                                HasSubstr("gone.safetensors"), HasSubstr("'w'")));

  WriteFile(index,
            R"({"weight_map": {"present": "shard.safetensors", "absent": "shard.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->Get("present").ok());
  for (absl::Status s : {(*ckpt)->Get("absent").status(), (*ckpt)->Describe("absent").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'absent'"),
                                   HasSubstr("shard.safetensors")));
  }

  for (const char* text : {R"({"weight_map": {"present": )", R"([1, 2])", R"({"metadata": {}})",
                           R"({"weight_map": {"present": 3}})",
                           R"({"weight_map": {"present": "../shard.safetensors"}})"}) {
    WriteFile(index, text);
    auto malformed = Checkpoint::Open(dir_.string());
    EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(malformed.status().message(), HasSubstr("model.safetensors.index.json")) << text;
  }
}

struct CorruptCase {
  const char* label;
  std::string file;
  std::vector<const char*> mentions;  // besides the file name
};

std::vector<CorruptCase> CorruptCases() {
  const std::string f32x4(16, '\x01');
  auto one = [](const std::string& entry) { return std::string(R"({"w":)") + entry + "}"; };
  return {
      {"tiny file", "\x05\x00\x00", {"too short"}},
      {"lying length",
       RawFile(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), f32x4, 4096),
       {"header length"}},
      {"huge length", RawFile("{}", "", 1ull << 40), {"exceeds"}},
      {"truncated data",
       RawFile(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), "abc"),
       {"'w'", "truncated"}},
      {"size mismatch",
       RawFile(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,16]})"), f32x4),
       {"'w'", "[3]"}},
      {"begin after end",
       RawFile(one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})"), f32x4),
       {"'w'", "begin > end"}},
      {"overlap",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               f32x4),
       {"'a'", "'b'", "overlap"}},
      {"huge shape",
       RawFile(
           one(R"({"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,16]})"),
           f32x4),
       {"'w'", "overflow"}},
      {"byte size overflow",
       RawFile(one(R"({"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,16]})"),
               f32x4),
       {"'w'", "overflow"}},
      {"negative dim",
       RawFile(one(R"({"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]})"), f32x4),
       {"'w'", "shape"}},
      {"unknown dtype",
       RawFile(one(R"({"dtype":"FLOAT32","shape":[4],"data_offsets":[0,16]})"), f32x4),
       {"'w'", "FLOAT32"}},
      {"dtype not a string",
       RawFile(one(R"({"dtype":4,"shape":[4],"data_offsets":[0,16]})"), f32x4),
       {"'w'", "dtype"}},
      {"missing shape",
       RawFile(one(R"({"dtype":"F32","data_offsets":[0,16]})"), f32x4),
       {"'w'", "shape"}},
      {"three offsets",
       RawFile(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,8,16]})"), f32x4),
       {"'w'", "data_offsets"}},
      {"entry not an object", RawFile(one("[1]"), f32x4), {"'w'"}},
      {"metadata not strings", RawFile(R"({"__metadata__":{"n":3}})", ""), {"__metadata__"}},
      {"bad json", RawFile(R"({"w": {"dtype": "F32")", f32x4), {"JSON"}},
      {"not an object", RawFile("[1, 2]", ""), {"JSON object"}},
      {"embedded NUL", RawFile(std::string("{}\0{}", 5), ""), {"NUL"}},
  };
}

TEST_F(SafetensorsTest, EveryCorruptionIsAnErrorNamingFileAndTensor) {
  for (const CorruptCase& c : CorruptCases()) {
    const std::string path = Path("corrupt.safetensors");
    WriteFile(path, c.file);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << c.label;
    EXPECT_TRUE(file.status().code() == absl::StatusCode::kInvalidArgument ||
                file.status().code() == absl::StatusCode::kDataLoss)
        << c.label << ": " << file.status();
    EXPECT_THAT(file.status().message(), HasSubstr(path)) << c.label;
    for (const char* m : c.mentions) EXPECT_THAT(file.status().message(), HasSubstr(m)) << c.label;
  }
}

TEST(ParseSafetensorsHeaderTest, AcceptsPaddingAndEmptyTensors) {
  const std::string header = R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                             R"("b":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})"
                             "    ";
  const std::string file = RawFile(header, "\x01");
  auto h = ParseSafetensorsHeader(file, file.size(), "mem");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_offset, 8 + header.size());
  EXPECT_EQ(h->tensors.at("z").end, 0u);
  EXPECT_EQ(h->tensors.at("b").dtype, DType::kBool);
}

TEST(ParseSafetensorsHeaderTest, PrefixMustHoldTheWholeHeader) {
  const std::string file = RawFile(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  auto h = ParseSafetensorsHeader(absl::string_view(file).substr(0, 20), file.size(), "mem");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
}

// The fuzz seeds double as a table: valid_* must parse, everything else must not (crash
// reproducers found by the fuzzer, crash_*, only have to return).
TEST(ParseSafetensorsHeaderTest, FuzzCorpusSeedsBehaveAsNamed) {
  int checked = 0;
  for (const auto& entry :
       fs::directory_iterator(std::string(RING_SOURCE_DIR) + "/tests/corpus/safetensors")) {
    const std::string name = entry.path().filename();
    const std::string bytes = ReadFile(entry.path());
    auto h = ParseSafetensorsHeader(bytes, bytes.size(), name);
    if (name.starts_with("valid_")) {
      EXPECT_TRUE(h.ok()) << name << ": " << h.status();
    } else if (!name.starts_with("crash_")) {
      EXPECT_FALSE(h.ok()) << name;
    }
    ++checked;
  }
  EXPECT_GE(checked, 12);
}

}  // namespace
}  // namespace ring
