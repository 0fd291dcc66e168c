#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli.h"
#include "common/status_macros.h"
#include "engine/blas.h"
#include "engine/plugin_loader.h"
#include "engine/safetensors.h"
#include "quant/kv_audit.h"

namespace wm {

namespace {

uint8_t to_u8(float x) {
  const float c = std::fmin(1.0f, std::fmax(-1.0f, x));
  return static_cast<uint8_t>(std::lround((c + 1.0f) * 127.5f));
}

// a frame's first three channels, [H, W, C] in [-1, 1], as 8-bit RGB
std::vector<uint8_t> frame_rgb(const float* src, const ModelConfig& c) {
  const int64_t pixels = static_cast<int64_t>(c.width) * c.height;
  std::vector<uint8_t> rgb(static_cast<size_t>(pixels) * 3);
  for (int64_t p = 0; p < pixels; ++p)
    for (int ch = 0; ch < 3; ++ch) rgb[static_cast<size_t>(p * 3 + ch)] = to_u8(src[p * c.channels + ch]);
  return rgb;
}

}  // namespace

// "cpu", "cuda" or "auto" (engine.h, EngineOptions::device)
static absl::StatusOr<std::unique_ptr<Backend>> make_backend(const EngineOptions& o, const ModelConfig& c,
                                                      std::string* device, std::string* note) {
  if (o.device == "cpu") {
    *device = "cpu";
    WM_RETURN_IF_ERROR(blas::load());
    return make_cpu_backend(o.threads);
  }
  if (o.device != "cuda" && o.device != "auto")
    return absl::InvalidArgumentError(absl::StrCat("device '", o.device, "': expected cpu, cuda or auto"));
  PluginBackendOptions p;
  p.path = o.cuda_plugin;
  p.device = o.cuda_device;
  p.kv_pool_bytes = o.kv_budget_bytes;
  p.kv_page_bytes = o.kv_page_bytes;
  p.reserve_bytes = c.parameter_count() * 2;  // bf16 weights; activations come out of the headroom
  p.abort_on_error = o.abort_on_device_error;
  absl::StatusOr<std::unique_ptr<PluginBackend>> b = make_plugin_backend(p);
  if (b.ok()) {
    // auto only picks a GPU that can hold this model's cache
    if (o.device == "cuda" || (*b)->kv_reservation_bytes("fp16", kv_geometry_of(c), o.kv_options) > 0) {
      *device = "cuda";
      const WmPluginDeviceInfo& i = (*b)->device_info();
      const std::string kernel = (*b)->attention_kernel(c.head_dim);
      *note = absl::StrFormat("%s (sm_%d%d, %d SMs, %.1f GiB)%s", i.name, i.sm_major, i.sm_minor, i.multiprocessors,
                              static_cast<double>(i.total_bytes) / (1 << 30),
                              kernel.empty() ? "" : ", attention kernel " + kernel);
      return std::unique_ptr<Backend>(std::move(*b));
    }
    b = absl::UnimplementedError(absl::StrCat("no CUDA attention kernel for head_dim ", c.head_dim));
  }
  if (o.device == "cuda") return b.status();
  *device = "cpu";
  *note = absl::StrCat("device auto: no CUDA backend (", b.status().message(), "); running on the CPU");
  WM_RETURN_IF_ERROR(blas::load());
  return make_cpu_backend(o.threads);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
  // the OpenMP runtime crashes or allocates without bound far above this
  if (!threads_in_range(options.threads))
    return absl::InvalidArgumentError(absl::StrCat("threads ", options.threads, " must be 0..", kMaxThreads, " (0: all cores)"));
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  ModelConfig config;
  HostWeights weights;
  if (options.random_weights) {
    WM_ASSIGN_OR_RETURN(config, load_model_config(options.config_path));
    WM_RETURN_IF_ERROR(check_weights_fit_memory(config));
    weights = random_host_weights(config, options.random_seed);
  } else {
    // "" + "/config.json" would read from the filesystem's root
    if (options.model_dir.empty()) return absl::InvalidArgumentError("no model directory given (--model DIR)");
    WM_ASSIGN_OR_RETURN(config, load_model_config(options.model_dir + "/config.json"));
    WM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(options.model_dir + "/model.safetensors"));
    WM_ASSIGN_OR_RETURN(weights, load_host_weights(config, *file));
  }
  if (options.kv_budget_bytes <= 0) return absl::InvalidArgumentError("kv budget must be positive");
  if (!(options.audit_block_fraction >= 0 && options.audit_block_fraction <= 1))
    return absl::InvalidArgumentError(
        absl::StrCat("audit block fraction ", options.audit_block_fraction, " must be in [0, 1]"));
  WM_ASSIGN_OR_RETURN(e->backend_, make_backend(options, config, &e->device_, &e->device_note_));
  e->plugin_ = dynamic_cast<PluginBackend*>(e->backend_.get());
  // on a device the KV budget is the page pool: admission counts its real bytes
  if (const int64_t pool = e->backend_->memory().kv_pool_capacity; pool > 0)
    e->options_.kv_budget_bytes = std::min(e->options_.kv_budget_bytes, pool);
  e->model_ = std::make_unique<Model>(*e->backend_, config, weights);
  return e;
}

