// wmquant: evaluation and benchmarks of the KV-cache formats (docs/QUANT.md).
//
//   wmquant eval  --model DIR --script F [--seed S] [--formats a,b,...] [--json F] [--md F]
//   wmquant eval  --dump F [--formats ...]             evaluate a dump instead of running a model
//   wmquant dump  --model DIR --script F --out F.safetensors [--dump_dtype f32|f16]
//   wmquant bench [--head_dims 64,128] [--reps N] [--configs a.json,b.json] [--md F] [--json F]
//
// A random-weight model instead of a checkpoint: --config F.json --random_seed S
// [--layers N] (N overrides the config's layer count, e.g. 2 layers of the
// Matrix-Game-2 shape to keep a CPU run short).
//
// eval is teacher-forced: the engine runs the fp32 rollout; every call it
// makes on the session's cache (queries, attention, appended K/V) is
// replayed into every candidate format, and each candidate's attention is
// compared with full precision on the same queries over the same history
// (quant/kv_replay.h, quant/probe.h). Formats never feed back into the
// rollout, so every format sees exactly the same data.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cli.h"
#include "common/half.h"
#include "common/image_io.h"
#include "common/json_scan.h"
#include "common/status_macros.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "quant/kv_cases.h"
#include "quant/kv_replay.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json + model.safetensors)");
ABSL_FLAG(std::string, config, "", "with random weights: the model config");
ABSL_FLAG(uint64_t, random_seed, 1, "with --config: the weights' seed");
ABSL_FLAG(int, layers, 0, "with --config: override the layer count, 1..256 (0: keep)");
ABSL_FLAG(std::string, script, "", "action script (one action per frame)");
ABSL_FLAG(uint64_t, seed, 0, "session seed");
ABSL_FLAG(int, frames, 0, "stop after this many frames (0: the whole script)");
ABSL_FLAG(std::string, formats,
          "fp16,kivi2,kivi2-k,kivi2-v,qvg2,qvg2-k,qvg2-v,quantwm2,quantwm2-k,quantwm2-v,quantwm2-qsac,quantwm2-psac",
          "formats to evaluate");
ABSL_FLAG(int, queries, 16, "probed queries per head and attention call");
ABSL_FLAG(bool, fused, false, "also compare every candidate's fused attention output on every row");
ABSL_FLAG(std::string, dump, "", "eval: read this dump instead of running a model");
ABSL_FLAG(std::string, out, "", "dump: output file");
ABSL_FLAG(std::string, dump_dtype, "f32", "dump: f32 or f16");
ABSL_FLAG(std::string, json, "", "write results as JSON");
ABSL_FLAG(std::string, md, "", "write results as Markdown");
ABSL_FLAG(int, threads, 0, "CPU threads, 0..1024 (0: all cores)");
// format options (KvFormatOptions)
ABSL_FLAG(int, span_frames, 0, "frames per span (0: one block)");
ABSL_FLAG(int, centroids, 256, "most centroids per span");
ABSL_FLAG(int, tokens_per_centroid, 64, "at most one centroid per this many tokens");
ABSL_FLAG(int, block, 64, "channels per residual scale: 16, 32, 64 or 128 (capped at head_dim)");
ABSL_FLAG(int, psac_bits, 8, "PSAC coefficient bits (8 or 4)");
ABSL_FLAG(int, psac_refresh_frames, 16, "PSAC basis refresh interval in frames");
ABSL_FLAG(bool, quantize_sinks, false, "quantize sink frames too");
ABSL_FLAG(int, kivi_group, 32, "KIVI group G");
ABSL_FLAG(int, kivi_residual, 32, "KIVI residual R");
ABSL_FLAG(int, kmeans_iters, 4, "k-means Lloyd iterations");
// bench
ABSL_FLAG(std::string, head_dims, "64,128", "bench: head dims within 8..512 that every format takes (with the default --kivi_group and --block: 32 or a multiple of 64)");
ABSL_FLAG(int, reps, 9, "bench: timed repetitions (median)");
ABSL_FLAG(std::string, configs, "configs/default.json,configs/mg2-shape.json", "bench: configs for bytes per session");

namespace wm {
namespace {

using Clock = std::chrono::steady_clock;

int fail(const absl::Status& st) {
  std::fprintf(stderr, "wmquant: %s\n", st.ToString().c_str());
  return 1;
}

// prints the Markdown and writes --json / --md when asked; the exit code
int print_and_write(const nlohmann::json& out, const std::string& md) {
  std::printf("%s", md.c_str());
  if (auto st = flush_stdout(); !st.ok()) return fail(st);
  if (!absl::GetFlag(FLAGS_json).empty()) {
    const std::string s = out.dump(2) + "\n";
    if (auto st = write_file(absl::GetFlag(FLAGS_json), s.data(), s.size()); !st.ok()) return fail(st);
  }
  if (!absl::GetFlag(FLAGS_md).empty()) {
    if (auto st = write_file(absl::GetFlag(FLAGS_md), md.data(), md.size()); !st.ok()) return fail(st);
  }
  return 0;
}

// events a dump may list: a real one has a few per frame and layer (a
// 300-frame rollout of 30 layers, some 30k); the bound keeps its parsed
// metadata near 150 MB at most
constexpr int64_t kMaxDumpEvents = int64_t{1} << 20;
constexpr int kMaxBenchHeadDim = 512;  // kivi2's limit

absl::Status flag_in_range(absl::string_view name, int64_t value, int64_t lo, int64_t hi, absl::string_view note = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, " must be within ", lo, "..", hi, note));
}

