// The engine Backend over a plugin's C ABI (engine/plugin_api.h): argument
// translation only. KV caches made here live in the plugin's device page
// pool; attention batches every plugin cache of a step into one call (a
// batch-invariant session's into one of its own).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/plugin_kv_geometry.h"
#include "engine/plugin_loader.h"

namespace wm {
namespace {

WmKvGeometry to_c(const KvGeometry& g, const KvFormatOptions& o) { return to_plugin_kv_geometry(g, o); }

absl::Status from_code(int32_t code, absl::string_view what, const char* message) {
  if (code == WM_OK) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("cuda backend: ", what, ": ", message != nullptr ? message : ""));
}

class PluginBackendImpl;

// one session's cache in the plugin's page pool
class PluginKvCache final : public KvCache {
 public:
  PluginKvCache(PluginBackendImpl* owner, WmPluginKv* kv, std::string format, const KvGeometry& g)
      : owner_(owner), kv_(kv), format_(std::move(format)), g_(g) {}
  ~PluginKvCache() override;

  absl::string_view format() const override { return format_; }
  const KvGeometry& geometry() const override { return g_; }
  void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) override;
  absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override;
  KvBytes bytes() const override;
  std::vector<int64_t> frames(int layer) const override;
  void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const override;
  bool probe_against(const KvCache& reference, int layer, const float* q, const float* k_cur, const float* v_cur,
                     int n, const std::vector<ProbeQuery>& samples, int topk, ProbeRanks* out) const override;

  WmPluginKv* handle() const { return kv_; }

 private:
  PluginBackendImpl* owner_;
  WmPluginKv* kv_;
  std::string format_;
  KvGeometry g_;
  mutable bool probe_failed_ = false;  // a probe failed (said once)
};

class PluginBackendImpl final : public PluginBackend {
 public:
  PluginBackendImpl(std::shared_ptr<const LoadedPlugin> plugin, WmPluginBackend* b, bool abort_on_error)
      : plugin_(std::move(plugin)), api_(plugin_->api()), b_(b), abort_on_error_(abort_on_error) {
    api_.device_info(b_, &info_);
  }
  ~PluginBackendImpl() override { api_.destroy(b_); }

  const WmPluginApi& api() const { return api_; }
  WmPluginBackend* handle() const { return b_; }

  // an op's result: fatal by default (see PluginBackendOptions); while a
  // graph is recorded the failure only fails the recording (graph_end)
  void check(int32_t code, const char* what) const {
    if (code == WM_OK) return;
    const absl::Status s = from_code(code, what, api_.last_error(b_));
    if (recording_) {
      if (recording_status_.ok()) recording_status_ = s;
      return;
    }
    if (abort_on_error_) {
      std::fprintf(stderr, "wmserve: fatal: %s\n", s.ToString().c_str());
      std::abort();
    }
    if (status_.ok()) status_ = s;
  }
  absl::Status result(int32_t code, const char* what) const { return from_code(code, what, api_.last_error(b_)); }

  // PluginBackend
  const LoadedPlugin& plugin() const override { return *plugin_; }
  const WmPluginDeviceInfo& device_info() const override { return info_; }
  absl::Status status() const override { return status_; }
  absl::Status take_status() override { return std::exchange(status_, absl::OkStatus()); }
  absl::Status synchronize() override { return result(api_.synchronize(b_), "synchronize"); }
  absl::Status set_tuning(absl::string_view key, int64_t value) override {
    const std::string k(key);
    return result(api_.set_tuning(b_, k.c_str(), value), "set_tuning");
  }
  absl::StatusOr<int64_t> counter(absl::string_view name) const override {
    const std::string n(name);
    int64_t value = 0;
    absl::Status s = result(api_.counter(b_, n.c_str(), &value), "counter");
    if (!s.ok()) return s;
    return value;
  }
  absl::Status timer_start() override { return result(api_.timer_start(b_), "timer_start"); }
  absl::StatusOr<double> timer_stop_ms() override {
    double ms = 0;
    absl::Status s = result(api_.timer_stop(b_, &ms), "timer_stop");
    if (!s.ok()) return s;
    return ms;
  }

  // Backend
  absl::string_view name() const override { return api_.name; }
  bool supports(BackendOp op) const override { return api_.supports(b_, static_cast<int32_t>(op)) != 0; }

