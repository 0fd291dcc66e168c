#include "engine/safetensors.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/image_io.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace wm {
namespace {

// a test's scratch checkpoint directory, gone when the test ends however it ends
struct ScratchDir {
  std::string path;
  explicit ScratchDir(std::string p) : path(std::move(p)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

TEST(Safetensors, ParsesValidFile) {
  const std::string f = make_file(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[1,1],"data_offsets":[8,10]},"__metadata__":{"k":"v"}})",
      floats({1.0f, 2.0f}) + std::string("\x00\x3c", 2));
  auto st = SafetensorsFile::parse(f, "mem");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ((*st)->tensors().size(), 2u);
  EXPECT_EQ((*st)->metadata().at("k"), "v");
  float out[2];
  ASSERT_TRUE((*st)->read_f32("a", {2}, out).ok());
  EXPECT_EQ(out[1], 2.0f);
  float one;
  ASSERT_TRUE((*st)->read_f32("b", {1, 1}, &one).ok());
  EXPECT_EQ(one, 1.0f);
  EXPECT_FALSE((*st)->read_f32("a", {3}, out).ok());
  EXPECT_FALSE((*st)->read_f32("missing", {1}, out).ok());
}

void expect_error(const std::string& file, const std::string& needle) {
  auto st = SafetensorsFile::parse(file, "bad.safetensors");
  ASSERT_FALSE(st.ok()) << "accepted a file that should fail with: " << needle;
  EXPECT_NE(std::string(st.status().message()).find(needle), std::string::npos) << st.status();
  EXPECT_NE(std::string(st.status().message()).find("bad.safetensors"), std::string::npos) << st.status();
}

TEST(Safetensors, RejectsDamagedFiles) {
  expect_error("abc", "shorter than the 8-byte");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", floats({1.0f})), "past the");
  std::string huge(8, '\xff');
  expect_error(huge + "{}", "exceeds");
  std::string trunc = make_file("{}", "");
  trunc[0] = 100;
  expect_error(trunc, "runs past the end");
  expect_error(make_file("not json", ""), "not valid JSON");
  expect_error(make_file("[1,2]", ""), "not a JSON object");
  expect_error(make_file(std::string(100, '[') + std::string(100, ']'), ""), "nested");
  expect_error(make_file(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", floats({1})), "unsupported dtype");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", floats({1, 2})), "needs 12");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", floats({1})), "non-negative");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", floats({1, 2})), "reversed");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                         floats({1})),
               "overlap");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", floats({1})),
               "absurdly large");
  expect_error(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", floats({1})), "missing dtype");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", floats({1})), "data_offsets");
  // JSON keeps the last of two equal keys: a name listed twice is refused instead
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         floats({1, 2})),
               "lists 'a' twice");
}

// an empty tensor holds no bytes, so it overlaps nothing, but it must not
// hide the overlap of the tensors either side of it
TEST(Safetensors, EmptyTensorsDoNotHideOverlaps) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         floats({1, 2})),
               "tensors 'a' and 'b' overlap");
  // empty tensors anywhere, and tensors that only touch, are fine
  auto ok = SafetensorsFile::parse(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                                             R"("f":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},)"
                                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                             floats({1, 2})),
                                   "mem");
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// the JSON parser stops at a NUL as at the end of its input: what follows
// would go unread, so a damaged header could pass
TEST(Safetensors, RefusesNulBytesInTheHeader) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error(make_file(header + std::string("\0\0  ", 4), floats({1})), "NUL byte at offset 54");
  expect_error(make_file(header + std::string("\0,\"b\":{}}", 9), floats({1})), "NUL byte at offset 54");
}

// a header is parsed in time and memory linear in its size and bounded by a
// count of values, whatever its shape: many tensors (which the callback
// parser took quadratic time over) or a dense array (~100 bytes a value)
TEST(Safetensors, HeaderSizeIsBoundedByItsValues) {
  std::string many = "{";
  for (int i = 0; i < 60000; ++i)
    absl::StrAppend(&many, i > 0 ? "," : "", "\"t", i, R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})");
  many += "}";
  auto parsed = SafetensorsFile::parse(make_file(many, ""), "many.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->tensors().size(), 60000u);
  std::string dense = "{\"a\":[0";
  for (int i = 0; i < (1 << 21); ++i) dense += ",0";
  dense += "]}";
  expect_error(make_file(dense, ""), "header holds more than 2097152 JSON values");
}