absl::Status flag_one_of(absl::string_view name, int value, std::initializer_list<int> allowed) {
  for (int a : allowed)
    if (value == a) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, " must be one of ", absl::StrJoin(allowed, ", ")));
}

absl::StatusOr<std::vector<int>> parse_head_dims(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int hd = 0;
    if (!absl::SimpleAtoi(s, &hd) || hd < 8 || hd > kMaxBenchHeadDim || hd % 8 != 0)
      return absl::InvalidArgumentError(absl::StrCat("--head_dims: '", s, "' is not a multiple of 8 within 8..",
                                                     kMaxBenchHeadDim));
    out.push_back(hd);
  }
  if (out.empty()) return absl::InvalidArgumentError("--head_dims names no head dim");
  return out;
}

KvFormatOptions format_options() {
  KvFormatOptions o;
  o.span_frames = absl::GetFlag(FLAGS_span_frames);
  o.centroids = absl::GetFlag(FLAGS_centroids);
  o.tokens_per_centroid = absl::GetFlag(FLAGS_tokens_per_centroid);
  o.block = absl::GetFlag(FLAGS_block);
  o.psac_bits = absl::GetFlag(FLAGS_psac_bits);
  o.psac_refresh_frames = absl::GetFlag(FLAGS_psac_refresh_frames);
  o.quantize_sinks = absl::GetFlag(FLAGS_quantize_sinks);
  o.kivi_group = absl::GetFlag(FLAGS_kivi_group);
  o.kivi_residual = absl::GetFlag(FLAGS_kivi_residual);
  o.kmeans_iters = absl::GetFlag(FLAGS_kmeans_iters);
  return o;
}

// every numeric flag against its range, before anything is allocated: the
// format options also bound how long the worst-case byte count replays
absl::Status check_flags() {
  WM_RETURN_IF_ERROR(flag_in_range("layers", absl::GetFlag(FLAGS_layers), 0, 256, " (0: the config's)"));
  WM_RETURN_IF_ERROR(flag_in_range("frames", absl::GetFlag(FLAGS_frames), 0, 1000000, " (0: the whole script)"));
  WM_RETURN_IF_ERROR(flag_in_range("queries", absl::GetFlag(FLAGS_queries), 1, 4096));
  WM_RETURN_IF_ERROR(flag_in_range("reps", absl::GetFlag(FLAGS_reps), 1, 1000));
  WM_RETURN_IF_ERROR(flag_in_range("span_frames", absl::GetFlag(FLAGS_span_frames), 0, 1024, " (0: one block)"));
  WM_RETURN_IF_ERROR(flag_in_range("centroids", absl::GetFlag(FLAGS_centroids), 1, 256));
  WM_RETURN_IF_ERROR(flag_in_range("tokens_per_centroid", absl::GetFlag(FLAGS_tokens_per_centroid), 1, 1 << 20));
  WM_RETURN_IF_ERROR(flag_one_of("block", absl::GetFlag(FLAGS_block), {16, 32, 64, 128}));
  WM_RETURN_IF_ERROR(flag_one_of("psac_bits", absl::GetFlag(FLAGS_psac_bits), {4, 8}));
  WM_RETURN_IF_ERROR(
      flag_in_range("psac_refresh_frames", absl::GetFlag(FLAGS_psac_refresh_frames), 1, kMaxPsacRefreshFrames));
  WM_RETURN_IF_ERROR(flag_one_of("kivi_group", absl::GetFlag(FLAGS_kivi_group), {32, 64, 128}));
  const int group = absl::GetFlag(FLAGS_kivi_group), residual = absl::GetFlag(FLAGS_kivi_residual);
  WM_RETURN_IF_ERROR(flag_in_range("kivi_residual", residual, group, kMaxKiviResidual, " and a multiple of --kivi_group"));
  if (residual % group != 0)
    return absl::InvalidArgumentError(absl::StrCat("--kivi_residual=", residual, " is not a multiple of --kivi_group=", group));
  WM_RETURN_IF_ERROR(flag_in_range("kmeans_iters", absl::GetFlag(FLAGS_kmeans_iters), 0, kMaxKmeansIters));
  // one source of K/V: the flag not used would be ignored without a word
  if (!absl::GetFlag(FLAGS_model).empty() && !absl::GetFlag(FLAGS_config).empty())
    return absl::InvalidArgumentError(
        "--model and --config exclude each other: --model runs a checkpoint, --config random weights of a config");
  const bool model_or_config = !absl::GetFlag(FLAGS_model).empty() || !absl::GetFlag(FLAGS_config).empty();
  if (!absl::GetFlag(FLAGS_dump).empty() && model_or_config)
    return absl::InvalidArgumentError("--dump replays a dump: --model and --config do not apply to it");
  std::vector<absl::string_view> formats;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_formats), ',', absl::SkipEmpty())) {
    if (!kv_format_known(f))
      return absl::InvalidArgumentError(absl::StrCat("--formats: unknown cache format '", f, "'; known: ",
                                                     absl::StrJoin(kv_format_variants(), ", ")));
    if (std::find(formats.begin(), formats.end(), f) != formats.end())
      return absl::InvalidArgumentError(absl::StrCat("--formats names '", f, "' twice"));
    formats.push_back(f);
  }
  if (formats.empty()) return absl::InvalidArgumentError("--formats names no cache format");
  const std::string dtype = absl::GetFlag(FLAGS_dump_dtype);
  if (dtype != "f32" && dtype != "f16")
    return absl::InvalidArgumentError(absl::StrCat("--dump_dtype=", dtype, " must be f32 or f16"));
  return parse_head_dims(absl::GetFlag(FLAGS_head_dims)).status();
}