  void* alloc(size_t bytes) override {
    void* p = api_.alloc(b_, bytes);
    if (p == nullptr && bytes > 0) check(WM_RESOURCE_EXHAUSTED, "alloc");
    return p;
  }
  void free(void* p) override { api_.free(b_, p); }
  void upload(void* dst, const void* host, size_t bytes) override {
    check(api_.upload(b_, dst, host, bytes), "upload");
  }
  void download(void* host, const void* src, size_t bytes) override {
    check(api_.download(b_, host, src, bytes), "download");
  }
  const void* upload_weight(const float* host, int out, int in) override {
    const void* handle = nullptr;
    check(api_.upload_weight(b_, host, out, in, &handle), "upload_weight");
    return handle;
  }

  void linear(const LinearWeight& w, const float* x, int n, float* y) override {
    check(api_.linear(b_, w.w, w.b, w.out, w.in, x, n, y), "linear");
  }
  void layer_norm_modulate(const float* x, int n, int d, const float* shift, const float* scale, int mod_stride,
                           int tokens_per_frame, float eps, float* y) override {
    check(api_.layer_norm_modulate(b_, x, n, d, shift, scale, mod_stride, tokens_per_frame, eps, y),
          "layer_norm_modulate");
  }
  void rms_norm_rope(float* x, int n, int heads, int head_dim, int row_stride, const float* norm_w,
                     const int32_t* pos, const RopeParams& rope, float eps) override {
    const WmRopeParams r{rope.theta, rope.t_pairs, rope.h_pairs, rope.w_pairs};
    check(api_.rms_norm_rope(b_, x, n, heads, head_dim, row_stride, norm_w, pos, &r, eps), "rms_norm_rope");
  }
  void rms_norm_rope_qk(float* q, const float* q_norm, float* k, const float* k_norm, int n, int heads, int head_dim,
                        int row_stride, const int32_t* pos, const RopeParams& rope, float eps) override {
    const WmRopeParams r{rope.theta, rope.t_pairs, rope.h_pairs, rope.w_pairs};
    check(api_.rms_norm_rope_qk(b_, q, q_norm, k, k_norm, n, heads, head_dim, row_stride, pos, &r, eps),
          "rms_norm_rope_qk");
  }
  void add_rows(const float* rows, const float* per_block, int n_rows, int blocks, int width, float* out) override {
    check(api_.add_rows(b_, rows, per_block, n_rows, blocks, width, out), "add_rows");
  }
  void gelu(float* x, int64_t count) override { check(api_.gelu(b_, x, count), "gelu"); }
  void ffn(const LinearWeight& w0, const LinearWeight& w2, const float* x, int n, float* hidden,
           float* y) override {
    // the plugin checks both weights against these shapes
    check(api_.ffn(b_, w0.w, w0.b, w2.w, w2.b, w0.in, w0.out, w2.out, x, n, hidden, y), "ffn");
  }
  void gated_residual(float* h, const float* y, const float* gate, int mod_stride, int n, int d,
                      int tokens_per_frame) override {
    check(api_.gated_residual(b_, h, y, gate, mod_stride, n, d, tokens_per_frame), "gated_residual");
  }
  void gated_residual_norm(float* h, const float* y, const float* gate, int gate_stride, int n, int d,
                           int tokens_per_frame, const float* shift, const float* scale, int mod_stride, float eps,
                           float* u) override {
    check(api_.gated_residual_norm(b_, h, y, gate, gate_stride, n, d, tokens_per_frame, shift, scale, mod_stride, eps,
                                   u),
          "gated_residual_norm");
  }
  void noise_frames(std::span<const uint64_t> seeds, std::span<const int64_t> frames, int64_t values_per_frame,
                    float* out) override {
    const size_t n = std::min(seeds.size(), frames.size());
    check(api_.noise_frames(b_, seeds.data(), frames.data(), static_cast<int32_t>(n), values_per_frame, out),
          "noise_frames");
  }
  void patchify(const float* frames, int frames_count, const FrameShape& s, float* tokens) override {
    const WmFrameShape c{s.height, s.width, s.channels, s.patch};
    check(api_.patchify(b_, frames, frames_count, &c, tokens), "patchify");
  }
  void unpatchify(const float* tokens, int frames_count, const FrameShape& s, float* frames) override {
    const WmFrameShape c{s.height, s.width, s.channels, s.patch};
    check(api_.unpatchify(b_, tokens, frames_count, &c, frames), "unpatchify");
  }
  void euler_step(float* x, const float* v, const float* dt_per_frame, int frames_count, int64_t values_per_frame,
                  bool clamp) override {
    check(api_.euler_step(b_, x, v, dt_per_frame, frames_count, values_per_frame, clamp ? 1 : 0), "euler_step");
  }

