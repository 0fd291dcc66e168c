// The offline tools (wmgen, wmeval, wmquant, wmckpt, wmbench) run as
// processes on bad flags and files: each must exit non-zero with a one-line
// message that names the flag or the problem, within bounded time and memory
// (no abort, no hang, no allocation the input asks for).
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/image_io.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "tests/support/spawn.h"

namespace wm {
namespace {

using ToolRun = testing::LoggedRun;

std::string temp_dir() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "wm_tools_cli_" + std::to_string(getpid());
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// the child's limits, set between fork and exec: a time limit (SIGALRM
// survives exec) and a cap on its data segment, so that a hang or a runaway
// allocation fails the test instead of the machine; optionally a cap on the
// size of the files it writes, which stands for a full disk (with SIGXFSZ
// ignored, which also survives exec, a write past it fails with EFBIG)
unsigned child_timeout_s = 60;
rlim_t child_file_size_limit = RLIM_INFINITY;
void limit_child() {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (a sanitizer's shadow memory would not fit under the cap)
  const rlimit data{rlim_t{4} << 30, rlim_t{4} << 30};
  setrlimit(RLIMIT_DATA, &data);
#endif
  if (child_file_size_limit != RLIM_INFINITY) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit fsize{child_file_size_limit, child_file_size_limit};
    setrlimit(RLIMIT_FSIZE, &fsize);
  }
  alarm(child_timeout_s);
}

ToolRun run_tool(const std::vector<std::string>& argv, int timeout_s = 60, rlim_t file_size_limit = RLIM_INFINITY) {
  static int count = 0;
  child_timeout_s = static_cast<unsigned>(timeout_s);
  child_file_size_limit = file_size_limit;
  return testing::run_logged(argv, temp_dir() + "/run" + std::to_string(count++) + ".log", limit_child);
}

std::string source(const std::string& rel) { return std::string(WM_SOURCE_DIR) + "/" + rel; }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// the tiny test config grown to these sizes (rope pairs t, h, w), named
// NAME; it must still validate
struct ConfigSizes {
  int dim, layers, heads, head_dim, ffn, t_pairs, h_pairs, w_pairs;
};
ModelConfig grown_config(const std::string& name, const ConfigSizes& z) {
  auto cfg = load_model_config(source("configs/tiny-test.json"));
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  if (!cfg.ok()) return ModelConfig();
  cfg->name = name;
  cfg->dim = z.dim;
  cfg->layers = z.layers;
  cfg->heads = z.heads;
  cfg->head_dim = z.head_dim;
  cfg->ffn = z.ffn;
  cfg->t_pairs = z.t_pairs;
  cfg->h_pairs = z.h_pairs;
  cfg->w_pairs = z.w_pairs;
  EXPECT_TRUE(parse_model_config(model_config_to_json(*cfg), name).ok()) << name;
  return *cfg;
}

// expects a refusal: this exit code (not a crash) and a message containing `what`
#define EXPECT_REFUSED(r, exit_code, what)                                     \
  do {                                                                         \
    const ToolRun& r_ = (r);                                                       \
    EXPECT_EQ(r_.code, exit_code) << r_.log;                                   \
    EXPECT_NE(r_.log.find(what), std::string::npos) << "no '" << what << "' in:\n" << r_.log; \
  } while (0)

// a tiny checkpoint (made by wmckpt itself), an action script and a dump of it
class ToolsCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = temp_dir() + "/tiny";
    const ToolRun init = run_tool({WMCKPT_BIN, "init", "--config=" + source("configs/tiny-test.json"), "--seed=1", "--out=" + model_});
    ASSERT_EQ(init.code, 0) << init.log;
    script_ = temp_dir() + "/actions.txt";
    write_text(script_, "W 0 0 *3\n");
    dump_ = temp_dir() + "/tiny_dump.safetensors";
    const ToolRun dump = run_tool({WMQUANT_BIN, "dump", "--model=" + model_, "--script=" + script_, "--out=" + dump_, "--threads=2"});
    ASSERT_EQ(dump.code, 0) << dump.log;
  }

  static void TearDownTestSuite() { std::filesystem::remove_all(temp_dir()); }

  // every tensor of `file` as it is to be written again, its bytes held in `bytes`
  static std::vector<TensorToWrite> read_tensors(const SafetensorsFile& file, std::vector<std::vector<uint8_t>>* bytes) {
    std::vector<TensorToWrite> tensors;
    bytes->assign(file.tensors().size(), {});
    for (size_t i = 0; i < file.tensors().size(); ++i) {
      const TensorView& t = file.tensors()[i];
      (*bytes)[i].resize(t.bytes);
      const absl::Status st = file.read_bytes(t, (*bytes)[i].data());
      EXPECT_TRUE(st.ok()) << st;
      tensors.push_back({t.name, t.dtype, t.shape, (*bytes)[i].data()});
    }
    return tensors;
  }