// bench: every head dim suits every format it times (kivi2's group and the
// span formats' block divide it), checked before any timing rather than
// after the dims before it
absl::Status check_bench_head_dims() {
  auto head_dims = parse_head_dims(absl::GetFlag(FLAGS_head_dims));
  if (!head_dims.ok()) return head_dims.status();
  for (const int hd : *head_dims)
    for (const KvCase& c : kv_bench_cases(hd))
      if (auto st = kv_format_check(c.format, c.geometry, format_options()); !st.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("--head_dims: ", hd, " does not suit ", st.message()));
  return absl::OkStatus();
}

nlohmann::json geometry_json(const KvGeometry& g) {
  return {{"layers", g.layers},
          {"heads", g.heads},
          {"head_dim", g.head_dim},
          {"tokens_per_frame", g.tokens_per_frame},
          {"window_frames", g.window_frames},
          {"sink_frames", g.sink_frames},
          {"frames_per_block", g.frames_per_block}};
}

// a dump's geometry, every field checked against the bounds a model config
// has (engine/model_config.cc): a dump is a file from anywhere
absl::StatusOr<KvGeometry> geometry_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("wmquant.geometry is not a JSON object");
  auto get = [&](const char* field, int lo, int hi, int* out) -> absl::Status {
    if (!j.contains(field)) return absl::InvalidArgumentError(absl::StrCat("wmquant.geometry: '", field, "' is missing"));
    const nlohmann::json& v = j.at(field);
    if (!v.is_number_integer())
      return absl::InvalidArgumentError(absl::StrCat("wmquant.geometry: '", field, "' must be an integer"));
    // as int64: a uint64 above INT64_MAX reads negative, and fails the range too
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      return absl::InvalidArgumentError(
          absl::StrCat("wmquant.geometry: '", field, "' = ", v.dump(), " is outside [", lo, ", ", hi, "]"));
    *out = static_cast<int>(x);
    return absl::OkStatus();
  };
  KvGeometry g;
  WM_RETURN_IF_ERROR(get("layers", 1, 256, &g.layers));
  WM_RETURN_IF_ERROR(get("heads", 1, 256, &g.heads));
  WM_RETURN_IF_ERROR(get("head_dim", 2, 256, &g.head_dim));
  if (g.head_dim % 2 != 0) return absl::InvalidArgumentError("wmquant.geometry: 'head_dim' must be even");
  WM_RETURN_IF_ERROR(get("tokens_per_frame", 1, 2048 * 2048, &g.tokens_per_frame));
  WM_RETURN_IF_ERROR(get("window_frames", 1, 1024, &g.window_frames));
  WM_RETURN_IF_ERROR(get("sink_frames", 0, 1000, &g.sink_frames));
  WM_RETURN_IF_ERROR(get("frames_per_block", 1, 16, &g.frames_per_block));
  if (g.window_frames < g.frames_per_block)
    return absl::InvalidArgumentError("wmquant.geometry: 'window_frames' must be >= 'frames_per_block'");
  return g;
}

// one event of a dump: [kind, layer, rows, first_frame, frames, q_from_previous], all integers
absl::StatusOr<KvEvent> event_from_json(const nlohmann::json& j, const KvGeometry& g) {
  if (!j.is_array() || j.size() != 6)
    return absl::InvalidArgumentError("is not an array of 6 integers [kind, layer, rows, first_frame, frames, q_from_previous]");
  static const char* const kFields[] = {"kind", "layer", "rows", "first_frame", "frames", "q_from_previous"};
  const int64_t hi[] = {2, g.layers - 1, int64_t{1} << 30, int64_t{1} << 40, 1 << 20, 1};
  int64_t v[6];
  for (size_t f = 0; f < 6; ++f) {
    if (!j[f].is_number_integer()) return absl::InvalidArgumentError(absl::StrCat("'", kFields[f], "' must be an integer"));
    v[f] = j[f].get<int64_t>();
    if (v[f] < 0 || v[f] > hi[f])
      return absl::InvalidArgumentError(absl::StrCat("'", kFields[f], "' = ", j[f].dump(), " is outside [0, ", hi[f], "]"));
  }
  KvEvent e;
  e.kind = static_cast<KvEvent::Kind>(v[0]);
  e.layer = static_cast<int>(v[1]);
  e.rows = static_cast<int>(v[2]);
  e.first_frame = v[3];
  e.frames = static_cast<int>(v[4]);
  e.q_from_previous = v[5] != 0;
  return e;
}
struct Rollout {
  std::string model;
  KvGeometry geometry;
  int64_t frames = 0;
  double seconds = 0;
};

