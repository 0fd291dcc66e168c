#include "engine/weights.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/image_io.h"
#include "common/status_macros.h"

namespace wm {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c) {
  const int64_t D = c.dim, P = c.patch_dim(), A = c.actions.input_width(), Q = c.qkv_dim(), F = c.ffn;
  std::vector<TensorSpec> s = {
      {"patch_embed.weight", {D, P}},      {"patch_embed.bias", {D}},
      {"time_embed.0.weight", {D, c.freq_dim}}, {"time_embed.0.bias", {D}},
      {"time_embed.2.weight", {D, D}},     {"time_embed.2.bias", {D}},
      {"action_embed.0.weight", {D, A}},   {"action_embed.0.bias", {D}},
      {"action_embed.2.weight", {D, D}},   {"action_embed.2.bias", {D}},
      {"cond_proj.weight", {6 * D, D}},    {"cond_proj.bias", {6 * D}},
  };
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("blocks.", l, ".");
    s.push_back({p + "modulation", {6, D}});
    for (const char* m : {"q", "k", "v"}) {
      s.push_back({absl::StrCat(p, "attn.", m, ".weight"), {Q, D}});
      s.push_back({absl::StrCat(p, "attn.", m, ".bias"), {Q}});
    }
    s.push_back({p + "attn.q_norm.weight", {c.head_dim}});
    s.push_back({p + "attn.k_norm.weight", {c.head_dim}});
    s.push_back({p + "attn.o.weight", {D, Q}});
    s.push_back({p + "attn.o.bias", {D}});
    s.push_back({p + "ffn.0.weight", {F, D}});
    s.push_back({p + "ffn.0.bias", {F}});
    s.push_back({p + "ffn.2.weight", {D, F}});
    s.push_back({p + "ffn.2.bias", {D}});
  }
  s.push_back({"head.modulation", {2, D}});
  s.push_back({"head.weight", {P, D}});
  s.push_back({"head.bias", {P}});
  return s;
}

const std::vector<float>& HostWeights::get(const std::string& name) const {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) return values[i];
  static const std::vector<float> empty;
  return empty;
}

namespace {

// a cgroup limit file's number; 0 for "max", an absent file, or a value so
// large it means no limit (cgroup v1 writes about 2^63 for none)
int64_t cgroup_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v <= 0 || v >= (int64_t{1} << 62)) return 0;
  return v;
}

// this process's cgroup v2 directory under /sys/fs/cgroup ("" when not v2)
std::string cgroup_v2_dir() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);)
    if (absl::StartsWith(line, "0::")) return line.substr(3);
  return "";
}

}  // namespace

MemoryLimit memory_limit() {
  MemoryLimit m;
  auto consider = [&](int64_t bytes, const char* what) {
    if (bytes > 0 && (m.bytes == 0 || bytes < m.bytes)) m = {bytes, what};
  };
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) consider(static_cast<int64_t>(pages) * page, "physical memory");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    consider(static_cast<int64_t>(std::min<rlim_t>(as.rlim_cur, rlim_t{1} << 62)), "address-space limit (ulimit -v)");
  constexpr const char* kContainer = "container memory limit (cgroup)";
  consider(cgroup_limit("/sys/fs/cgroup/memory.max"), kContainer);
  if (const std::string dir = cgroup_v2_dir(); !dir.empty() && dir != "/")
    consider(cgroup_limit("/sys/fs/cgroup" + dir + "/memory.max"), kContainer);
  consider(cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"), kContainer);
  return m;
}

absl::Status check_weights_fit_memory(const ModelConfig& c) {
  const int64_t need = c.parameter_count() * static_cast<int64_t>(sizeof(float));
  const MemoryLimit have = memory_limit();
  if (have.bytes <= 0 || need <= have.bytes) return absl::OkStatus();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "model '%s' has %d parameters: its fp32 weights need %.1f GiB (%d bytes), more than the %.1f GiB (%d bytes) of "
      "memory this process may use (%s)",
      c.name, c.parameter_count(), static_cast<double>(need) / kGiB, need, static_cast<double>(have.bytes) / kGiB,
      have.bytes, have.what));
}

absl::StatusOr<HostWeights> load_host_weights(const ModelConfig& c, const SafetensorsFile& file) {
  WM_RETURN_IF_ERROR(check_weights_fit_memory(c));
  HostWeights w;
  w.specs = model_tensor_specs(c);
  std::map<std::string, bool> expected;
  for (const auto& s : w.specs) expected[s.name] = true;
  for (const auto& t : file.tensors())
    if (!expected.count(t.name))
      return absl::InvalidArgumentError(
          absl::StrCat(file.source(), ": tensor ", quote_tensor_name(t.name), " is not part of this config (wrong model?)"));
  // every tensor checked before anything is allocated: the config's sizes are
  // only trusted once the file holds tensors of exactly those shapes
  for (const auto& s : w.specs) WM_RETURN_IF_ERROR(file.check_f32(s.name, s.shape));
  w.values.resize(w.specs.size());
  for (size_t i = 0; i < w.specs.size(); ++i) {
    w.values[i].resize(static_cast<size_t>(w.specs[i].numel()));
    WM_RETURN_IF_ERROR(file.read_f32(w.specs[i].name, w.specs[i].shape, w.values[i].data()));
    for (float v : w.values[i])
      if (!std::isfinite(v))
        return absl::InvalidArgumentError(
            absl::StrCat(file.source(), ": tensor '", w.specs[i].name, "' holds a non-finite value"));
  }
  return w;
}