Engine::~Engine() {
  sessions_.clear();
  if (backend_ != nullptr) {
    for (float* p : {x_, v_, pixels_, dt_})
      if (p != nullptr) backend_->free(p);
  }
}

std::vector<std::string> Engine::cache_formats() const { return kv_formats(); }

KvGeometry Engine::kv_geometry() const { return kv_geometry_of(config()); }

int64_t Engine::session_reservation(absl::string_view format, bool audit) const {
  const int64_t bytes = backend_->kv_reservation_bytes(format, kv_geometry(), options_.kv_options);
  if (!audit || bytes <= 0) return bytes;
  // the audit shadow is a full-precision cache beside the session's own: on
  // the CPU an fp32 cache, on a device an fp16 cache in the device's pages
  // (whose appends stay on the device)
  if (plugin_ != nullptr) return bytes + backend_->kv_reservation_bytes("fp16", kv_geometry(), options_.kv_options);
  return bytes + kv_format_max_bytes("fp32", kv_geometry(), options_.kv_options);
}

bool Engine::audit_supported() const { return true; }

absl::Status Engine::kv_format_status(absl::string_view format, const KvFormatOptions& options) const {
  return backend_->kv_format_status(format, kv_geometry(), options);
}

absl::Status Engine::reserve_buffers(int frames) {
  if (frames <= buffer_frames_) return absl::OkStatus();
  for (float* p : {x_, v_, pixels_, dt_})
    if (p != nullptr) backend_->free(p);
  const ModelConfig& c = config();
  const size_t values = static_cast<size_t>(frames) * c.frame_values();
  x_ = static_cast<float*>(backend_->alloc(values * sizeof(float)));
  v_ = static_cast<float*>(backend_->alloc(values * sizeof(float)));
  pixels_ = static_cast<float*>(backend_->alloc(values * sizeof(float)));
  dt_ = static_cast<float*>(backend_->alloc(static_cast<size_t>(frames) * sizeof(float)));
  if (x_ != nullptr && v_ != nullptr && pixels_ != nullptr && dt_ != nullptr) {
    buffer_frames_ = frames;
    return absl::OkStatus();
  }
  for (float** p : {&x_, &v_, &pixels_, &dt_}) {
    if (*p != nullptr) backend_->free(*p);
    *p = nullptr;
  }
  buffer_frames_ = 0;
  return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", (3 * values + frames) * sizeof(float),
                                                   " bytes of frame buffers for ", frames, " frames on ",
                                                   backend_->name()));
}

absl::Status Engine::reserve_batch(int sessions) {
  if (sessions < 1 || sessions > 1 << 16)
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", sessions, " sessions: expected 1..65536"));
  const ModelConfig& c = config();
  const int frames = sessions * c.frames_per_block;
  WM_RETURN_IF_ERROR(reserve_buffers(frames));
  WM_RETURN_IF_ERROR(model_->reserve(frames * c.tokens_per_frame(), frames));
  if (plugin_ != nullptr) WM_RETURN_IF_ERROR(plugin_->status());
  return absl::OkStatus();
}