  // a copy of the dump whose metadata `edit` changed (tensors kept)
  static std::string mutated_dump(const std::string& name, const std::function<void(nlohmann::json* geometry,
                                                                                    nlohmann::json* events)>& edit) {
    auto file = SafetensorsFile::open(dump_);
    EXPECT_TRUE(file.ok()) << file.status();
    std::map<std::string, std::string> meta = (*file)->metadata();
    nlohmann::json geometry = nlohmann::json::parse(meta.at("wmquant.geometry"));
    nlohmann::json events = nlohmann::json::parse(meta.at("wmquant.events"));
    edit(&geometry, &events);
    meta["wmquant.geometry"] = geometry.dump();
    meta["wmquant.events"] = events.dump();
    std::vector<std::vector<uint8_t>> bytes;
    const std::vector<TensorToWrite> tensors = read_tensors(**file, &bytes);
    const std::string path = temp_dir() + "/" + name + ".safetensors";
    const absl::Status st = write_safetensors(path, tensors, meta);
    EXPECT_TRUE(st.ok()) << st;
    return path;
  }

  // a copy of the dump with value 0 of its first tensor whose name ends in `suffix` set to `value`
  static std::string poisoned_dump(const std::string& name, const std::string& suffix, float value) {
    auto file = SafetensorsFile::open(dump_);
    EXPECT_TRUE(file.ok()) << file.status();
    std::vector<std::vector<uint8_t>> bytes;
    const std::vector<TensorToWrite> tensors = read_tensors(**file, &bytes);
    bool poisoned = false;
    for (size_t i = 0; i < tensors.size() && !poisoned; ++i) {
      if (!tensors[i].name.ends_with(suffix)) continue;
      EXPECT_EQ(tensors[i].dtype, DType::f32);
      std::memcpy(bytes[i].data(), &value, sizeof(float));
      poisoned = true;
    }
    EXPECT_TRUE(poisoned) << "no tensor " << suffix;
    const std::string path = temp_dir() + "/" + name + ".safetensors";
    const absl::Status st = write_safetensors(path, tensors, (*file)->metadata());
    EXPECT_TRUE(st.ok()) << st;
    return path;
  }

  static ToolRun eval_dump(const std::string& path, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {WMQUANT_BIN, "eval", "--dump=" + path, "--formats=fp16,qvg2", "--threads=2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_tool(argv);
  }

  static std::string model_, script_, dump_;
};

std::string ToolsCli::model_, ToolsCli::script_, ToolsCli::dump_;

TEST_F(ToolsCli, ThreadsOutsideTheServersRangeAreRefused) {
  const std::string out = temp_dir() + "/gen_threads";
  for (const char* t : {"100000", "2147483647", "-1", "1025"}) {
    SCOPED_TRACE(t);
    const std::string flag = std::string("--threads=") + t;
    const char* msg = "--threads must be 0..1024 (0: all cores)";
    EXPECT_REFUSED(run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + script_, "--out=" + out, flag}), 2, msg);
    EXPECT_REFUSED(run_tool({WMEVAL_BIN, "--model=" + model_, "--episodes=1", "--frames=2", flag}), 2, msg);
    EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--model=" + model_, "--script=" + script_, flag}), 2, msg);
  }
}

// more threads than cores run as many as there are cores: OpenBLAS reserves
// 128 MiB for each thread it starts, and under the children's data cap its
// allocator retried for ever at 1024 threads
TEST_F(ToolsCli, ThreadsBeyondTheCoresRunOnTheCores) {
  if (std::thread::hardware_concurrency() > 16)
    GTEST_SKIP() << "16 cores' buffers are 2 GiB of the 4 GiB cap; more would not fit it";
  const std::string out = temp_dir() + "/gen_many_threads";
  const ToolRun r = run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + script_, "--out=" + out, "--threads=1024"});
  EXPECT_EQ(r.code, 0) << r.log;
  EXPECT_TRUE(std::filesystem::exists(out + "/frame_00000.jpg")) << r.log;
  // --threads 0 takes OpenMP's default, which the environment may set as high
  const std::string env_out = temp_dir() + "/gen_many_env_threads";
  const ToolRun e = run_tool({"/usr/bin/env", "OMP_NUM_THREADS=1024", WMGEN_BIN, "--model=" + model_,
                              "--script=" + script_, "--out=" + env_out});
  EXPECT_EQ(e.code, 0) << e.log;
  EXPECT_TRUE(std::filesystem::exists(env_out + "/frame_00000.jpg")) << e.log;
}