// runs the fp32 engine rollout of the script, reporting every cache call to `observer`
absl::StatusOr<Rollout> run_model(KvObserver* observer, std::function<absl::Status(const KvGeometry&)> on_geometry) {
  EngineOptions eo;
  eo.threads = absl::GetFlag(FLAGS_threads);
  eo.kv_budget_bytes = int64_t{1} << 42;
  std::string tmp_config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    eo.random_weights = true;
    eo.random_seed = absl::GetFlag(FLAGS_random_seed);
    eo.config_path = absl::GetFlag(FLAGS_config);
    if (absl::GetFlag(FLAGS_layers) > 0) {
      auto cfg = load_model_config(eo.config_path);
      if (!cfg.ok()) return cfg.status();
      cfg->layers = absl::GetFlag(FLAGS_layers);
      cfg->name = absl::StrCat(cfg->name, "-", cfg->layers, "layers");
      tmp_config = (std::filesystem::temp_directory_path() / absl::StrCat("wmquant-", getpid(), ".json")).string();
      const std::string text = model_config_to_json(*cfg);
      if (auto st = write_file(tmp_config, text.data(), text.size()); !st.ok()) return st;
      eo.config_path = tmp_config;
    }
  } else {
    if (absl::GetFlag(FLAGS_model).empty()) return absl::InvalidArgumentError("--model or --config is required");
    eo.model_dir = absl::GetFlag(FLAGS_model);
  }
  auto engine = Engine::create(eo);
  if (!tmp_config.empty()) std::filesystem::remove(tmp_config);
  if (!engine.ok()) return engine.status();
  const ModelConfig& cfg = (*engine)->config();
  if (absl::GetFlag(FLAGS_script).empty()) return absl::InvalidArgumentError("--script is required");
  auto actions = load_action_script(absl::GetFlag(FLAGS_script), cfg.actions);
  if (!actions.ok()) return actions.status();
  if (actions->empty()) return absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_script), ": the script has no actions"));
  Rollout r;
  r.model = cfg.name;
  r.geometry = (*engine)->kv_geometry();
  WM_RETURN_IF_ERROR(on_geometry(r.geometry));
  SessionOptions so;
  so.seed = absl::GetFlag(FLAGS_seed);
  so.cache_format = "fp32";
  so.wrap_cache = [observer](std::unique_ptr<KvCache> c) { return make_observed_cache(std::move(c), observer); };
  auto id = (*engine)->open_session(so);
  if (!id.ok()) return id.status();
  const int B = cfg.frames_per_block;
  size_t total = actions->size();
  if (absl::GetFlag(FLAGS_frames) > 0) total = std::min(total, static_cast<size_t>(absl::GetFlag(FLAGS_frames)));
  const auto t0 = Clock::now();
  for (size_t i = 0; i < total; i += B) {
    StepRequest req;
    req.session = *id;
    for (int b = 0; b < B; ++b) req.actions.push_back((*actions)[std::min(actions->size() - 1, i + b)]);
    auto res = (*engine)->step(std::span<const StepRequest>(&req, 1));
    if (!res.ok()) return res.status();
    r.frames += B;
    std::fprintf(stderr, "\rwmquant: frame %lld/%zu", static_cast<long long>(r.frames), total);
  }
  std::fprintf(stderr, "\n");
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

// ---- dumps ----

absl::Status write_dump(const std::string& path, KvEventLog& log, const Rollout& r, bool f16) {
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<uint16_t>> halves;
  nlohmann::json events = nlohmann::json::array();
  const KvGeometry& g = log.geometry();
  size_t count = 0;
  for (const KvEvent& e : log.events()) count += (!e.q.empty()) + (!e.k.empty()) + (!e.v.empty());
  halves.reserve(count);
  for (size_t i = 0; i < log.events().size(); ++i) {
    const KvEvent& e = log.events()[i];
    events.push_back({static_cast<int>(e.kind), e.layer, e.rows, e.first_frame, e.frames, e.q_from_previous ? 1 : 0});
    auto add = [&](const char* what, const std::vector<float>& data) {
      if (data.empty()) return;
      TensorToWrite t;
      t.name = absl::StrCat("e", i, ".", what);
      t.shape = {e.rows, g.heads, g.head_dim};
      if (f16) {
        halves.emplace_back(data.size());
        for (size_t j = 0; j < data.size(); ++j) halves.back()[j] = f32_to_f16(data[j]);
        t.dtype = DType::f16;
        t.data = halves.back().data();
      } else {
        t.dtype = DType::f32;
        t.data = data.data();
      }
      tensors.push_back(std::move(t));
    };
    add("q", e.q);
    add("k", e.k);
    add("v", e.v);
  }
  std::map<std::string, std::string> meta;
  meta["wmquant.geometry"] = geometry_json(g).dump();
  meta["wmquant.events"] = events.dump();
  meta["wmquant.model"] = r.model;
  meta["wmquant.frames"] = std::to_string(r.frames);
  return write_safetensors(path, tensors, meta);
}