absl::Status Engine::validate_image(const Rgb8Image& img) const {
  const ModelConfig& c = config();
  if (c.decoder != "pixels") return absl::InvalidArgumentError("this model takes no image frames (latent model)");
  if (img.width != c.width || img.height != c.height ||
      img.pixels.size() != static_cast<size_t>(c.width) * c.height * 3)
    return absl::InvalidArgumentError(absl::StrCat("frame is ", img.width, "x", img.height, ", the model needs ",
                                                   c.width, "x", c.height));
  return absl::OkStatus();
}

absl::StatusOr<SessionId> Engine::open_session(const SessionOptions& options) {
  if (!kv_format_known(options.cache_format))
    return absl::NotFoundError(absl::StrCat("unknown cache format '", options.cache_format, "'"));
  for (const auto& img : options.prompt) WM_RETURN_IF_ERROR(validate_image(img));
  const int64_t need = session_reservation(options.cache_format, options.audit);
  if (reserved_ + need > options_.kv_budget_bytes)
    return absl::ResourceExhaustedError(absl::StrCat("KV budget full: a ", options.cache_format, " session needs ", need,
                                                     " bytes, ", options_.kv_budget_bytes - reserved_, " of ",
                                                     options_.kv_budget_bytes, " are free"));
  Session s;
  s.seed = options.seed;
  s.reserved = need;
  s.batch_invariant = options.batch_invariant || options_.batch_invariant;
  WM_ASSIGN_OR_RETURN(s.cache, backend_->make_kv_cache(options.cache_format, kv_geometry(), options_.kv_options));
  // audit mode: a full-precision shadow beside the cache measures drift
  // (quant/kv_audit.h; its bytes are part of the session's reservation); on
  // a device the shadow is an fp16 cache of the device's, and the probes
  // read queries and K/V through downloads
  const SessionId id = next_id_++;
  if (options.audit) {
    DeviceReader reader;
    std::unique_ptr<KvCache> device_shadow;
    if (plugin_ != nullptr) {
      reader = [b = backend_.get()](void* host, const void* device, size_t bytes) { b->download(host, device, bytes); };
      WM_ASSIGN_OR_RETURN(device_shadow, backend_->make_kv_cache("fp16", kv_geometry(), options_.kv_options));
    }
    AuditOptions ao;
    ao.block_fraction = options_.audit_block_fraction;
    ao.block_seed = options.seed ^ (id * 0x9E3779B97F4A7C15ull);  // sessions sample different blocks
    auto audited =
        std::make_unique<AuditedKvCache>(std::move(s.cache), ao, std::move(reader), std::move(device_shadow));
    s.audit = audited.get();
    s.cache = std::move(audited);
  }
  if (options.wrap_cache) s.cache = options.wrap_cache(std::move(s.cache));
  Session* sp = &sessions_.emplace(id, std::move(s)).first->second;
  reserved_ += need;
  // the prompt goes in block by block, exactly as generated frames would
  const int B = config().frames_per_block;
  for (size_t i = 0; i < options.prompt.size(); i += B) {
    std::vector<Rgb8Image> chunk(options.prompt.begin() + i,
                                 options.prompt.begin() + std::min(options.prompt.size(), i + B));
    Session* const one[] = {sp};
    const std::vector<Rgb8Image>* const imgs[] = {&chunk};
    if (auto st = write_frames(one, imgs); !st.ok()) {
      close_session(id).IgnoreError();
      return st;
    }
  }
  return id;
}

absl::Status Engine::close_session(SessionId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no session ", id));
  reserved_ -= it->second.reserved;
  // drift is a property of the format, not of one session: keep what closed sessions measured
  if (const DriftStats* d = it->second.cache->drift(); d != nullptr)
    retired_drift_[std::string(it->second.cache->format())] += *d;
  std::erase(pending_, &it->second);  // its last block is never written: the session is gone
  sessions_.erase(it);
  return absl::OkStatus();
}