// the largest config that validates: terabytes of weights, refused before any is allocated
// a script without actions would make no frames and exit 0; an empty --model
// would read /config.json
TEST_F(ToolsCli, EmptyScriptsAndModelsAreRefused) {
  const std::string empty = temp_dir() + "/empty.txt";
  write_text(empty, "# nothing but a comment\n\n");
  const std::string out = temp_dir() + "/gen_empty";
  EXPECT_REFUSED(run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + empty, "--out=" + out}), 1, "no actions");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--model=" + model_, "--script=" + empty}), 1, "no actions");
  EXPECT_REFUSED(run_tool({WMGEN_BIN, "--model=", "--script=" + script_, "--out=" + out}), 1, "no model directory");
  EXPECT_REFUSED(run_tool({WMCKPT_BIN, "check"}), 2, "--model");
}

TEST_F(ToolsCli, WeightsAbovePhysicalMemoryAreRefused) {
  const ModelConfig cfg = grown_config("enormous", {16384, 256, 256, 256, 65536, 44, 42, 42});
  if (cfg.parameter_count() * 4 <= memory_limit().bytes) GTEST_SKIP() << "this machine could hold the weights";
  const std::string path = temp_dir() + "/enormous.json";
  write_text(path, model_config_to_json(cfg));
  const std::string out = temp_dir() + "/enormous_model";
  EXPECT_REFUSED(run_tool({WMCKPT_BIN, "init", "--config=" + path, "--seed=1", "--out=" + out}), 1, "of memory this process may use");
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors"));
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--config=" + path, "--script=" + script_}), 1, "of memory this process may use");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "dump", "--config=" + path, "--script=" + script_, "--out=" + out + ".st"}), 1,
                 "of memory this process may use");
}

// the limit includes the process's address-space limit (and a container's):
// under ulimit -v a model that fits the machine but not the limit is refused
// with the message, not with an allocation failure
TEST_F(ToolsCli, WeightsAreCheckedAgainstTheAddressSpaceLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the limit";
#endif
  const ModelConfig cfg = grown_config("large", {4096, 8, 32, 128, 16384, 24, 20, 20});
  constexpr int64_t kLimitKiB = 1536 * 1024;  // 1.5 GiB; the weights need ~6 GiB
  ASSERT_GT(cfg.parameter_count() * 4, 2 * kLimitKiB * 1024);
  const std::string path = temp_dir() + "/large.json";
  write_text(path, model_config_to_json(cfg));
  const std::string out = temp_dir() + "/large_model";
  EXPECT_REFUSED(run_tool({"/bin/sh", "-c", absl::StrCat("ulimit -v ", kLimitKiB, " && exec \"$0\" \"$@\""),
                           WMCKPT_BIN, "init", "--config=" + path, "--seed=1", "--out=" + out}),
                 1, "address-space limit (ulimit -v)");
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors"));
}

TEST_F(ToolsCli, WmbenchFramesAreBounded) {
  // refused before the server is contacted (nothing listens on port 1)
  for (const char* f : {"100000000", "1000001", "0", "-1"})
    EXPECT_REFUSED(run_tool({WMBENCH_BIN, "--server=127.0.0.1:1", std::string("--frames=") + f}), 2,
                   "--frames must be 1..1000000");
  EXPECT_REFUSED(run_tool({WMBENCH_BIN, "--server=127.0.0.1:1", "--sessions=1000", "--frames=1000000"}), 2,
                 "--sessions x --frames");
}

TEST_F(ToolsCli, BenchHeadDimsAreParsedAndBounded) {
  for (const char* hd : {"abc", "99999999999", "100000", "64,x", "-64", "520", "12"})
    EXPECT_REFUSED(run_tool({WMQUANT_BIN, "bench", std::string("--head_dims=") + hd, "--configs="}), 2, "--head_dims");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "bench", "--head_dims=", "--configs="}), 2, "--head_dims");
  // a dim one format cannot take is refused before any timing, not after the
  // dims before it (8 passed the old check and failed in kivi2, 96 in qvg2)
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "bench", "--head_dims=64,8", "--reps=1000", "--configs="}, 20), 2,
                 "--head_dims: 8 does not suit kivi2: group 32 does not divide head_dim 8");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "bench", "--head_dims=96", "--reps=1000", "--configs="}, 20), 2,
                 "--head_dims: 96 does not suit qvg2: block 64 does not divide head_dim 96");
}