// replays a dump into `observer`, one event at a time
absl::StatusOr<Rollout> replay_dump(const std::string& path, KvObserver* observer,
                                    std::function<absl::Status(const KvGeometry&)> on_geometry) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return file.status();
  const auto& meta = (*file)->metadata();
  if (!meta.count("wmquant.geometry") || !meta.count("wmquant.events"))
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a wmquant dump (metadata missing)"));
  Rollout r;
  // bounded before a tree is built (a string of '[' cost GBs): the geometry
  // is one flat object, the events an array of 6-integer arrays
  const auto bounded = [&](const char* key, JsonLimits limits) -> absl::Status {
    const absl::Status st = scan_json(meta.at(key), limits, key);
    return st.ok() ? st : absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  };
  WM_RETURN_IF_ERROR(bounded("wmquant.geometry", {256, 2}));
  WM_RETURN_IF_ERROR(bounded("wmquant.events", {7 * kMaxDumpEvents + 1, 2}));
  const nlohmann::json geometry = nlohmann::json::parse(meta.at("wmquant.geometry"), nullptr, /*allow_exceptions=*/false);
  const nlohmann::json events = nlohmann::json::parse(meta.at("wmquant.events"), nullptr, /*allow_exceptions=*/false);
  if (geometry.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": wmquant.geometry is not JSON"));
  if (events.is_discarded() || !events.is_array())
    return absl::InvalidArgumentError(absl::StrCat(path, ": wmquant.events is not a JSON array"));
  auto geo = geometry_from_json(geometry);
  if (!geo.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", geo.status().message()));
  r.geometry = *geo;
  r.model = meta.count("wmquant.model") ? meta.at("wmquant.model") : "";
  if (auto st = on_geometry(r.geometry); !st.ok())
    return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  const KvGeometry& g = r.geometry;
  KvEvent last_observe;
  std::vector<int64_t> appended(static_cast<size_t>(g.layers), 0);  // frames per layer so far
  for (size_t i = 0; i < events.size(); ++i) {
    auto parsed = event_from_json(events[i], g);
    if (!parsed.ok())
      return absl::InvalidArgumentError(absl::StrCat(path, ": wmquant.events[", i, "] ", parsed.status().message()));
    KvEvent e = std::move(*parsed);
    const std::vector<int64_t> shape = {e.rows, g.heads, g.head_dim};
    auto read = [&](const char* what, std::vector<float>* out) -> absl::Status {
      const std::string name = absl::StrCat("e", i, ".", what);
      if ((*file)->find(name) == nullptr) return absl::OkStatus();
      // the shape first: rows come from the metadata, the values from the file
      WM_RETURN_IF_ERROR((*file)->check_f32(name, shape));
      out->resize(static_cast<size_t>(e.rows) * g.heads * g.head_dim);
      WM_RETURN_IF_ERROR((*file)->read_f32(name, shape, out->data()));
      // the fp32 reference is the measure: a non-finite value in it leaves
      // nothing to compare against (every format would score as exact), so
      // such a dump is refused, as a checkpoint with non-finite weights is
      const auto bad = std::find_if(out->begin(), out->end(), [](float x) { return !std::isfinite(x); });
      if (bad != out->end())
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' holds a non-finite value (", *bad,
                                                       ") at index ", bad - out->begin(),
                                                       "; wmquant eval needs finite queries, keys and values"));
      return absl::OkStatus();
    };
    if (auto st = read("q", &e.q); !st.ok()) return st;
    if (auto st = read("k", &e.k); !st.ok()) return st;
    if (auto st = read("v", &e.v); !st.ok()) return st;
    const size_t need = static_cast<size_t>(e.rows) * g.heads * g.head_dim;
    switch (e.kind) {
      case KvEvent::Kind::observe:
        if (e.q.size() != need) return absl::InvalidArgumentError(absl::StrCat(path, ": event ", i, " lacks q"));
        observer->on_observe(e.layer, e.q.data(), e.rows);
        last_observe = std::move(e);
        break;
      case KvEvent::Kind::attend: {
        const std::vector<float>& q = e.q_from_previous ? last_observe.q : e.q;
        if (q.size() != need || e.k.size() != need || e.v.size() != need)
          return absl::InvalidArgumentError(absl::StrCat(path, ": event ", i, " is incomplete"));
        observer->on_attend(e.layer, q.data(), e.k.data(), e.v.data(), e.rows, nullptr);
        break;
      }
      case KvEvent::Kind::append:
        if (e.frames <= 0 || static_cast<int64_t>(e.frames) * g.tokens_per_frame != e.rows || e.k.size() != need ||
            e.v.size() != need)
          return absl::InvalidArgumentError(absl::StrCat(path, ": event ", i, " is incomplete"));
        if (e.first_frame != appended[static_cast<size_t>(e.layer)])
          return absl::InvalidArgumentError(absl::StrCat(path, ": event ", i, " appends frame ", e.first_frame, " to layer ",
                                                         e.layer, " after ", appended[static_cast<size_t>(e.layer)],
                                                         " frames"));
        appended[static_cast<size_t>(e.layer)] += e.frames;
        observer->on_append(e.layer, e.k.data(), e.v.data(), e.first_frame, e.frames);
        r.frames = std::max<int64_t>(r.frames, e.first_frame + e.frames);
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(path, ": event ", i, " has an unknown kind"));
    }
  }
  return r;
}

// ---- eval ----

double rmse(const DriftStats& s) { return std::sqrt(s.logit_sq_err_sum / std::max<int64_t>(1, s.logits)); }
double mean_or_zero(double sum, int64_t n) { return n > 0 ? sum / static_cast<double>(n) : 0.0; }

nlohmann::json bytes_json(const KvBytes& b) {
  return {{"total", b.total()}, {"fp_values", b.fp_values}, {"codes", b.codes}, {"scales", b.scales},
          {"zeros", b.zeros},   {"centroids", b.centroids}, {"ids", b.ids},     {"bases", b.bases},
          {"coeffs", b.coeffs}};
}