absl::Status Engine::write_frames(std::span<Session* const> sessions,
                                  std::span<const std::vector<Rgb8Image>* const> images) {
  const int64_t fv = config().frame_values();
  for (size_t s = 0; s < sessions.size(); ++s) {
    Session& sn = *sessions[s];
    WM_CHECK(!sn.pending.has_value());
    PendingWrite w;
    w.first = sn.generated;
    w.values.reserve(images[s]->size() * static_cast<size_t>(fv));
    for (const auto& img : *images[s])
      for (uint8_t p : img.pixels) w.values.push_back(p / 127.5f - 1.0f);
    w.actions.assign(images[s]->size(), Action{});
    sn.generated += static_cast<int64_t>(images[s]->size());
    sn.pending = std::move(w);
    pending_.push_back(&sn);
  }
  return flush_writes();
}

bool Engine::writes_pending() const { return !pending_.empty(); }

absl::Status Engine::flush_writes(OpTimes* times, const TraceFn* trace) {
  // in the order the frames were made: the batch a step had, so the write is that step's own
  std::vector<Session*> pending;
  pending.swap(pending_);
  if (pending.empty()) return absl::OkStatus();
  // after the frames went out (defer_writes: the server has them already),
  // before the write: the audited blocks made again against the shadow
  if (absl::Status st = shadow_frames(pending, times); !st.ok()) {
    for (Session* s : pending) s->pending.reset();
    return st;
  }
  int frames = 0;
  for (const Session* s : pending) frames += static_cast<int>(s->pending->actions.size());
  const ModelConfig& c = config();
  const int64_t fv = c.frame_values();
  std::vector<float> host;
  host.reserve(static_cast<size_t>(frames) * fv);
  ForwardInput in;
  int f = 0;
  for (Session* s : pending) {
    const PendingWrite& w = *s->pending;
    const int n = static_cast<int>(w.actions.size());
    in.sessions.push_back({s->cache.get(), f, n, s->batch_invariant});
    host.insert(host.end(), w.values.begin(), w.values.end());
    for (int b = 0; b < n; ++b) {
      in.sigma.push_back(0.0f);
      in.actions.push_back(w.actions[static_cast<size_t>(b)]);
      in.frame_index.push_back(w.first + b);
    }
    f += n;
  }
  // written or not, these frames are done: a failed write fails the step, and the server ends the sessions
  for (Session* s : pending) s->pending.reset();
  WM_RETURN_IF_ERROR(reserve_buffers(frames));
  backend_->upload(pixels_, host.data(), host.size() * sizeof(float));
  const FrameShape shape{c.height, c.width, c.channels, c.patch};
  backend_->patchify(pixels_, frames, shape, x_);
  in.tokens = x_;
  in.write_pass = true;
  WM_RETURN_IF_ERROR(model_->forward(in, nullptr, times, trace));
  if (plugin_ != nullptr) WM_RETURN_IF_ERROR(plugin_->status());
  return absl::OkStatus();
}

absl::Status Engine::denoise(ForwardInput& in, std::span<const uint64_t> seeds, bool graphs, OpTimes* ops,
                             const TraceFn* trace, std::vector<float>* host) {
  const ModelConfig& c = config();
  const int frames = static_cast<int>(in.frame_index.size());
  const int64_t fv = c.frame_values();
  const FrameShape shape{c.height, c.width, c.channels, c.patch};
  backend_->noise_frames(seeds, in.frame_index, fv, pixels_);
  backend_->patchify(pixels_, frames, shape, x_);
  in.tokens = x_;

  const size_t steps = c.sigmas.size();
  std::vector<float> dt(static_cast<size_t>(frames));
  // the denoising passes differ only in what prepare_forward uploads: the
  // first is recorded, the others run the recording (options_.device_graphs)
  graphs = graphs && steps > 1;
  bool recorded = false;
  for (size_t i = 0; i < steps; ++i) {
    in.sigma.assign(static_cast<size_t>(frames), c.sigmas[i]);
    WM_RETURN_IF_ERROR(model_->prepare_forward(in, ops, trace));
    bool ran = false;
    if (graphs && i == 0) {
      if (backend_->prepare_recording(in.sessions, c.tokens_per_frame()) && backend_->graph_begin()) {
        const absl::Status pass = model_->run_forward(in, v_, ops, nullptr);
        const absl::Status ended = backend_->graph_end(/*keep=*/pass.ok());
        // not recorded: nothing ran, so the pass runs below as usual
        ran = recorded = pass.ok() && ended.ok();
      }
    } else if (recorded) {
      const auto t0 = std::chrono::steady_clock::now();
      WM_RETURN_IF_ERROR(backend_->graph_launch());
      ops->other += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ran = true;
    }
    if (!ran) WM_RETURN_IF_ERROR(model_->run_forward(in, v_, ops, trace));
    const float next = i + 1 < steps ? c.sigmas[i + 1] : 0.0f;
    std::fill(dt.begin(), dt.end(), next - c.sigmas[i]);
    backend_->upload(dt_, dt.data(), dt.size() * sizeof(float));
    backend_->euler_step(x_, v_, dt_, frames, fv, /*clamp=*/i + 1 == steps);
  }
  backend_->unpatchify(x_, frames, shape, pixels_);
  host->resize(static_cast<size_t>(frames) * fv);
  backend_->download(host->data(), pixels_, host->size() * sizeof(float));
  if (plugin_ != nullptr) WM_RETURN_IF_ERROR(plugin_->status());
  return absl::OkStatus();
}

