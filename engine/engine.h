// The engine's public API, used by the server, wmgen, wmeval and wmquant:
// open a session, step a batch of sessions (one block each), read the frames,
// close. It never blocks on anything but its own compute.
//
// Threading: an Engine is not thread-safe. The server calls it from its one
// engine thread only; tools call it from main.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/image_io.h"
#include "engine/action.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "quant/kv_cache.h"

namespace wm {

class AuditedKvCache;
class PluginBackend;

using SessionId = uint64_t;

struct EngineOptions {
  std::string model_dir;             // config.json + model.safetensors
  // "cpu", "cuda" (the plugin libwm_cuda.so and a GPU, or an error) or "auto"
  // (cuda when the plugin loads and a GPU is there, else cpu; device_note() says why)
  std::string device = "cpu";
  std::string cuda_plugin;           // libwm_cuda.so; empty: beside the executable, then the loader's search path
  int cuda_device = 0;
  int64_t kv_page_bytes = int64_t{64} << 10;  // CUDA KV page size (a multiple of 32 KiB)
  // a failed device op aborts the process (the GPU context is lost anyway);
  // false: the step fails with the device's error instead (tests)
  bool abort_on_device_error = true;
  int threads = 0;                   // 0: the libraries' defaults
  int64_t kv_budget_bytes = int64_t{2} << 30;
  KvFormatOptions kv_options;
  // step() returns a block's frames before the pass that writes their K/V
  // into the caches (one forward of the 1 + denoising steps a block costs);
  // that write runs at flush_writes() or at the start of the next step. The
  // server flushes right after handing the frames out: the frames reach the
  // players one forward earlier, and no computation changes.
  bool defer_writes = false;
  // on a device that can (CUDA): the first denoising pass of a step is
  // recorded as a graph and the others run that recording, which skips the
  // host's work of issuing every op again (docs/CUDA.md, "Graphs")
  bool device_graphs = false;
  // every session batch-invariant (SessionOptions::batch_invariant): its
  // frames are exactly those it gets stepped alone on this backend (on the
  // CPU backend: and from wmgen), whatever else shares its batch, since its dense ops run on
  // their own instead of once over the batch (a GEMM's rounding may depend on
  // how many rows it has), and on a device its attention too (the plan, how
  // its keys are split across blocks, would depend on the batch)
  bool batch_invariant = false;
  // audited sessions (SessionOptions::audit): the fraction of their blocks
  // made a second time with the full-precision shadow as the history, whose
  // frames' PSNR against the served ones DriftStats keeps (0..1; 0: none;
  // docs/QUANT.md, "Audit mode")
  double audit_block_fraction = 0.125;
  // random weights instead of a checkpoint (benchmarks of scale configs)
  bool random_weights = false;
  uint64_t random_seed = 0;
  std::string config_path;           // with random_weights: the config to use
};

struct SessionOptions {
  uint64_t seed = 0;
  std::string cache_format = "fp16";
  // ground-truth frames written into the cache before the first block
  // (the prompt); each must be the model's frame size
  std::vector<Rgb8Image> prompt;
  // keep a full-precision shadow of the cache and measure drift against it
  bool audit = false;
  // this session's frames are exactly those it gets stepped alone, whatever
  // shares its batch (its dense ops, and on a device its attention, run on
  // their own). EngineOptions::batch_invariant sets it for all
  bool batch_invariant = false;
  // wraps the session's cache once it is created (wmquant's capture); may be empty
  std::function<std::unique_ptr<KvCache>(std::unique_ptr<KvCache>)> wrap_cache = nullptr;
};

struct Frame {
  int64_t index = 0;                 // absolute frame index in the session
  uint64_t action_seq = 0;           // seq of the action that produced it
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;          // [height, width, 3]
  std::vector<float> values;         // [height, width, channels] in [-1, 1] (when asked for)
};

struct StepRequest {
  SessionId session = 0;
  std::vector<Action> actions;       // exactly frames_per_block
  // when set (frames_per_block images), the block is still sampled and
  // returned, but these frames are written into the cache instead (teacher
  // forcing for evaluation)
  std::vector<Rgb8Image> force_frames;
};

struct StepResult {
  SessionId session = 0;
  std::vector<Frame> frames;
};

struct StepStats {
  int sessions = 0;
  int frames = 0;
  double seconds = 0;
  OpTimes ops;
};

struct SessionInfo {
  std::string cache_format;
  int64_t frames_generated = 0;
  KvBytes kv;                        // exact bytes held now
  int64_t kv_reserved = 0;           // what admission set aside (the most it can hold)
  int64_t state_bytes = 0;           // everything else the session holds
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> create(const EngineOptions& options);
  ~Engine();

  const ModelConfig& config() const { return model_->config(); }
  const std::string& device() const { return device_; }
  // on a GPU, which one and its attention kernel; on "auto" fallen back to
  // the CPU, why; empty on "cpu"
  const std::string& device_note() const { return device_note_; }
  // GPU memory and the device KV pool (zeros on the CPU)
  BackendMemory device_memory() const { return backend_->memory(); }
  // the device plugin behind the engine (its counters; tuning), null on the CPU
  const PluginBackend* device_plugin() const { return plugin_; }
  PluginBackend* device_plugin() { return plugin_; }
  std::vector<std::string> cache_formats() const;
  int64_t parameter_count() const { return config().parameter_count(); }