int eval_main() {
  std::unique_ptr<KvEvaluator> ev;
  KvEvaluator::Options eo;
  eo.queries_per_head = absl::GetFlag(FLAGS_queries);
  eo.fused = absl::GetFlag(FLAGS_fused);
  const KvFormatOptions fo = format_options();
  std::vector<std::string> formats = absl::StrSplit(absl::GetFlag(FLAGS_formats), ',', absl::SkipEmpty());
  auto make = [&](const KvGeometry& g) -> absl::Status {
    // as a config's weights are checked against memory before they are
    // allocated: a geometry from a file can ask for any amount
    const int64_t need = kv_evaluation_bytes(g, formats, fo);
    const MemoryLimit limit = memory_limit();
    const int64_t have = limit.bytes;
    if (have > 0 && need > have) {
      constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "evaluating %s over %d layers x %d heads x %d, %d tokens/frame, window %d + %d sink frames needs at least "
          "%.1f GiB once the window is full, more than the %.1f GiB of memory this process may use (%s)",
          absl::StrJoin(formats, ","), g.layers, g.heads, g.head_dim, g.tokens_per_frame, g.window_frames,
          g.sink_frames, static_cast<double>(need) / kGiB, static_cast<double>(have) / kGiB, limit.what));
    }
    ev = std::make_unique<KvEvaluator>(g, eo);
    // a format the geometry cannot take (--span_frames past the window,
    // say) stops the run before its rollout, not after it
    for (const auto& f : formats) WM_RETURN_IF_ERROR(ev->add(f, fo));
    return absl::OkStatus();
  };
  struct Forward final : KvObserver {
    std::unique_ptr<KvEvaluator>* ev;
    void on_observe(int l, const float* q, int n) override { (*ev)->on_observe(l, q, n); }
    void on_attend(int l, const float* q, const float* k, const float* v, int n, const float* o) override {
      (*ev)->on_attend(l, q, k, v, n, o);
    }
    void on_append(int l, const float* k, const float* v, int64_t f, int c) override { (*ev)->on_append(l, k, v, f, c); }
  } fwd;
  fwd.ev = &ev;
  const auto t0 = Clock::now();
  absl::StatusOr<Rollout> r = absl::GetFlag(FLAGS_dump).empty() ? run_model(&fwd, make)
                                                                 : replay_dump(absl::GetFlag(FLAGS_dump), &fwd, make);
  if (!r.ok()) return fail(r.status());
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const KvGeometry& g = r->geometry;
  const int64_t fp16_peak = ev->reference_fp16_peak().total();
  const int64_t fp16_reserved = kv_format_max_bytes("fp16", g, fo);

  nlohmann::json out;
  out["model"] = r->model;
  out["source"] = absl::GetFlag(FLAGS_dump).empty() ? "model" : absl::GetFlag(FLAGS_dump);
  out["geometry"] = geometry_json(g);
  out["frames"] = r->frames;
  out["attention_calls"] = ev->attend_calls();
  out["queries_per_head"] = eo.queries_per_head;
  out["seconds"] = seconds;
  out["fp16_peak_bytes"] = fp16_peak;
  nlohmann::json rows = nlohmann::json::array();
  std::string md = absl::StrFormat(
      "model `%s`, %d layers x %d heads x %d, %d tokens/frame, window %d + %d sink, %lld frames, %lld attention calls, "
      "%d probed queries per head and call\n\n",
      r->model, g.layers, g.heads, g.head_dim, g.tokens_per_frame, g.window_frames, g.sink_frames,
      static_cast<long long>(r->frames), static_cast<long long>(ev->attend_calls()), eo.queries_per_head);
  md += "| format | top-1 drift | top-8 overlap | logit RMSE | output rel. err |";
  if (eo.fused) md += " fused output rel. err |";
  md += " peak bytes | ratio vs fp16 | bits/value | reserved bytes | drift per layer |\n|---|---|---|---|---|";
  if (eo.fused) md += "---|";
  md += "---|---|---|---|---|\n";
  for (const auto& c : ev->candidates()) {
    const DriftStats s = c.overall();
    nlohmann::json j;
    j["format"] = c.format;
    if (!c.error.empty()) j["error"] = c.error;
    j["queries"] = s.queries;
    j["drift"] = s.drift();
    j["topk_overlap"] = mean_or_zero(s.topk_overlap_sum, s.queries);
    j["logit_rmse"] = rmse(s);
    j["output_rel_err"] = mean_or_zero(s.output_rel_err_sum, s.queries);
    if (eo.fused) j["fused_output_rel_err"] = mean_or_zero(c.fused_rel_err_sum, c.fused_rows);
    j["peak_bytes"] = bytes_json(c.peak);
    j["reserved_bytes"] = c.reserved;
    const double ratio = c.peak.total() > 0 ? static_cast<double>(fp16_peak) / c.peak.total() : 0.0;
    j["ratio_vs_fp16"] = ratio;
    j["reserved_ratio_vs_fp16"] = c.reserved > 0 ? static_cast<double>(fp16_reserved) / c.reserved : 0.0;
    nlohmann::json layers = nlohmann::json::array();
    std::vector<std::string> per_layer;
    for (const DriftStats& l : c.per_layer) {
      layers.push_back({{"drift", l.drift()},
                        {"logit_rmse", rmse(l)},
                        {"output_rel_err", mean_or_zero(l.output_rel_err_sum, l.queries)},
                        {"queries", l.queries}});
      per_layer.push_back(absl::StrFormat("%.3f", l.drift()));
    }
    j["per_layer"] = layers;
    rows.push_back(j);
    md += absl::StrFormat("| %s | %.4f | %.3f | %.4f | %.4f |", c.format, s.drift(),
                          mean_or_zero(s.topk_overlap_sum, s.queries), rmse(s),
                          mean_or_zero(s.output_rel_err_sum, s.queries));
    if (eo.fused) md += absl::StrFormat(" %.4f |", mean_or_zero(c.fused_rel_err_sum, c.fused_rows));
    md += absl::StrFormat(" %lld | %.2fx | %.2f | %lld | %s |%s\n", static_cast<long long>(c.peak.total()), ratio,
                          ratio > 0 ? 16.0 / ratio : 0.0, static_cast<long long>(c.reserved),
                          absl::StrJoin(per_layer, " "), c.error.empty() ? "" : " error: " + c.error);
  }
  out["formats"] = rows;
  return print_and_write(out, md);
}