// wmquant's outputs are checked before its run, as wmeval's are: a path that
// cannot be written used to fail only once the run (minutes) was over
TEST_F(ToolsCli, QuantChecksOutputsBeforeTheRun) {
  const std::string missing = temp_dir() + "/no_such_dir/out";
  for (const char* flag : {"json", "md"}) {
    SCOPED_TRACE(flag);
    const std::string arg = std::string("--") + flag + "=";
    EXPECT_REFUSED(run_tool({WMQUANT_BIN, "bench", "--head_dims=64", "--reps=1000", "--configs=", arg + missing}, 20),
                   2, arg + missing + ": cannot write: No such file or directory");
    EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--model=" + model_, "--script=" + script_, arg + temp_dir()}, 20),
                   2, arg + temp_dir() + ": cannot write: Is a directory");
  }
  EXPECT_REFUSED(
      run_tool({WMQUANT_BIN, "dump", "--model=" + model_, "--script=" + script_, "--out=" + missing}, 20), 2,
      "--out=" + missing + ": cannot write: No such file or directory");
  // a file made only to try the path is removed again
  const std::string tried = temp_dir() + "/tried.json";
  EXPECT_REFUSED(
      run_tool({WMQUANT_BIN, "bench", "--head_dims=64", "--configs=", "--json=" + tried, "--md=" + missing}, 20), 2,
      "--md=");
  EXPECT_FALSE(std::filesystem::exists(tried));
}

TEST_F(ToolsCli, FormatFlagsAreBoundedAndQuoted) {
  struct Case {
    const char* flag;
    const char* message;
  };
  const Case cases[] = {
      {"--kivi_residual=32000000", "--kivi_residual=32000000"},
      {"--kivi_residual=48", "--kivi_residual=48 is not a multiple of --kivi_group=32"},
      {"--span_frames=2147483647", "--span_frames=2147483647"},
      {"--span_frames=-1", "--span_frames=-1"},
      {"--psac_refresh_frames=2147483647", "--psac_refresh_frames=2147483647"},
      {"--kmeans_iters=2147483647", "--kmeans_iters=2147483647"},
      {"--centroids=0", "--centroids=0"},
      {"--block=3", "--block=3 must be one of 16, 32, 64, 128"},
      {"--block=256", "--block=256 must be one of 16, 32, 64, 128"},
      {"--block=1000000", "--block=1000000 must be one of 16, 32, 64, 128"},
      {"--queries=-1", "--queries=-1"},
      {"--frames=-1", "--frames=-1"},
      {"--layers=-1", "--layers=-1"},
      {"--reps=-1", "--reps=-1"},
      {"--formats=", "--formats names no cache format"},
      {"--formats=,", "--formats names no cache format"},
      {"--formats=fp16,nope", "unknown cache format 'nope'"},
      {"--formats=qvg2,fp16,qvg2", "--formats names 'qvg2' twice"},
      {"--dump_dtype=f8", "--dump_dtype=f8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--dump=" + dump_, c.flag}, 20), 2, c.message);
  }
  EXPECT_REFUSED(run_tool({WMEVAL_BIN, "--model=" + model_, "--formats="}), 2, "--formats names no cache format");
  EXPECT_REFUSED(run_tool({WMEVAL_BIN, "--model=" + model_, "--formats=,"}), 2, "--formats names no cache format");
}

// a dump's K/V (and queries) feed the fp32 reference every format is measured
// against: a non-finite value there made every format score as exact
TEST_F(ToolsCli, DumpWithNonFiniteValuesIsRefused) {
  const struct {
    const char* suffix;
    float value;
  } cases[] = {{".k", std::nanf("")}, {".v", INFINITY}, {".q", -INFINITY}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.suffix);
    const std::string path = poisoned_dump("poisoned", c.suffix, c.value);
    const ToolRun r = eval_dump(path, {"--formats=fp16,kivi2,qvg2,quantwm2"});
    EXPECT_REFUSED(r, 1, "holds a non-finite value");
    EXPECT_NE(r.log.find(std::string(c.suffix) + "' holds"), std::string::npos) << r.log;
  }
}

// a geometry that passes the field checks but that no machine holds (a frame
// of 2^22 tokens over 256 layers x 256 heads x 256) is refused before the
// evaluator allocates anything, as a config's weights are
TEST_F(ToolsCli, DumpGeometryBeyondMemoryIsRefused) {
  const std::string path = mutated_dump("huge", [](nlohmann::json* g, nlohmann::json* e) {
    (*g)["layers"] = 256;
    (*g)["heads"] = 256;
    (*g)["head_dim"] = 256;
    (*g)["tokens_per_frame"] = 1 << 22;
    *e = nlohmann::json::array();
  });
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--dump=" + path, "--formats=qvg2", "--threads=1"}, 20), 1,
                 "of memory this process may use");
}

// each flag names one source of K/V; the other was ignored without a word
TEST_F(ToolsCli, ConflictingSourcesAreRefused) {
  const std::string config = "--config=" + source("configs/tiny-test.json");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--model=" + model_, config, "--script=" + script_}, 20), 2,
                 "--model and --config exclude each other");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "dump", "--model=" + model_, config, "--script=" + script_,
                           "--out=" + temp_dir() + "/conflict.safetensors"}, 20),
                 2, "--model and --config exclude each other");
  EXPECT_FALSE(std::filesystem::exists(temp_dir() + "/conflict.safetensors"));
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--dump=" + dump_, "--model=" + model_}, 20), 2,
                 "--dump replays a dump: --model and --config do not apply");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--dump=" + dump_, config}, 20), 2,
                 "--dump replays a dump: --model and --config do not apply");
}