  // RESOURCE_EXHAUSTED when the session's worst-case cache does not fit the budget
  absl::StatusOr<SessionId> open_session(const SessionOptions& options);
  absl::Status close_session(SessionId id);
  bool has_session(SessionId id) const { return sessions_.count(id) != 0; }
  size_t session_count() const { return sessions_.size(); }

  // one block for every request (at most one request per session), as one batch
  absl::StatusOr<std::vector<StepResult>> step(std::span<const StepRequest> requests, StepStats* stats = nullptr,
                                               bool keep_values = false, const TraceFn* trace = nullptr);

  // allocates now the buffers a step of `sessions` blocks needs (they
  // otherwise grow at the first step that large): a device too small for
  // the largest batch fails here, at start-up, instead of in a step
  absl::Status reserve_batch(int sessions);

  // writes the K/V of every block step() returned but has not written yet
  // (defer_writes), as one batched pass; a no-op when none is pending. Until
  // then session_info() and kv_used_bytes() count the caches without them.
  absl::Status flush_writes(OpTimes* times = nullptr, const TraceFn* trace = nullptr);
  bool writes_pending() const;

  absl::StatusOr<SessionInfo> session_info(SessionId id) const;
  KvCache* session_cache(SessionId id);  // for probes (audit mode, wmquant)

  int64_t kv_capacity_bytes() const { return options_.kv_budget_bytes; }
  int64_t kv_reserved_bytes() const { return reserved_; }
  int64_t kv_used_bytes() const;
  // the KV bytes one session of `format` reserves (0: the format does not
  // fit this model); with `audit`, its full-precision shadow's too
  int64_t session_reservation(absl::string_view format, bool audit = false) const;
  // OK when this engine's backend can hold the format with these options, else why not
  absl::Status kv_format_status(absl::string_view format, const KvFormatOptions& options) const;
  // whether sessions can be audited on this engine's device (every backend:
  // the shadow is an fp32 cache on the CPU, an fp16 cache of a device's own)
  bool audit_supported() const;
  // EngineOptions::batch_invariant: every session is
  bool all_batch_invariant() const { return options_.batch_invariant; }
  KvGeometry kv_geometry() const;
  const KvFormatOptions& kv_options() const { return options_.kv_options; }
  // drift of every audited session so far (open and closed), summed per cache format
  std::map<std::string, DriftStats> drift_by_format() const;

 private:
  // frames generated (or given as a prompt) whose K/V are not in the cache yet
  struct PendingWrite {
    std::vector<float> values;   // [frames][frame_values], in [-1, 1]
    std::vector<Action> actions;  // the conditioning of each frame
    int64_t first = 0;           // the first frame's index
    // audit mode: the block's frames as served (8-bit RGB), when the block
    // is to be made again against the shadow before its write (empty: not)
    std::vector<std::vector<uint8_t>> shadow_served;
  };
  struct Session {
    uint64_t seed = 0;
    int64_t generated = 0;  // frames produced; those of `pending` are not in the cache yet
    int64_t reserved = 0;
    std::unique_ptr<KvCache> cache;
    AuditedKvCache* audit = nullptr;  // inside `cache` when the session is audited
    std::optional<PendingWrite> pending;
    bool batch_invariant = false;
  };
  Engine() = default;
  absl::Status write_frames(std::span<Session* const> sessions, std::span<const std::vector<Rgb8Image>* const> images);
  absl::Status validate_image(const Rgb8Image& img) const;
  // the denoising passes of one block for every session of `in` (its
  // sessions, actions and frame indices set; seeds per frame) from their
  // initial noise; the clean frames, [frames][H, W, C], into *host
  absl::Status denoise(ForwardInput& in, std::span<const uint64_t> seeds, bool graphs, OpTimes* ops,
                       const TraceFn* trace, std::vector<float>* host);
  // audit mode: the pending blocks that carry their served frames made
  // again against their session's shadow, which holds the history they
  // were made from (their write has not run), and the frames' differences
  // added to its drift
  absl::Status shadow_frames(std::span<Session* const> sessions, OpTimes* ops);

  EngineOptions options_;
  std::string device_;
  std::string device_note_;
  std::unique_ptr<Backend> backend_;
  PluginBackend* plugin_ = nullptr;  // backend_ when it is a device plugin
  std::unique_ptr<Model> model_;
  std::map<SessionId, Session> sessions_;
  std::vector<Session*> pending_;  // sessions with a pending write, in the order they got it
  SessionId next_id_ = 1;
  int64_t reserved_ = 0;
  std::map<std::string, DriftStats> retired_drift_;  // audited sessions already closed
  float* x_ = nullptr;              // backend [frames * T, P] tokens being denoised
  float* v_ = nullptr;              // backend [frames * T, P] velocity
  float* pixels_ = nullptr;         // backend [frames, H, W, C]
  float* dt_ = nullptr;             // backend [frames]
  int buffer_frames_ = 0;
  absl::Status reserve_buffers(int frames);
};

}  // namespace wm