  absl::StatusOr<std::unique_ptr<KvCache>> make_kv_cache(absl::string_view format, const KvGeometry& g,
                                                         const KvFormatOptions& options) override {
    const std::string f(format);
    const WmKvGeometry c = to_c(g, options);
    WmPluginKv* kv = nullptr;
    absl::Status s = result(api_.kv_create(b_, f.c_str(), &c, &kv), "kv_create");
    if (!s.ok()) return s;
    return std::unique_ptr<KvCache>(new PluginKvCache(this, kv, f, g));
  }
  int64_t kv_reservation_bytes(absl::string_view format, const KvGeometry& g,
                               const KvFormatOptions& options) const override {
    const std::string f(format);
    const WmKvGeometry c = to_c(g, options);
    int64_t bytes = 0;
    // a format the device cannot hold reserves nothing; creating it reports why
    if (api_.kv_reservation_bytes(b_, f.c_str(), &c, &bytes) != WM_OK) return 0;
    return bytes;
  }
  absl::Status kv_format_status(absl::string_view format, const KvGeometry& g,
                                const KvFormatOptions& options) const override {
    const std::string f(format);
    const WmKvGeometry c = to_c(g, options);
    int64_t bytes = 0;
    return result(api_.kv_reservation_bytes(b_, f.c_str(), &c, &bytes), "kv_reservation_bytes");
  }
  BackendMemory memory() const override {
    WmMemoryStats m{};
    BackendMemory out;
    if (api_.memory_stats(b_, &m) != WM_OK) return out;
    out.device_total = m.device_total;
    out.device_free = m.device_free;
    out.kv_pool_capacity = m.kv_pool_capacity;
    out.kv_pool_reserved = m.kv_pool_reserved;
    out.kv_pool_used = m.kv_pool_used;
    return out;
  }

  // The plugin caches of a batch as attention calls: a batch-invariant
  // session in a call of its own (the plugin plans each call by its sessions
  // alone: the split of its keys and the query tile, and so the order of the
  // additions, are then those of stepping alone), every other plugin cache
  // in one call per cache format (a launch reads one page layout). Any other
  // cache (a wrapper around one) goes to `others`.
  static std::vector<std::vector<WmSessionRows>> attention_calls(std::span<const SessionSlice> sessions,
                                                                 int tokens_per_frame,
                                                                 std::vector<const SessionSlice*>* others) {
    std::vector<std::vector<WmSessionRows>> shared, alone;
    std::vector<absl::string_view> formats;  // of each shared call
    for (const SessionSlice& s : sessions) {
      auto* pc = dynamic_cast<PluginKvCache*>(s.cache);
      if (pc == nullptr || pc->handle() == nullptr) {
        others->push_back(&s);
        continue;
      }
      const WmSessionRows rows{pc->handle(), s.batch_frame * tokens_per_frame, s.frames * tokens_per_frame};
      if (s.invariant) {
        alone.push_back({rows});
        continue;
      }
      const auto f = std::find(formats.begin(), formats.end(), pc->format());
      if (f == formats.end()) {
        formats.push_back(pc->format());
        shared.push_back({rows});
      } else {
        shared[static_cast<size_t>(f - formats.begin())].push_back(rows);
      }
    }
    for (auto& c : alone) shared.push_back(std::move(c));
    return shared;
  }

  bool prepare_recording(std::span<const SessionSlice> sessions, int tokens_per_frame) override {
    std::vector<const SessionSlice*> others;
    const auto calls = attention_calls(sessions, tokens_per_frame, &others);
    if (!others.empty() || calls.empty()) return false;
    // a failure here shows again, as an error, when the pass runs as usual
    for (const std::vector<WmSessionRows>& c : calls)
      if (api_.prepare_attention(b_, c.data(), static_cast<int32_t>(c.size())) != WM_OK) return false;
    return true;
  }
  bool graph_begin() override {
    if (recording_ || api_.graph_begin(b_) != WM_OK) return false;
    recording_ = true;
    recording_status_ = absl::OkStatus();
    return true;
  }
  absl::Status graph_end(bool keep) override {
    if (!recording_) return absl::FailedPreconditionError("no graph is being recorded");
    recording_ = false;
    // an op that failed here (it counted as the recording's failure) fails the recording too
    const absl::Status ended = result(api_.graph_end(b_, keep && recording_status_.ok() ? 1 : 0), "graph_end");
    // an op that failed while recording says why better than the recording does
    return recording_status_.ok() ? ended : std::exchange(recording_status_, absl::OkStatus());
  }
  absl::Status graph_launch() override { return result(api_.graph_launch(b_), "graph_launch"); }