// names come from the file: an error quotes them escaped and cut short
TEST(Safetensors, ErrorsQuoteNamesEscapedAndShort) {
  const std::string name = "\\u001b[2J" + std::string(100000, 'x');
  auto st = SafetensorsFile::parse(
      make_file("{\"" + name + R"(":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", floats({1})), "bad.safetensors");
  ASSERT_FALSE(st.ok());
  const std::string message(st.status().message());
  EXPECT_NE(message.find("tensor '\\x1b[2Jxxx"), std::string::npos) << message.substr(0, 300);
  EXPECT_NE(message.find("...' (100004 bytes): unsupported dtype 'Q4'"), std::string::npos) << message.substr(0, 300);
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
  EXPECT_LT(message.size(), 400u);
}

// tensors are read from the file when asked for, in pieces: values that span
// several pieces come back whole, and a file cut short after it was opened (a
// copy over a model while it loads) is an error naming the file, not SIGBUS
TEST(Safetensors, ReadsInPiecesAndSurvivesAFileCutShort) {
  const ScratchDir scratch(::testing::TempDir() + "/cut_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch.path);
  const std::string path = scratch.path + "/model.safetensors";
  const int64_t n = 3'000'001;  // F32: about 2.9 pieces of 4 MiB; BF16: 1.4
  std::vector<float> a(static_cast<size_t>(n));
  std::vector<uint16_t> b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    a[static_cast<size_t>(i)] = static_cast<float>(i % 1000) - 500.0f;
    b[static_cast<size_t>(i)] = 0x3f80 + static_cast<uint16_t>(i % 64);  // 1.0, 1.0078125, ...
  }
  ASSERT_TRUE(write_safetensors(path, {{"a", DType::f32, {n}, a.data()}, {"b", DType::bf16, {n}, b.data()}}).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> out(static_cast<size_t>(n), -1.0f);
  ASSERT_TRUE((*f)->read_f32("a", {n}, out.data()).ok());
  EXPECT_EQ(out, a);
  ASSERT_TRUE((*f)->read_f32("b", {n}, out.data()).ok());
  for (int64_t i : {int64_t{0}, int64_t{63}, int64_t{2'097'151}, int64_t{2'097'152}, n - 1})
    EXPECT_EQ(out[static_cast<size_t>(i)], 1.0f + static_cast<float>(i % 64) / 128.0f) << i;
  // cut inside "a": both tensors now end past the file
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 4);
  for (const char* name : {"a", "b"}) {
    const absl::Status st = (*f)->read_f32(name, {n}, out.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << name << ": " << st;
    EXPECT_NE(std::string(st.message()).find(path + ": the file ends at byte"), std::string::npos) << st;
    EXPECT_NE(std::string(st.message()).find("cut short while loading"), std::string::npos) << st;
  }
  // opened again, the shortened file is refused by its header's offsets
  auto again = SafetensorsFile::open(path);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(std::string(again.status().message()).find("truncated?"), std::string::npos) << again.status();
}

// model files are regular files: a FIFO (no writer) or a directory is refused
// at once instead of blocking the loader
TEST(Safetensors, OnlyRegularFilesOpen) {
  const std::string fifo = ::testing::TempDir() + "/model_fifo_" + std::to_string(::getpid()) + ".safetensors";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = SafetensorsFile::open(fifo);
  ::unlink(fifo.c_str());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(std::string(f.status().message()).find("not a regular file"), std::string::npos) << f.status();
  auto d = SafetensorsFile::open(::testing::TempDir());
  ASSERT_FALSE(d.ok());
  for (const std::string& path : {fifo, ::testing::TempDir()}) {
    if (path == fifo) {
      ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    }
    auto r = read_file(path, 1 << 20);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << path << ": " << r.status();
    EXPECT_NE(std::string(r.status().message()).find(path == fifo ? "not a regular file" : "is a directory"),
              std::string::npos)
        << r.status();
  }
  ::unlink(fifo.c_str());
  const std::string big = ::testing::TempDir() + "/big_" + std::to_string(::getpid()) + ".bin";
  std::ofstream(big) << std::string(100, 'x');
  auto r = read_file(big, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("100 bytes; at most 99"), std::string::npos) << r.status();
  EXPECT_EQ(read_file(big, 100)->size(), 100u);
  ::unlink(big.c_str());
}

// random mutations of a valid checkpoint never crash or read out of bounds (ASan/valgrind find the latter)
TEST(Safetensors, FuzzedMutationsFailCleanly) {
  ModelConfig c;
  auto cfg = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  HostWeights w = random_host_weights(*cfg, 1);
  const ScratchDir scratch(::testing::TempDir() + "/fuzz_ckpt_" + std::to_string(::getpid()));
  const std::string& dir = scratch.path;
  ASSERT_TRUE(save_checkpoint(*cfg, w, dir).ok());
  std::string good;
  {
    FILE* f = std::fopen((dir + "/model.safetensors").c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) good.append(buf, n);
    std::fclose(f);
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(good[static_cast<size_t>(i)]);
  std::mt19937 rng(7);
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = good;
    const int kind = iter % 4;
    if (kind == 0) {  // flip bytes inside the header
      for (int j = 0; j < 3; ++j) m[8 + rng() % header_len] = static_cast<char>(rng());
    } else if (kind == 1) {  // truncate anywhere
      m.resize(rng() % m.size());
    } else if (kind == 2) {  // corrupt the length prefix
      m[rng() % 8] = static_cast<char>(rng());
    } else {  // digits inside the header changed
      for (size_t j = 8; j < 8 + header_len; ++j)
        if (std::isdigit(static_cast<unsigned char>(m[j])) && rng() % 20 == 0) m[j] = static_cast<char>('0' + rng() % 10);
    }
    auto st = SafetensorsFile::parse(m, "fuzz");
    if (!st.ok()) continue;
    auto hw = load_host_weights(*cfg, **st);
    if (hw.ok()) ++accepted;
  }
  // some mutations are harmless (e.g. inside string values); most must fail
  EXPECT_LT(accepted, 3000);
}

TEST(Safetensors, CheckpointRejectsExtraAndMismatchedTensors) {
  auto cfg = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json");
  ASSERT_TRUE(cfg.ok());
  HostWeights w = random_host_weights(*cfg, 2);
  const ScratchDir scratch(::testing::TempDir() + "/mismatch_ckpt_" + std::to_string(::getpid()));
  const std::string& dir = scratch.path;
  ASSERT_TRUE(save_checkpoint(*cfg, w, dir).ok());
  auto file = SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  ModelConfig other = *cfg;
  other.ffn = 96;
  auto bad = load_host_weights(other, **file);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("ffn.0.weight"), std::string::npos) << bad.status();
  ModelConfig fewer = *cfg;
  fewer.layers = 1;
  auto extra = load_host_weights(fewer, **file);
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(std::string(extra.status().message()).find("not part of this config"), std::string::npos);
  EXPECT_FALSE(SafetensorsFile::open(dir + "/nope.safetensors").ok());
}

}  // namespace
}  // namespace wm