TEST_F(ToolsCli, DumpEvaluates) {
  const ToolRun r = eval_dump(dump_);
  EXPECT_EQ(r.code, 0) << r.log;
  EXPECT_NE(r.log.find("| qvg2 |"), std::string::npos) << r.log;
}

TEST_F(ToolsCli, DumpGeometryIsValidated) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* message;
  };
  const Case cases[] = {
      {"heads", -1, "'heads' = -1 is outside"},
      {"layers", -1, "'layers' = -1 is outside"},
      {"head_dim", 1000000000, "'head_dim' = 1000000000 is outside"},
      {"head_dim", 31, "'head_dim' must be even"},
      {"window_frames", 1000000000, "'window_frames' = 1000000000 is outside"},
      {"sink_frames", 1000000000, "'sink_frames' = 1000000000 is outside"},
      {"tokens_per_frame", 0, "'tokens_per_frame' = 0 is outside"},
      {"frames_per_block", 99, "'frames_per_block' = 99 is outside"},
      {"heads", "2", "'heads' must be an integer"},
      {"layers", 2.5, "'layers' must be an integer"},
      {"heads", 18446744073709551615ull, "'heads' = 18446744073709551615 is outside"},
      {"window_frames", nullptr, "'window_frames' must be an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const std::string path = mutated_dump("geometry", [&](nlohmann::json* g, nlohmann::json*) { (*g)[c.field] = c.value; });
    EXPECT_REFUSED(eval_dump(path), 1, c.message);
  }
  const std::string missing = mutated_dump("missing", [](nlohmann::json* g, nlohmann::json*) { g->erase("heads"); });
  EXPECT_REFUSED(eval_dump(missing), 1, "'heads' is missing");
  const std::string not_object = mutated_dump("not_object", [](nlohmann::json* g, nlohmann::json*) { *g = {1, 2}; });
  EXPECT_REFUSED(eval_dump(not_object), 1, "wmquant.geometry is not a JSON object");
  // valid, but not the geometry the tensors were written with
  const std::string heads4 = mutated_dump("heads4", [](nlohmann::json* g, nlohmann::json*) { (*g)["heads"] = 4; });
  EXPECT_REFUSED(eval_dump(heads4), 1, "has shape");
}

TEST_F(ToolsCli, DumpEventsAreValidated) {
  struct Case {
    std::function<void(nlohmann::json*)> edit;
    const char* message;
  };
  const Case cases[] = {
      {[](nlohmann::json* e) { (*e)[0].erase(5); }, "wmquant.events[0] is not an array of 6 integers"},
      {[](nlohmann::json* e) { (*e)[0] = {0, 0}; }, "wmquant.events[0] is not an array of 6 integers"},
      {[](nlohmann::json* e) { (*e)[0] = "x"; }, "wmquant.events[0] is not an array of 6 integers"},
      {[](nlohmann::json* e) { (*e)[0][1] = "0"; }, "wmquant.events[0] 'layer' must be an integer"},
      {[](nlohmann::json* e) { (*e)[0][0] = 7; }, "wmquant.events[0] 'kind' = 7 is outside"},
      {[](nlohmann::json* e) { (*e)[0][1] = 2; }, "wmquant.events[0] 'layer' = 2 is outside"},
      {[](nlohmann::json* e) { (*e)[0][2] = -1; }, "wmquant.events[0] 'rows' = -1 is outside"},
      // rows the tensors do not have: refused by shape, before anything is sized by rows
      {[](nlohmann::json* e) { (*e)[0][2] = 1 << 30; }, "has shape"},
      {[](nlohmann::json* e) { (*e)[0][5] = 2; }, "'q_from_previous' = 2 is outside"},
      {[](nlohmann::json* e) { *e = nlohmann::json::object(); }, "wmquant.events is not a JSON array"},
      // refused by the bounded first pass, before a tree is built (a string
      // of '[' used to cost GBs)
      {[](nlohmann::json* e) { (*e)[0][0] = nlohmann::json::array({nlohmann::json::array()}); },
       "wmquant.events JSON nested too deeply"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(cases[i].message);
    const std::string path = mutated_dump("events", [&](nlohmann::json*, nlohmann::json* e) { cases[i].edit(e); });
    EXPECT_REFUSED(eval_dump(path), 1, cases[i].message);
  }
  // an append out of order: the first append of layer 0 claims frame 5
  const std::string gap = mutated_dump("gap", [](nlohmann::json*, nlohmann::json* e) {
    for (auto& ev : *e)
      if (ev[0] == 2) {
        ev[3] = 5;
        break;
      }
  });
  EXPECT_REFUSED(eval_dump(gap), 1, "appends frame 5 to layer 0 after 0 frames");
  // a format the geometry cannot take is refused before the first event is
  // replayed (it used to be said after the whole rollout): here the first
  // event is broken too, and the format's reason comes first
  const std::string broken = mutated_dump("broken", [](nlohmann::json*, nlohmann::json* e) { (*e)[0][0] = 7; });
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "eval", "--dump=" + broken, "--formats=qvg2", "--span_frames=1024"}, 20), 1,
                 "span_frames 1024 must be within");
}