  // the plugin caches of the batch in one call; any other cache appends itself
  absl::Status kv_append(int layer, std::span<const SessionSlice> sessions, std::span<const int64_t> first_frames,
                         int tokens_per_frame, const float* k, const float* v) override {
    if (first_frames.size() != sessions.size())
      return absl::InvalidArgumentError("kv_append: sessions and first frames differ in count");
    std::vector<std::vector<WmKvWrite>> writes;  // one batch per cache format
    std::vector<absl::string_view> formats;
    std::vector<SessionSlice> others;
    std::vector<int64_t> others_first;
    for (size_t i = 0; i < sessions.size(); ++i) {
      const SessionSlice& s = sessions[i];
      auto* pc = dynamic_cast<PluginKvCache*>(s.cache);
      if (pc != nullptr && pc->handle() != nullptr) {
        const WmKvWrite w{pc->handle(), first_frames[i], s.batch_frame, s.frames};
        const auto f = std::find(formats.begin(), formats.end(), pc->format());
        if (f == formats.end()) {
          formats.push_back(pc->format());
          writes.push_back({w});
        } else {
          writes[static_cast<size_t>(f - formats.begin())].push_back(w);
        }
      } else {
        others.push_back(s);
        others_first.push_back(first_frames[i]);
      }
    }
    absl::Status st = Backend::kv_append(layer, others, others_first, tokens_per_frame, k, v);
    for (const std::vector<WmKvWrite>& batch : writes) {
      if (!st.ok()) break;
      st = result(api_.kv_append_batch(b_, layer, batch.data(), static_cast<int32_t>(batch.size()), k, v), "kv_append");
    }
    return st;
  }

  // plugin caches of the batch in one launch (a batch-invariant session in
  // its own: attention_calls); any other cache (a wrapper around one) runs
  // through its own attend()
  void attention(int layer, std::span<const SessionSlice> sessions, int tokens_per_frame, const float* q,
                 const float* k, const float* v, float* out) override {
    std::vector<const SessionSlice*> others;
    for (const std::vector<WmSessionRows>& c : attention_calls(sessions, tokens_per_frame, &others))
      check(api_.attention(b_, layer, c.data(), static_cast<int32_t>(c.size()), q, k, v, out), "attention");
    for (const SessionSlice* s : others) {
      const KvGeometry& g = s->cache->geometry();
      const size_t off = static_cast<size_t>(s->batch_frame) * tokens_per_frame * g.heads * g.head_dim;
      const int n = s->frames * tokens_per_frame;
      s->cache->observe_queries(layer, q + off, n);
      s->cache->attend(layer, q + off, k + off, v + off, n, out + off);
    }
  }

 private:
  std::shared_ptr<const LoadedPlugin> plugin_;
  const WmPluginApi& api_;
  WmPluginBackend* b_;
  bool abort_on_error_;
  bool recording_ = false;
  mutable absl::Status recording_status_;  // the first op that failed while recording
  WmPluginDeviceInfo info_{};
  mutable absl::Status status_;
};

PluginKvCache::~PluginKvCache() { owner_->api().kv_destroy(owner_->handle(), kv_); }

void PluginKvCache::attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) {
  const WmSessionRows rows{kv_, 0, n};
  owner_->check(owner_->api().attention(owner_->handle(), layer, &rows, 1, q, k_cur, v_cur, out), "attention");
}

absl::Status PluginKvCache::append(int layer, const float* k, const float* v, int64_t first_frame, int frames) {
  return owner_->result(owner_->api().kv_append(owner_->handle(), kv_, layer, k, v, first_frame, frames), "kv_append");
}

KvBytes PluginKvCache::bytes() const {
  int64_t b = 0;
  owner_->check(owner_->api().kv_bytes(owner_->handle(), kv_, &b), "kv_bytes");
  KvBytes out;
  out.fp_values = b;  // whole pages: what the pool holds for this session
  return out;
}

std::vector<int64_t> PluginKvCache::frames(int layer) const {
  int32_t count = 0;
  owner_->check(owner_->api().kv_frames(owner_->handle(), kv_, layer, nullptr, 0, &count), "kv_frames");
  std::vector<int64_t> f(static_cast<size_t>(count));
  owner_->check(owner_->api().kv_frames(owner_->handle(), kv_, layer, f.data(), count, &count), "kv_frames");
  f.resize(static_cast<size_t>(count));
  return f;
}