int dump_main() {
  if (absl::GetFlag(FLAGS_out).empty()) return fail(absl::InvalidArgumentError("--out is required"));
  std::unique_ptr<KvEventLog> log;
  struct Forward final : KvObserver {
    std::unique_ptr<KvEventLog>* log;
    void on_observe(int l, const float* q, int n) override { (*log)->on_observe(l, q, n); }
    void on_attend(int l, const float* q, const float* k, const float* v, int n, const float* o) override {
      (*log)->on_attend(l, q, k, v, n, o);
    }
    void on_append(int l, const float* k, const float* v, int64_t f, int c) override { (*log)->on_append(l, k, v, f, c); }
  } fwd;
  fwd.log = &log;
  auto r = run_model(&fwd, [&](const KvGeometry& g) {
    log = std::make_unique<KvEventLog>(g);
    return absl::OkStatus();
  });
  if (!r.ok()) return fail(r.status());
  const bool f16 = absl::GetFlag(FLAGS_dump_dtype) == "f16";
  if (auto st = write_dump(absl::GetFlag(FLAGS_out), *log, *r, f16); !st.ok()) return fail(st);
  std::printf("wrote %zu events of %lld frames to %s\n", log->events().size(), static_cast<long long>(r->frames),
              absl::GetFlag(FLAGS_out).c_str());
  if (auto st = flush_stdout(); !st.ok()) return fail(st);
  return 0;
}