HostWeights random_host_weights(const ModelConfig& c, uint64_t seed) {
  HostWeights w;
  w.specs = model_tensor_specs(c);
  w.values.resize(w.specs.size());
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < w.specs.size(); ++i) {
    const auto& s = w.specs[i];
    auto& v = w.values[i];
    v.resize(static_cast<size_t>(s.numel()));
    const bool is_norm = s.name.find("_norm.weight") != std::string::npos;
    if (is_norm) {
      std::fill(v.begin(), v.end(), 1.0f);
      continue;
    }
    float stddev = 0.02f;
    if (s.shape.size() == 2 && s.name.find("modulation") == std::string::npos)
      stddev = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));  // fan-in scaling keeps activations bounded
    if (s.shape.size() == 1) stddev = 0.01f;
    std::normal_distribution<float> dist(0.0f, stddev);
    for (float& x : v) x = dist(rng);
  }
  return w;
}

// both files go to temporary names beside their places and are renamed
// there only once both are complete, so that a failure (a full disk, say)
// leaves the model the directory held as it was, not a new config beside the
// old weights. The config is renamed first: were the process killed between
// the two renames, a fresh directory holds a config without weights, which
// counts as no model.
absl::Status save_checkpoint(const ModelConfig& c, const HostWeights& w, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string config_path = dir + "/config.json", weights_path = dir + "/model.safetensors";
  // a rename cannot replace a directory: refused before anything is replaced
  for (const std::string& path : {config_path, weights_path})
    if (std::filesystem::is_directory(std::filesystem::symlink_status(path, ec)))
      return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
  const std::string suffix = absl::StrCat(".tmp-", getpid());
  const std::string config_tmp = config_path + suffix, weights_tmp = weights_path + suffix;
  auto failed = [&](const absl::Status& st) {
    std::filesystem::remove(config_tmp, ec);
    std::filesystem::remove(weights_tmp, ec);
    return absl::Status(st.code(), absl::StrCat(st.message(), " (the model in ", dir, " is unchanged)"));
  };
  const std::string text = model_config_to_json(c);
  if (auto st = write_file(config_tmp, text.data(), text.size()); !st.ok()) return failed(st);
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < w.specs.size(); ++i)
    tensors.push_back({w.specs[i].name, DType::f32, w.specs[i].shape, w.values[i].data()});
  if (auto st = write_safetensors(weights_tmp, tensors, {{"format", "wmserve-cldit"}}); !st.ok()) return failed(st);
  if (std::filesystem::rename(config_tmp, config_path, ec); ec)
    return failed(
        absl::UnavailableError(absl::StrCat("cannot rename ", config_tmp, " to ", config_path, ": ", ec.message())));
  if (std::filesystem::rename(weights_tmp, weights_path, ec); ec) {
    std::filesystem::remove(weights_tmp, ec);
    return absl::UnavailableError(absl::StrCat("cannot rename ", weights_tmp, " to ", weights_path, ": ", ec.message(),
                                               " (config.json was replaced)"));
  }
  return absl::OkStatus();
}

DeviceWeights::DeviceWeights(Backend& backend, const ModelConfig& c, const HostWeights& h) : backend_(backend) {
  auto lin = [&](const std::string& name, bool bias = true) {
    const TensorSpec* spec = nullptr;
    for (const auto& s : h.specs)
      if (s.name == name + ".weight") spec = &s;
    LinearWeight lw;
    lw.out = static_cast<int>(spec->shape[0]);
    lw.in = static_cast<int>(spec->shape[1]);
    lw.w = backend.upload_weight(h.get(name + ".weight").data(), lw.out, lw.in);
    if (bias) lw.b = upload_vector(h.get(name + ".bias"));
    return lw;
  };
  patch_embed = lin("patch_embed");
  head.out = c.patch_dim();
  head.in = c.dim;
  head.w = backend.upload_weight(h.get("head.weight").data(), head.out, head.in);
  head.b = upload_vector(h.get("head.bias"));
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("blocks.", l, ".");
    LayerWeights lw;
    lw.q = lin(p + "attn.q");
    lw.k = lin(p + "attn.k");
    lw.v = lin(p + "attn.v");
    lw.o = lin(p + "attn.o");
    lw.ffn0 = lin(p + "ffn.0");
    lw.ffn2 = lin(p + "ffn.2");
    lw.q_norm = upload_vector(h.get(p + "attn.q_norm.weight"));
    lw.k_norm = upload_vector(h.get(p + "attn.k_norm.weight"));
    lw.modulation = h.get(p + "modulation");
    layers.push_back(std::move(lw));
  }
  std::vector<float> all;
  for (const LayerWeights& lw : layers) all.insert(all.end(), lw.modulation.begin(), lw.modulation.end());
  modulation = upload_vector(all);
  time0_w = h.get("time_embed.0.weight");
  time0_b = h.get("time_embed.0.bias");
  time2_w = h.get("time_embed.2.weight");
  time2_b = h.get("time_embed.2.bias");
  action0_w = h.get("action_embed.0.weight");
  action0_b = h.get("action_embed.0.bias");
  action2_w = h.get("action_embed.2.weight");
  action2_b = h.get("action_embed.2.bias");
  cond_w = h.get("cond_proj.weight");
  cond_b = h.get("cond_proj.bias");
  head_modulation = h.get("head.modulation");
}

DeviceWeights::~DeviceWeights() {
  for (void* p : owned_) backend_.free(p);
}

const float* DeviceWeights::upload_vector(const std::vector<float>& v) {
  void* p = backend_.alloc(v.size() * sizeof(float));
  backend_.upload(p, v.data(), v.size() * sizeof(float));
  owned_.push_back(p);
  return static_cast<const float*>(p);
}

}  // namespace wm