TEST_F(ToolsCli, WriteErrorsFail) {
  EXPECT_REFUSED(run_tool({WMEVAL_BIN, "--model=" + model_, "--episodes=1", "--frames=2", "--threads=2", "--json=/dev/full",
                      "--md=/dev/full"}),
                 1, "write failed: /dev/full: No space left on device");
  EXPECT_REFUSED(run_tool({WMEVAL_BIN, "--model=" + model_, "--episodes=1", "--frames=2", "--threads=2", "--md=/dev/full"}), 1,
                 "write failed: /dev/full: No space left on device");
  EXPECT_REFUSED(eval_dump(dump_, {"--md=/dev/full"}), 1, "write failed: /dev/full: No space left on device");
  EXPECT_REFUSED(eval_dump(dump_, {"--json=/dev/full"}), 1, "write failed: /dev/full: No space left on device");
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "dump", "--model=" + model_, "--script=" + script_, "--out=/dev/full", "--threads=2"}),
                 1, "write failed: /dev/full: No space left on device");
  // outputs inside a directory: a link to /dev/full stands for a full disk
  const std::string gen = temp_dir() + "/gen_full";
  std::filesystem::create_directories(gen);
  std::filesystem::create_symlink("/dev/full", gen + "/summary.json");
  EXPECT_REFUSED(run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + script_, "--out=" + gen, "--threads=2"}), 1,
                 "write failed: " + gen + "/summary.json");
}

// an out-of-range quality was found by the JPEG encoder after the first
// frame, with --out already made; it is a flag error before anything runs
TEST_F(ToolsCli, GenQualityIsCheckedBeforeTheRun) {
  const std::string out = temp_dir() + "/gen_quality";
  for (const char* q : {"0", "101", "-1"}) {
    SCOPED_TRACE(q);
    EXPECT_REFUSED(run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + script_, "--out=" + out,
                             std::string("--quality=") + q}),
                   2, std::string("--quality=") + q + " must be within 1..100");
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// a run into a folder that holds an earlier, longer run's frames leaves
// exactly its own frames and summary there
TEST_F(ToolsCli, GenReplacesAnEarlierRunsFrames) {
  const std::string out = temp_dir() + "/gen_again";
  const std::string six = temp_dir() + "/six.txt";
  write_text(six, "D 0 0 *6\n");
  ASSERT_EQ(run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + six, "--out=" + out}).code, 0);
  write_text(out + "/notes.txt", "kept");
  ASSERT_EQ(run_tool({WMGEN_BIN, "--model=" + model_, "--script=" + script_, "--out=" + out}).code, 0);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(out)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"frame_00000.jpg", "frame_00001.jpg", "frame_00002.jpg", "notes.txt",
                                             "summary.json"}));
  EXPECT_EQ(nlohmann::json::parse(read_text(out + "/summary.json")).value("frames", -1), 3);
}

// wmeval: a format named twice ran twice and pooled both sessions' counts
// under its name; an output that cannot be written failed only after the
// run. Both are refused at once: the run asked for here would take hours.
TEST_F(ToolsCli, EvalChecksFormatsAndOutputsBeforeTheRun) {
  const std::vector<std::string> base = {WMEVAL_BIN, "--model=" + model_, "--episodes=1000", "--frames=100000",
                                         "--threads=2"};
  auto eval = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_tool(argv, 20);
  };
  EXPECT_REFUSED(eval({"--formats=kivi2,kivi2"}), 2, "--formats names 'kivi2' twice");
  EXPECT_REFUSED(eval({"--formats=fp16,qvg2,fp16"}), 2, "--formats names 'fp16' twice");
  const std::string missing = temp_dir() + "/no_such_dir/out";
  for (const char* flag : {"json", "md", "strip"}) {
    SCOPED_TRACE(flag);
    const std::string arg = std::string("--") + flag + "=";
    EXPECT_REFUSED(eval({arg + missing}), 2, arg + missing + ": cannot write: No such file or directory");
    EXPECT_REFUSED(eval({arg + temp_dir()}), 2, arg + temp_dir() + ": cannot write: Is a directory");
  }
  // a file made only to try the path is removed again; an existing one is left as it was
  const std::string tried = temp_dir() + "/tried.json", kept = temp_dir() + "/kept.md";
  write_text(kept, "kept\n");
  EXPECT_REFUSED(eval({"--json=" + tried, "--md=" + kept, "--strip=" + missing}), 2, "--strip=");
  EXPECT_FALSE(std::filesystem::exists(tried));
  EXPECT_EQ(read_text(kept), "kept\n");
}