absl::Status Engine::shadow_frames(std::span<Session* const> sessions, OpTimes* ops) {
  const ModelConfig& c = config();
  std::vector<Session*> picked;
  int frames = 0;
  for (Session* s : sessions)
    if (s->audit != nullptr && !s->pending->shadow_served.empty()) {
      picked.push_back(s);
      frames += static_cast<int>(s->pending->actions.size());
    }
  if (picked.empty()) return absl::OkStatus();
  WM_RETURN_IF_ERROR(reserve_buffers(frames));
  // the same block (seed, frame indices, actions: the same initial noise and
  // conditioning) with the shadow as each session's history; nothing is
  // written into any cache, and the shadow's attention changes nothing
  ForwardInput in;
  std::vector<uint64_t> seeds;
  for (Session* s : picked) {
    const PendingWrite& w = *s->pending;
    const int n = static_cast<int>(w.actions.size());
    in.sessions.push_back({&s->audit->shadow(), static_cast<int>(in.frame_index.size()), n, s->batch_invariant});
    for (int b = 0; b < n; ++b) {
      seeds.push_back(s->seed);
      in.actions.push_back(w.actions[static_cast<size_t>(b)]);
      in.frame_index.push_back(w.first + b);
    }
  }
  std::vector<float> host;
  WM_RETURN_IF_ERROR(denoise(in, seeds, /*graphs=*/false, ops, nullptr, &host));
  const int64_t fv = c.frame_values();
  size_t f = 0;
  for (Session* s : picked)
    for (const std::vector<uint8_t>& served : s->pending->shadow_served) {
      const std::vector<uint8_t> shadow = frame_rgb(host.data() + f++ * fv, c);
      s->audit->add_frame(served.data(), shadow.data(), served.size());
    }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StepResult>> Engine::step(std::span<const StepRequest> requests, StepStats* stats,
                                                     bool keep_values, const TraceFn* trace) {
  const auto t_start = std::chrono::steady_clock::now();
  const ModelConfig& c = config();
  const int B = c.frames_per_block;
  std::set<SessionId> seen;
  std::vector<Session*> sess;
  bool any_forced = false;
  for (const auto& r : requests) {
    auto it = sessions_.find(r.session);
    if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no session ", r.session));
    if (!seen.insert(r.session).second)
      return absl::InvalidArgumentError(absl::StrCat("session ", r.session, " appears twice in one step"));
    if (r.actions.size() != static_cast<size_t>(B))
      return absl::InvalidArgumentError(absl::StrCat("a block takes ", B, " actions, got ", r.actions.size()));
    for (const auto& a : r.actions) WM_RETURN_IF_ERROR(c.actions.validate(a));
    if (!r.force_frames.empty()) {
      if (r.force_frames.size() != static_cast<size_t>(B))
        return absl::InvalidArgumentError(absl::StrCat("force_frames needs ", B, " frames"));
      for (const auto& img : r.force_frames) WM_RETURN_IF_ERROR(validate_image(img));
      any_forced = true;
    }
    sess.push_back(&it->second);
  }
  const int frames = static_cast<int>(requests.size()) * B;
  if (frames == 0) return std::vector<StepResult>{};
  // the previous blocks' K/V first (defer_writes): this block attends to them
  OpTimes ops;
  WM_RETURN_IF_ERROR(flush_writes(&ops));
  WM_RETURN_IF_ERROR(reserve_buffers(frames));
  const int64_t fv = c.frame_values();

  // initial noise, a pure function of (seed, frame index), made by the backend
  ForwardInput in;
  std::vector<uint64_t> seeds;
  for (size_t r = 0; r < requests.size(); ++r) {
    in.sessions.push_back({sess[r]->cache.get(), static_cast<int>(r) * B, B, sess[r]->batch_invariant});
    for (int b = 0; b < B; ++b) {
      seeds.push_back(sess[r]->seed);
      in.actions.push_back(requests[r].actions[static_cast<size_t>(b)]);
      in.frame_index.push_back(sess[r]->generated + b);
    }
  }
  std::vector<float> host;
  WM_RETURN_IF_ERROR(denoise(in, seeds, options_.device_graphs && trace == nullptr, &ops, trace, &host));

  std::vector<StepResult> results(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    results[r].session = requests[r].session;
    for (int b = 0; b < B; ++b) {
      Frame fr;
      fr.index = sess[r]->generated + b;
      fr.action_seq = requests[r].actions[static_cast<size_t>(b)].seq;
      fr.width = c.width;
      fr.height = c.height;
      const float* src = host.data() + (r * B + b) * fv;
      fr.rgb = frame_rgb(src, c);
      if (keep_values) fr.values.assign(src, src + fv);
      results[r].frames.push_back(std::move(fr));
    }
  }

  // the block's clean frames (or the ones the request forces) go into the caches
  if (any_forced) {
    for (size_t r = 0; r < requests.size(); ++r)
      for (size_t b = 0; b < requests[r].force_frames.size(); ++b) {
        const auto& img = requests[r].force_frames[b];
        float* dst = host.data() + (r * B + b) * fv;
        for (size_t i = 0; i < img.pixels.size(); ++i) dst[i] = img.pixels[i] / 127.5f - 1.0f;
      }
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    PendingWrite w;
    w.first = sess[r]->generated;
    w.values.assign(host.begin() + static_cast<std::ptrdiff_t>(r * B * fv),
                    host.begin() + static_cast<std::ptrdiff_t>((r + 1) * B * fv));
    w.actions = requests[r].actions;
    // audited sessions: some blocks made again against the full-precision
    // shadow before their write (flush_writes), from the same history
    if (sess[r]->audit != nullptr && sess[r]->audit->shadow_block(w.first))
      for (const Frame& fr : results[r].frames) w.shadow_served.push_back(fr.rgb);
    sess[r]->pending = std::move(w);
    pending_.push_back(sess[r]);
    sess[r]->generated += B;
  }
  if (!options_.defer_writes) WM_RETURN_IF_ERROR(flush_writes(&ops, trace));

  if (stats != nullptr) {
    stats->sessions = static_cast<int>(requests.size());
    stats->frames = frames;
    stats->ops = ops;
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  }
  return results;
}

absl::StatusOr<SessionInfo> Engine::session_info(SessionId id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no session ", id));
  SessionInfo info;
  info.cache_format = std::string(it->second.cache->format());
  info.frames_generated = it->second.generated;
  info.kv = it->second.cache->bytes();
  info.kv_reserved = it->second.reserved;
  info.state_bytes = static_cast<int64_t>(sizeof(Session));
  return info;
}

KvCache* Engine::session_cache(SessionId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.cache.get();
}

int64_t Engine::kv_used_bytes() const {
  int64_t total = 0;
  for (const auto& [id, s] : sessions_) total += s.cache->bytes().total();
  return total;
}

}  // namespace wm

namespace wm {

std::map<std::string, DriftStats> Engine::drift_by_format() const {
  std::map<std::string, DriftStats> out = retired_drift_;
  for (const auto& [id, s] : sessions_)
    if (const DriftStats* d = s.cache->drift(); d != nullptr) out[std::string(s.cache->format())] += *d;
  return out;
}

}  // namespace wm