void PluginKvCache::reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const {
  // sized from the frames held, so that the layer is downloaded and decoded
  // once (asking the plugin for the size would do it twice); a size that
  // disagrees is the plugin's, and then the call runs again with it
  const KvGeometry& g = geometry();
  int64_t values = static_cast<int64_t>(frames(layer).size()) * g.tokens_per_frame * g.heads * g.head_dim;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int64_t capacity = values;
    k->resize(static_cast<size_t>(capacity));
    v->resize(static_cast<size_t>(capacity));
    owner_->check(owner_->api().kv_reconstruct(owner_->handle(), kv_, layer, k->data(), v->data(), capacity, &values),
                  "kv_reconstruct");
    if (values <= capacity) break;
  }
  k->resize(static_cast<size_t>(values));
  v->resize(static_cast<size_t>(values));
}

bool PluginKvCache::probe_against(const KvCache& reference, int layer, const float* q, const float* k_cur,
                                  const float* v_cur, int n, const std::vector<ProbeQuery>& samples, int topk,
                                  ProbeRanks* out) const {
  const auto* ref = dynamic_cast<const PluginKvCache*>(&reference);
  if (ref == nullptr || ref->owner_ != owner_) return false;  // not a pair of this device
  std::vector<int32_t> pairs;
  pairs.reserve(samples.size() * 2);
  for (const ProbeQuery& s : samples) {
    pairs.push_back(s.head);
    pairs.push_back(s.query);
  }
  const size_t count = samples.size(), k = static_cast<size_t>(std::max(topk, 0)),
               d = static_cast<size_t>(g_.head_dim);
  out->ref_top.resize(count * k);
  out->cand_top.resize(count * k);
  out->sq_err.resize(count);
  out->ref_nonfinite.resize(count);
  out->ref_out.resize(count * d);
  out->cand_out.resize(count * d);
  WmProbeResults r{};
  r.ref_top = out->ref_top.data();
  r.cand_top = out->cand_top.data();
  r.sq_err = out->sq_err.data();
  r.ref_nonfinite = out->ref_nonfinite.data();
  r.ref_out = out->ref_out.data();
  r.cand_out = out->cand_out.data();
  const absl::Status s = owner_->result(
      owner_->api().kv_probe(owner_->handle(), ref->kv_, kv_, layer, q, k_cur, v_cur, n, pairs.data(),
                             static_cast<int32_t>(count), topk, &r),
      "kv_probe");
  if (!s.ok()) {
    // a probe is a sample: it is skipped, and the session goes on
    if (!probe_failed_)
      std::fprintf(stderr, "wmserve: drift probes of a %s cache skipped: %s\n", format_.c_str(), s.ToString().c_str());
    probe_failed_ = true;
    return false;
  }
  out->tokens = r.tokens;
  out->k = r.k;
  // the plugin ranked k <= topk tokens a sample: the arrays hold count x k
  out->ref_top.resize(count * static_cast<size_t>(std::max(r.k, 0)));
  out->cand_top.resize(out->ref_top.size());
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PluginBackend>> make_plugin_backend(const PluginBackendOptions& options) {
  auto plugin = find_plugin(options.path, kCudaPluginFile);
  if (!plugin.ok()) return plugin.status();
  const WmPluginApi& api = (*plugin)->api();
  char err[1024] = {0};
  WmPluginDeviceInfo info{};
  if (int32_t code = api.probe(options.device, &info, err, sizeof(err)); code != WM_OK)
    return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat((*plugin)->path(), ": ", err));
  WmPluginOptions o{};
  o.struct_size = sizeof(WmPluginOptions);
  o.device = options.device;
  o.kv_pool_bytes = options.kv_pool_bytes;
  o.kv_page_bytes = options.kv_page_bytes;
  o.reserve_bytes = options.reserve_bytes;
  WmPluginBackend* b = nullptr;
  if (int32_t code = api.create(&o, &b, err, sizeof(err)); code != WM_OK || b == nullptr)
    return absl::Status(code != WM_OK ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kInternal,
                        absl::StrCat((*plugin)->path(), ": ", err));
  return std::unique_ptr<PluginBackend>(new PluginBackendImpl(*plugin, b, options.abort_on_error));
}

}  // namespace wm