// bench's --configs are read before its timings (minutes at --reps=1000), not after
TEST_F(ToolsCli, BenchConfigsAreReadBeforeTheTimings) {
  const std::string missing = temp_dir() + "/no_such_config.json";
  EXPECT_REFUSED(run_tool({WMQUANT_BIN, "bench", "--head_dims=64", "--reps=1000", "--configs=" + missing}, 20), 1,
                 "cannot open " + missing);
}

// wmeval audits the quantized formats (a full-precision shadow beside each
// cache, which the engine reserves with it) but reports what each format
// itself reserves, and its ratio to fp16's
TEST_F(ToolsCli, EvalReportsEachFormatsOwnReservation) {
  const std::string path = temp_dir() + "/eval.json";
  const ToolRun r = run_tool({WMEVAL_BIN, "--model=" + model_, "--episodes=1", "--frames=2", "--threads=2",
                              "--formats=fp16,qvg2", "--json=" + path});
  ASSERT_EQ(r.code, 0) << r.log;
  const nlohmann::json j = nlohmann::json::parse(read_text(path));
  const nlohmann::json& fp16 = j.at("formats").at("fp16");
  const nlohmann::json& qvg2 = j.at("formats").at("qvg2");
  EXPECT_TRUE(qvg2.contains("drift_top1")) << "qvg2 was audited";
  EXPECT_LT(qvg2.at("kv_reserved_bytes").get<int64_t>(), fp16.at("kv_reserved_bytes").get<int64_t>());
  EXPECT_GT(qvg2.at("compression_vs_fp16").get<double>(), 1.0);
  EXPECT_EQ(fp16.at("compression_vs_fp16").get<double>(), 1.0);
}