// ---- bench ----

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int bench_main() {
  const int reps = absl::GetFlag(FLAGS_reps);
  const KvFormatOptions fo = format_options();
  nlohmann::json out;
  std::string md;
  // the configs are read before the timings, which take minutes: a bad path fails at once
  std::vector<ModelConfig> configs;
  for (absl::string_view path : absl::StrSplit(absl::GetFlag(FLAGS_configs), ',', absl::SkipEmpty())) {
    auto cfg = load_model_config(std::string(path));
    if (!cfg.ok()) return fail(cfg.status());
    configs.push_back(std::move(*cfg));
  }
  // attention over a filled cache, one layer, one query block of 64 tokens
  nlohmann::json att = nlohmann::json::array();
  auto head_dims = parse_head_dims(absl::GetFlag(FLAGS_head_dims));
  if (!head_dims.ok()) return fail(head_dims.status());
  for (const int hd : *head_dims) {
    std::map<std::pair<int, std::string>, std::pair<double, int64_t>> res;  // (tokens, format) -> (ms, bytes)
    std::vector<int> token_counts;
    std::vector<std::string> fmts;
    // the formats of one cache size are timed round-robin, so that load from
    // other processes hits them alike
    std::vector<KvCase> cases = kv_bench_cases(hd);
    for (size_t first = 0; first < cases.size();) {
      size_t last = first;
      while (last < cases.size() && cases[last].frames == cases[first].frames) ++last;
      struct Live {
        KvCase c;
        std::unique_ptr<KvCache> cache;
        std::vector<float> q, kc, vc, o;
        std::vector<double> t;
      };
      std::vector<Live> live;
      for (size_t i = first; i < last; ++i) {
        Live l;
        l.c = cases[i];
        l.c.options = fo;
        auto cache = make_kv_cache(l.c.format, l.c.geometry, l.c.options);
        if (!cache.ok()) return fail(cache.status());
        l.cache = std::move(*cache);
        SyntheticKv data(l.c.geometry, l.c.seed);
        if (auto st = fill_cache(l.cache.get(), data, l.c.frames, l.c.query_tokens); !st.ok()) return fail(st);
        data.queries(1000, l.c.query_tokens, &l.q);
        data.block(1000, l.c.query_tokens, &l.kc, &l.vc);
        l.o.resize(l.q.size());
        live.push_back(std::move(l));
      }
      for (int r = -2; r < reps; ++r)
        for (Live& l : live) {
          const auto t0 = Clock::now();
          l.cache->attend(0, l.q.data(), l.kc.data(), l.vc.data(), l.c.query_tokens, l.o.data());
          if (r >= 0) l.t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        }
      for (Live& l : live) {
        const int tokens = l.c.frames * l.c.geometry.tokens_per_frame;
        const double ms = median(l.t);
        res[{tokens, l.c.format}] = {ms, l.cache->bytes().total()};
        if (std::find(token_counts.begin(), token_counts.end(), tokens) == token_counts.end()) token_counts.push_back(tokens);
        if (std::find(fmts.begin(), fmts.end(), l.c.format) == fmts.end()) fmts.push_back(l.c.format);
        att.push_back({{"head_dim", hd}, {"tokens", tokens}, {"format", l.c.format}, {"ms", ms},
                       {"bytes_read", l.cache->bytes().total()}});
        std::fprintf(stderr, "bench %s: %.3f ms\n", l.c.name.c_str(), ms);
      }
      first = last;
    }
    md += absl::StrFormat(
        "\nAttention of one 64-query block, 4 heads x %d, over N cached tokens (median of %d, ms; x = relative to "
        "fp16; bytes = the cache the block reads):\n\n| N |",
        hd, reps);
    for (const auto& f : fmts) md += absl::StrFormat(" %s ms (x) |", f);
    md += " quantwm2 / qvg2 |";
    for (const auto& f : fmts) md += absl::StrFormat(" %s bytes |", f);
    md += "\n|---|";
    for (size_t i = 0; i < 2 * fmts.size() + 1; ++i) md += "---|";
    md += "\n";
    for (int n : token_counts) {
      const double base = res[{n, "fp16"}].first;
      md += absl::StrFormat("| %d |", n);
      for (const auto& f : fmts) md += absl::StrFormat(" %.3f (%.2f) |", res[{n, f}].first, res[{n, f}].first / base);
      md += absl::StrFormat(" %.2f |", res[{n, "quantwm2"}].first / res[{n, "qvg2"}].first);
      for (const auto& f : fmts) md += absl::StrFormat(" %lld |", static_cast<long long>(res[{n, f}].second));
      md += "\n";
    }
  }
  out["attention"] = att;
  // bytes per session (the exact worst case admission reserves)
  nlohmann::json sess = nlohmann::json::array();
  if (!configs.empty()) md += "\nBytes per session (kv_format_max_bytes: the most a session holds, everything counted) and ratio vs fp16:\n\n"
        "| config | fp16 |";
  const std::vector<std::string> fmts = {"kivi2", "qvg2", "quantwm2", "quantwm2-qsac"};
  if (!configs.empty()) {
    for (const auto& f : fmts) md += absl::StrFormat(" %s |", f);
    md += "\n|---|---|";
    for (size_t i = 0; i < fmts.size(); ++i) md += "---|";
    md += "\n";
  }
  for (const ModelConfig& cfg : configs) {
    const KvGeometry g = kv_geometry_of(cfg);
    const int64_t fp16 = kv_format_max_bytes("fp16", g, fo);
    md += absl::StrFormat("| %s | %lld |", cfg.name, static_cast<long long>(fp16));
    for (const auto& f : fmts) {
      const int64_t b = kv_format_max_bytes(f, g, fo);
      md += absl::StrFormat(" %lld (%.2fx) |", static_cast<long long>(b), b > 0 ? static_cast<double>(fp16) / b : 0.0);
      sess.push_back({{"config", cfg.name}, {"format", f}, {"bytes", b}, {"fp16_bytes", fp16},
                      {"ratio", b > 0 ? static_cast<double>(fp16) / b : 0.0}});
    }
    md += "\n";
  }
  out["session_bytes"] = sess;
  return print_and_write(out, md);
}

}  // namespace
}  // namespace wm

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "wmquant eval|dump|bench (see the header of tools/wmquant.cc)\n"
      "  eval  --model DIR --script F [--formats a,b] [--json F] [--md F]  or  eval --dump F\n"
      "  dump  --model DIR --script F --out F.safetensors\n"
      "  bench [--head_dims 64,128] [--reps N]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() != 2) {
    std::fprintf(stderr, "wmquant: give one command: eval, dump or bench\n");
    return 2;
  }
  if (!wm::threads_in_range(absl::GetFlag(FLAGS_threads))) {
    std::fprintf(stderr, "wmquant: %s\n", wm::kThreadsRange);
    return 2;
  }
  if (auto st = wm::check_flags(); !st.ok()) {
    std::fprintf(stderr, "wmquant: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  const std::string cmd = rest[1];
  // the outputs the command writes, checked before its run (minutes) rather than after it
  std::vector<std::pair<const char*, std::string>> outputs;
  if (cmd == "dump") outputs = {{"out", absl::GetFlag(FLAGS_out)}};
  if (cmd == "bench")
    if (auto st = wm::check_bench_head_dims(); !st.ok()) {
      std::fprintf(stderr, "wmquant: %s\n", std::string(st.message()).c_str());
      return 2;
    }
  if (cmd == "eval" || cmd == "bench") outputs = {{"json", absl::GetFlag(FLAGS_json)}, {"md", absl::GetFlag(FLAGS_md)}};
  for (const auto& [flag, path] : outputs)
    if (auto bad = wm::unwritable_output(flag, path)) {
      std::fprintf(stderr, "wmquant: %s\n", bad->c_str());
      return 2;
    }
  if (absl::GetFlag(FLAGS_threads) > 0) omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  if (cmd == "eval") return wm::eval_main();
  if (cmd == "dump") return wm::dump_main();
  if (cmd == "bench") return wm::bench_main();
  std::fprintf(stderr, "wmquant: unknown command '%s'\n", cmd.c_str());
  return 2;
}
