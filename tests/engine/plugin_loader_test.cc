// Loading backend plugins: missing, foreign and mismatched libraries are
// rejected with messages that say what is wrong, and device "auto" falls
// back to the CPU when no CUDA backend can be made. Runs without a GPU
// (fake plugins built from fake_plugin.cc; the real plugin when built).
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>

#include "engine/engine.h"
#include "engine/plugin_kv_geometry.h"
#include "engine/plugin_loader.h"
#include "tests/engine/cuda_plugin_path.h"
#include "tests/engine/source_file.h"

namespace wm {
namespace {

// the fake plugins sit beside this test binary (the GPU bundle) or in the build tree
std::string fake(const std::string& name) {
  const std::string file = "libwm_fake_plugin_" + name + ".so";
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(exe.parent_path() / file)) return (exe.parent_path() / file).string();
  return std::string(WM_FAKE_PLUGIN_DIR) + "/" + file;
}

bool contains(absl::string_view text, absl::string_view part) { return text.find(part) != absl::string_view::npos; }

TEST(PluginLoader, MissingFileIsNotFoundAndNamesThePath) {
  auto p = load_plugin("/nonexistent/dir/libwm_cuda.so");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(contains(p.status().message(), "/nonexistent/dir/libwm_cuda.so")) << p.status();
}

TEST(PluginLoader, SearchListsEveryPlaceTried) {
  const auto where = plugin_candidates("", "libwm_no_such_plugin.so");
  ASSERT_EQ(where.size(), 2u);
  EXPECT_TRUE(contains(where[0], "/libwm_no_such_plugin.so"));  // beside the executable
  EXPECT_EQ(where[1], "libwm_no_such_plugin.so");              // the loader's own search
  EXPECT_EQ(plugin_candidates("/x/y.so", "z.so"), std::vector<std::string>{"/x/y.so"});
  auto p = find_plugin("", "libwm_no_such_plugin.so");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(contains(p.status().message(), where[0])) << p.status();
}

TEST(PluginLoader, RejectsALibraryWithoutTheEntryPoint) {
  auto p = load_plugin(fake("noentry"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(p.status().message(), "wm_plugin_entry")) << p.status();
}

TEST(PluginLoader, RejectsAnotherAbiVersion) {
  auto p = load_plugin(fake("badabi"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(p.status().message(), "ABI version 999")) << p.status();
  EXPECT_TRUE(contains(p.status().message(), "rebuild")) << p.status();
  // a found but rejected plugin stops the search with its own reason
  auto f = find_plugin(fake("badabi"), kCudaPluginFile);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PluginLoader, RejectsATableOfAnotherSize) {
  auto p = load_plugin(fake("badsize"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(p.status().message(), "bytes")) << p.status();
}

TEST(PluginLoader, NoDeviceIsUnavailable) {
  auto p = load_plugin(fake("nodevice"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_STREQ((*p)->api().name, "fake");
  PluginBackendOptions o;
  o.path = fake("nodevice");
  auto b = make_plugin_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(contains(b.status().message(), "no device here")) << b.status();
}

EngineOptions tiny(const std::string& device, const std::string& plugin) {
  EngineOptions o;
  o.random_weights = true;
  o.config_path = test::source_file("configs/tiny-test.json");
  o.threads = 1;
  o.device = device;
  o.cuda_plugin = plugin;
  return o;
}

// every field of a cache's geometry and format options crosses the ABI and
// comes back as it was (the plugin codes the span formats with them)
TEST(PluginKvGeometry, GeometryAndOptionsSurviveTheAbi) {
  KvGeometry g;
  g.layers = 30;
  g.heads = 12;
  g.head_dim = 128;
  g.tokens_per_frame = 880;
  g.window_frames = 60;
  g.sink_frames = 2;
  g.frames_per_block = 3;
  KvFormatOptions o;  // every field off its default
  o.kivi_group = 64;
  o.kivi_residual = 128;
  o.span_frames = 1;
  o.centroids = 17;
  o.tokens_per_centroid = 33;
  o.block = 32;
  o.kmeans_iters = 9;
  o.kmeans_seed = 0x123456789abcdefull;
  o.quantize_sinks = true;
  o.qsac = false;
  o.psac = false;
  o.psac_rank = 7;
  o.psac_bits = 4;
  o.psac_refresh_frames = 5;
  o.qsac_candidates = 2;
  o.qsac_weight_floor = 0.25f;
  o.quantize_keys = false;
  o.quantize_values = false;
  const WmKvGeometry c = to_plugin_kv_geometry(g, o);
  const KvGeometry g2 = kv_geometry_of(c);
  EXPECT_EQ(std::make_tuple(g2.layers, g2.heads, g2.head_dim, g2.tokens_per_frame, g2.window_frames, g2.sink_frames,
                            g2.frames_per_block),
            std::make_tuple(30, 12, 128, 880, 60, 2, 3));
  const KvFormatOptions o2 = kv_format_options_of(c);
  EXPECT_EQ(std::make_tuple(o2.kivi_group, o2.kivi_residual, o2.span_frames, o2.centroids, o2.tokens_per_centroid,
                            o2.block, o2.kmeans_iters, o2.kmeans_seed, o2.quantize_sinks, o2.qsac, o2.psac),
            std::make_tuple(o.kivi_group, o.kivi_residual, o.span_frames, o.centroids, o.tokens_per_centroid, o.block,
                            o.kmeans_iters, o.kmeans_seed, o.quantize_sinks, o.qsac, o.psac));
  EXPECT_EQ(std::make_tuple(o2.psac_rank, o2.psac_bits, o2.psac_refresh_frames, o2.qsac_candidates,
                            o2.qsac_weight_floor, o2.quantize_keys, o2.quantize_values),
            std::make_tuple(o.psac_rank, o.psac_bits, o.psac_refresh_frames, o.qsac_candidates, o.qsac_weight_floor,
                            o.quantize_keys, o.quantize_values));
  // and the defaults stay the defaults
  const KvFormatOptions d = kv_format_options_of(to_plugin_kv_geometry(g, {}));
  const KvFormatOptions def;
  EXPECT_EQ(std::make_tuple(d.centroids, d.block, d.kmeans_seed, d.qsac, d.psac, d.psac_bits, d.qsac_weight_floor),
            std::make_tuple(def.centroids, def.block, def.kmeans_seed, def.qsac, def.psac, def.psac_bits,
                            def.qsac_weight_floor));
}

TEST(EngineDevice, AutoFallsBackToTheCpuAndSaysWhy) {
  for (const std::string& plugin : {fake("nodevice"), std::string("/nonexistent/libwm_cuda.so"), fake("badabi")}) {
    auto e = Engine::create(tiny("auto", plugin));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->device(), "cpu");
    EXPECT_TRUE(contains((*e)->device_note(), "CPU")) << (*e)->device_note();
    EXPECT_EQ((*e)->device_memory().kv_pool_capacity, 0);
    // and it still serves
    SessionOptions so;
    so.seed = 1;
    auto id = (*e)->open_session(so);
    EXPECT_TRUE(id.ok()) << id.status();
  }
}

TEST(EngineDevice, CudaWithoutAUsablePluginIsAnError) {
  auto nodev = Engine::create(tiny("cuda", fake("nodevice")));
  EXPECT_EQ(nodev.status().code(), absl::StatusCode::kUnavailable) << nodev.status();
  auto missing = Engine::create(tiny("cuda", "/nonexistent/libwm_cuda.so"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  auto bad = Engine::create(tiny("cuda", fake("badabi")));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
  auto unknown = Engine::create(tiny("tpu", ""));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  auto cpu = Engine::create(tiny("cpu", "/nonexistent/libwm_cuda.so"));  // the plugin is not even looked at
  EXPECT_TRUE(cpu.ok()) << cpu.status();
}

#ifdef WM_CUDA_PLUGIN_PATH
// the real plugin loads and passes the version check on any machine; it
// makes a backend only where there is a GPU
TEST(PluginLoader, RealCudaPluginLoads) {
  // the build tree's, else the one beside this binary (the GPU bundle)
  const std::string path = test::cuda_plugin_path();
  auto p = find_plugin(path, "libwm_cuda.so");
  if (path.empty() && absl::IsNotFound(p.status())) GTEST_SKIP() << "not built: " << WM_CUDA_PLUGIN_PATH;
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_STREQ((*p)->api().name, "cuda");
  EXPECT_EQ((*p)->api().abi_version, WM_PLUGIN_ABI_VERSION);
  WmPluginDeviceInfo info{};
  char err[512] = {0};
  const int32_t code = (*p)->api().probe(0, &info, err, sizeof(err));
  if (code != WM_OK) {
    EXPECT_EQ(code, WM_UNAVAILABLE) << err;
    std::printf("no GPU here: %s\n", err);
  } else {
    std::printf("GPU: %s, sm_%d%d, %d SMs\n", info.name, info.sm_major, info.sm_minor, info.multiprocessors);
  }
}
#endif

}  // namespace
}  // namespace wm