// a checkpoint is written beside its place and renamed there: a rewrite
// (asked for with --force) replaces it whole and leaves no temporary file
TEST_F(ToolsCli, CheckpointIsReplacedWhole) {
  const std::string dir = temp_dir() + "/rewrite";
  for (const char* seed : {"--seed=1", "--seed=2"}) {
    const ToolRun r = run_tool(
        {WMCKPT_BIN, "init", "--config=" + source("configs/tiny-test.json"), seed, "--out=" + dir, "--force"});
    ASSERT_EQ(r.code, 0) << r.log;
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
  const ToolRun check = run_tool({WMCKPT_BIN, "check", "--model=" + dir});
  EXPECT_EQ(check.code, 0) << check.log;
}

// a rewrite that fails (the file size limit stands for a full disk: the
// config fits, the weights do not) leaves the model it was to replace whole,
// not a new config beside the old weights, and no temporary file
TEST_F(ToolsCli, CheckpointWriteFailureKeepsTheModel) {
  const std::string dir = temp_dir() + "/full_disk";
  const ToolRun init =
      run_tool({WMCKPT_BIN, "init", "--config=" + source("configs/tiny-test.json"), "--seed=1", "--out=" + dir});
  ASSERT_EQ(init.code, 0) << init.log;
  const std::string config_before = read_text(dir + "/config.json");
  const std::string weights_before = read_text(dir + "/model.safetensors");
  auto other = load_model_config(source("configs/tiny-test.json"));
  ASSERT_TRUE(other.ok()) << other.status();
  other->name = "other";
  const std::string other_path = temp_dir() + "/other.json";
  write_text(other_path, model_config_to_json(*other));
  constexpr rlim_t kLimit = 16 << 10;
  ASSERT_LT(read_text(other_path).size(), kLimit);
  ASSERT_GT(weights_before.size(), kLimit);
  const ToolRun r =
      run_tool({WMCKPT_BIN, "init", "--config=" + other_path, "--seed=2", "--out=" + dir, "--force"}, 60, kLimit);
  EXPECT_REFUSED(r, 1, "File too large");
  EXPECT_NE(r.log.find("(the model in " + dir + " is unchanged)"), std::string::npos) << r.log;
  EXPECT_EQ(read_text(dir + "/config.json"), config_before);
  EXPECT_EQ(read_text(dir + "/model.safetensors"), weights_before);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
  const ToolRun check = run_tool({WMCKPT_BIN, "check", "--model=" + dir});
  EXPECT_EQ(check.code, 0) << check.log;
  // without the limit the same rewrite replaces both files
  const ToolRun again = run_tool({WMCKPT_BIN, "init", "--config=" + other_path, "--seed=2", "--out=" + dir, "--force"});
  ASSERT_EQ(again.code, 0) << again.log;
  EXPECT_EQ(read_text(dir + "/config.json"), read_text(other_path));
}

// without --force, init leaves a model it finds (a trained one, say) as it was
TEST_F(ToolsCli, CheckpointInitKeepsAnExistingModel) {
  const std::string dir = temp_dir() + "/keep";
  const std::string config = source("configs/tiny-test.json");
  ASSERT_EQ(run_tool({WMCKPT_BIN, "init", "--config=" + config, "--seed=1", "--out=" + dir}).code, 0);
  const std::string before = read_text(dir + "/model.safetensors");
  EXPECT_REFUSED(run_tool({WMCKPT_BIN, "init", "--config=" + config, "--seed=2", "--out=" + dir}), 1,
                 "already holds a model (model.safetensors); pass --force");
  EXPECT_EQ(read_text(dir + "/model.safetensors"), before);
  // a config without weights (an init that failed writing them) is no model: init completes it
  std::filesystem::remove(dir + "/model.safetensors");
  const ToolRun again = run_tool({WMCKPT_BIN, "init", "--config=" + config, "--seed=1", "--out=" + dir});
  EXPECT_EQ(again.code, 0) << again.log;
  EXPECT_EQ(read_text(dir + "/model.safetensors"), before);
}

// a copy of the tiny model (config and weights) in a fresh directory
std::string copy_of_model(const std::string& from, const std::string& name) {
  const std::string dir = temp_dir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* file : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(from + "/" + file, dir + "/" + file);
  return dir;
}

// a damaged model is refused with one message naming the file, within the
// child's time and memory limits
TEST_F(ToolsCli, CheckRefusesDamagedModelsNamingTheFile) {
  const std::string nul = copy_of_model(model_, "check_nul");
  write_text(nul + "/config.json", read_text(nul + "/config.json") + std::string("\0{}", 3));
  EXPECT_REFUSED(run_tool({WMCKPT_BIN, "check", "--model=" + nul}), 1, nul + "/config.json: holds a NUL byte");
  // a header of millions of values: refused from a count, not parsed whole
  const std::string dense = copy_of_model(model_, "check_dense");
  std::string header = "{\"a\":[0";
  for (int i = 0; i < (4 << 20); ++i) header += ",0";
  header += "]}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  write_text(dense + "/model.safetensors", file + header);
  EXPECT_REFUSED(run_tool({WMCKPT_BIN, "check", "--model=" + dense}, 20), 1,
                 dense + "/model.safetensors: header holds more than 2097152 JSON values");
}

// every prompts/*.jpg is read at start-up: one that is no JPEG file of the
// frame size stops wmserve with a message naming it, never a crash, a silent
// skip, or a decode of an image larger than a frame
TEST_F(ToolsCli, ServerRefusesBadPrompts) {
  struct Case {
    std::string name;
    std::function<void(const std::string& prompts)> make;
    std::string message;
  };
  const std::vector<uint8_t> big(2048 * 2048 * 3, 128);
  const std::string big_jpeg = *jpeg_encode(big.data(), 2048, 2048, 90);
  const std::vector<Case> cases = {
      {"loop", [](const std::string& p) { std::filesystem::create_symlink("x.jpg", p + "/x.jpg"); },
       "prompts/x.jpg: Too many levels of symbolic links"},
      {"dir", [](const std::string& p) { std::filesystem::create_directory(p + "/x.jpg"); },
       "prompts/x.jpg is a directory"},
      {"fifo", [](const std::string& p) { ASSERT_EQ(::mkfifo((p + "/x.jpg").c_str(), 0600), 0); },
       "prompts/x.jpg is not a regular file"},
      {"dangling", [](const std::string& p) { std::filesystem::create_symlink("gone.jpg", p + "/x.jpg"); },
       "prompts/x.jpg: No such file or directory"},
      {"file", [](const std::string& p) {
         std::filesystem::remove(p);
         write_text(p, "not a directory");
       }, "prompts: not a directory"},
      {"big", [&](const std::string& p) { write_text(p + "/x.jpg", big_jpeg); },
       "prompts/x.jpg: jpeg decode: image 2048x2048 is too large (a prompt must be a 32x32 JPEG"},
      {"many", [](const std::string& p) {
         for (int i = 0; i <= 1024; ++i) write_text(p + "/" + std::to_string(i) + ".jpg", "");
       }, "prompts: 1025 images; at most 1024 of 32x32 are kept"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = copy_of_model(model_, "prompts_" + c.name);
    std::filesystem::create_directories(dir + "/prompts");
    c.make(dir + "/prompts");
    EXPECT_REFUSED(run_tool({WMSERVE_BIN, "--model=" + dir, "--device=cpu", "--threads=1", "--port=0",
                             "--metrics_port=-1"},
                            20),
                   1, c.message);
  }
}

}  // namespace
}  // namespace wm
