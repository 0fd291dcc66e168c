// The CUDA backend behind the plugin ABI (plugin_entry.cc): owns the device,
// one stream, the KV page pool, cuBLASLt and the workspaces, and routes each
// op to its kernel's launcher. Dispatch only: every kernel lives in its own
// .cu file (STYLE.md 3). docs/CUDA.md describes the design.
//
// Threading: one thread at a time (the engine thread); all work is enqueued
// on stream(), and only download(), synchronize() and timer_stop() wait.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cuda/attention_plan.h"
#include "cuda/device_buffer.h"
#include "cuda/gemm.h"
#include "cuda/kv_pages.h"
#include "cuda/kv_span_host.h"
#include "cuda/page_pool.h"
#include "cuda/span_coder_choice.h"
#include "cuda/span_encode.cuh"
#include "cuda/staging_ring.h"
#include "cuda/tensor_map.h"
#include "engine/plugin_api.h"

namespace wm::cuda {

// a weight matrix uploaded as bf16 rows padded to ld (a multiple of 8) for 16-byte aligned GEMM operands
struct DeviceWeight {
  uint16_t* data = nullptr;  // [out, ld]
  int32_t out = 0, in = 0, ld = 0;
};

// one session's cache: bookkeeping (KvPages) over pages of the backend's
// pool; a span format's also its host coder (kv_span_host.h)
struct DeviceKvCache {
  uint64_t id = 0;           // never reused, unlike addresses (plans key on it)
  std::string format;
  WmKvGeometry geometry{};
  KvPages pages;
  PagePool::Owner owner = 0;
  std::unique_ptr<SpanHostCoder> span;
  std::vector<int32_t> stats_pages;      // QuantWM-2's running query statistics (query_gram.cuh)
  DeviceKvCache(uint64_t i, std::string f, const WmKvGeometry& g, const PagedGeometry& pg, PagePool::Owner o)
      : id(i), format(std::move(f)), geometry(g), pages(pg), owner(o) {}
};

// one cache's part of a batched append: frames [batch_frame, batch_frame +
// frames) of the batch's k, v become its frames first_frame, ...
struct KvWriteRequest {
  DeviceKvCache* kv = nullptr;
  int64_t first_frame = 0;
  int32_t batch_frame = 0;
  int32_t frames = 0;
};

// what kv_probe returns per sample, host memory
struct ProbeOutcome {
  int64_t tokens = 0;  // cached tokens ranked (0: none, nothing else is set)
  int32_t k = 0;       // tokens ranked per sample and cache: min(topk, tokens)
  std::vector<int32_t> ref_top, cand_top;  // [count][k], descending
  std::vector<double> sq_err;              // [count]: sum of (cand - ref)^2 over the tokens
  std::vector<int32_t> ref_nonfinite;      // [count]: reference logits that are not finite
  std::vector<float> ref_out, cand_out;    // [count][head_dim]
};

// the RoPE frequency of every channel pair, on the device (rms_norm_rope.cuh's RopeFreq [head_dim / 2])
struct RopeFreqTable {
  DeviceBuffer freqs;
};

// device-info query without creating a backend
absl::Status cuda_probe(int32_t device, WmPluginDeviceInfo* info);

class CudaBackend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> create(const WmPluginOptions& options);
  ~CudaBackend();
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  int32_t device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const WmPluginDeviceInfo& info() const { return info_; }
  absl::StatusOr<WmMemoryStats> memory_stats() const;
  absl::Status set_tuning(absl::string_view key, int64_t value);
  // a bf16 copy of an activation made by the last call stays valid for the
  // next linear() on the same input only; every other entry point drops it
  void invalidate_shadow() { shadow_.valid = false; }
  // the fp16 q and k that rms_norm_rope_qk wrote for the attention call(s)
  // after it; every entry point but attention() (and those that write no
  // device memory) drops them
  void invalidate_half_inputs() { half_inputs_.valid = false; }

  absl::StatusOr<void*> alloc(size_t bytes);
  void free(void* p);
  absl::Status upload(void* dst, const void* host, size_t bytes);
  absl::Status download(void* host, const void* src, size_t bytes);
  absl::Status synchronize();
  absl::Status timer_start();
  absl::StatusOr<double> timer_stop();
  absl::StatusOr<const DeviceWeight*> upload_weight(const float* host, int32_t out, int32_t in);

  absl::Status linear(const DeviceWeight* w, const float* bias, int32_t out, int32_t in, const float* x, int32_t n,
                      float* y);
  absl::Status layer_norm_modulate(const float* x, int32_t n, int32_t d, const float* shift, const float* scale,
                                   int32_t mod_stride, int32_t tokens_per_frame, float eps, float* y);
  absl::Status rms_norm_rope(float* x, int32_t n, int32_t heads, int32_t head_dim, int32_t row_stride,
                             const float* norm_w, const int32_t* pos, const WmRopeParams& rope, float eps);
  // q and k (each with its norm weight) in one launch; k may be null
  absl::Status rms_norm_rope_qk(float* q, const float* q_norm, float* k, const float* k_norm, int32_t n,
                                int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                                const WmRopeParams& rope, float eps);
  absl::Status gelu(float* x, int64_t count);
  // y = GELU_tanh(x W0^T + b0) W2^T + b2; hidden [n, hidden_dim] is scratch
  absl::Status ffn(const DeviceWeight* w0, const float* b0, const DeviceWeight* w2, const float* b2, int32_t in,
                   int32_t hidden_dim, int32_t out, const float* x, int32_t n, float* hidden, float* y);
  absl::Status gated_residual(float* h, const float* y, const float* gate, int32_t mod_stride, int32_t n, int32_t d,
                              int32_t tokens_per_frame);
  // gated_residual, then layer_norm_modulate of the new h into u: one launch
  absl::Status gated_residual_norm(float* h, const float* y, const float* gate, int32_t gate_stride, int32_t n,
                                   int32_t d, int32_t tokens_per_frame, const float* shift, const float* scale,
                                   int32_t mod_stride, float eps, float* u);
  absl::Status patchify(const float* frames, int32_t frames_count, const WmFrameShape& s, float* tokens);
  absl::Status unpatchify(const float* tokens, int32_t frames_count, const WmFrameShape& s, float* frames);
  absl::Status euler_step(float* x, const float* v, const float* dt_per_frame, int32_t frames_count,
                          int64_t values_per_frame, bool clamp);
  absl::Status add_rows(const float* rows, const float* per_block, int32_t n_rows, int32_t blocks, int32_t width,
                        float* out);
  // seeds, frames: host [count]
  absl::Status noise_frames(const uint64_t* seeds, const int64_t* frames, int32_t count, int64_t values_per_frame,
                            float* out);

  absl::StatusOr<int64_t> kv_reservation_bytes(absl::string_view format, const WmKvGeometry& g) const;
  absl::StatusOr<std::unique_ptr<DeviceKvCache>> kv_create(absl::string_view format, const WmKvGeometry& g);
  void kv_destroy(std::unique_ptr<DeviceKvCache> kv);
  absl::Status kv_append(DeviceKvCache& kv, int32_t layer, const float* k, const float* v, int64_t first_frame,
                         int32_t frames);
  // the write pass of one layer for several caches (one geometry, none
  // twice): one upload and one launch; all or nothing
  absl::Status kv_append(int32_t layer, std::span<const KvWriteRequest> writes, const float* k, const float* v);
  int64_t kv_bytes(const DeviceKvCache& kv) const {
    return (kv.pages.pages_held() + static_cast<int64_t>(kv.stats_pages.size())) * page_bytes_;
  }
  // host k, v [tokens, heads, head_dim] in frame order
  absl::Status kv_reconstruct(const DeviceKvCache& kv, int32_t layer, std::vector<float>* k, std::vector<float>* v);
  // audit mode's drift probes (kv_probe.cuh) for one attention call (q,
  // k_cur, v_cur: device [n, heads, head_dim]) of a candidate cache and a
  // reference holding the same frames, for `samples` (head, query) pairs
  // [count][2]: per sample, each cache's top `topk` tokens (frame order)
  // and attention output, and the squared logit differences
  absl::Status kv_probe(const DeviceKvCache& ref, const DeviceKvCache& cand, int32_t layer, const float* q,
                        const float* k_cur, const float* v_cur, int32_t n, std::span<const int32_t> samples,
                        int32_t topk, ProbeOutcome* out);

  // caches[i] owns rows [rows[i].row0, + rows[i].rows) (rows[i].cache is not read)
  absl::Status attention(int32_t layer, std::span<DeviceKvCache* const> caches, std::span<const WmSessionRows> rows,
                         const float* q, const float* k, const float* v, float* out);
  // makes (and uploads) the attention plan for this batch now, if the plan in
  // use does not fit it, and reserves its workspaces: a graph recorded next
  // needs neither an upload nor a growing buffer for attention
  absl::Status prepare_attention(std::span<DeviceKvCache* const> caches, std::span<const WmSessionRows> rows);
  // prepare_attention, and the activations' bf16 copies made as wide as the
  // widest seen so far for this batch's rows: a pass over a batch larger than
  // any before can then be recorded (a recording cannot grow a buffer)
  absl::Status prepare_recording(std::span<DeviceKvCache* const> caches, std::span<const WmSessionRows> rows);

  // ---- CUDA graphs over a forward pass (docs/CUDA.md, "Graphs") ----
  // from now on the stream's work is recorded, not run
  absl::Status graph_begin();
  // ends the recording; if every op recorded cleanly (and the caller keeps
  // it) the work becomes the graph (an update of the previous one where the
  // work has the same shape) and runs once. Else nothing ran:
  // FAILED_PRECONDITION, and the caller runs the ops again without a graph.
  // While recording, downloads, synchronisation and timers are refused and
  // frees wait for the end (and fail the recording)
  absl::Status graph_end(bool keep = true);
  // runs the last graph again
  absl::Status graph_launch();
  bool recording() const { return recording_; }
  // an op failed while recording: the graph would lack its work
  void recording_failed() { recording_broken_ = true; }

  // the plan the last attention() ran (tests and benchmarks report it)
  const AttentionPlan& last_plan() const;
  // "gemm.cublaslt_calls", "gemm.fallback_calls", "attention.plans" (made),
  // "attention.launches" (layers attended); NOT_FOUND for other names
  absl::StatusOr<int64_t> counter(absl::string_view name) const;

 private:
  // an activation's bf16 copy (GEMM operand): rows x cols in rows of ld
  struct Shadow {
    bool valid = false;
    const float* src = nullptr;
    int64_t rows = 0, cols = 0, ld = 0;
  };
  // what an attention plan was made from
  struct PlanKey {
    std::vector<std::tuple<uint64_t, int32_t, int32_t>> sessions;  // cache id, row0, rows
    std::vector<uint64_t> versions;                                // [sessions][layers]
    int64_t tuning = -1;
  };
  // a plan, its upload and what it was made from. A step may attend in
  // several calls (a batch-invariant session has its own: engine/backend.h),
  // so the plans of the last calls are kept, each with its own device copy
  struct PlanSlot {
    AttentionPlan plan;
    AttentionPlan::Layout layout;
    DeviceBuffer memory;
    PlanKey key;
    uint64_t used = 0;  // plan_clock_ at its last use
    int32_t layer = -1;  // the layer of that use (-1: a prepare)
  };

  CudaBackend() = default;
  absl::Status init(const WmPluginOptions& options);
  // the pool's pages of one format, for a kernel, through page_table
  PagedKvFp16View fp16_view(const int32_t* page_table, const PagedGeometry& g) const;
  PagedKvKiviView kivi_view(const int32_t* page_table, const PagedGeometry& g) const;
  PagedKvSpanView span_view(const int32_t* page_table, const PagedGeometry& g) const;
  // the page layout of a format (fp16, kivi2, qvg2 or quantwm2) for g, or why the device cannot hold it
  absl::StatusOr<PagedGeometry> paged_geometry(absl::string_view format, const WmKvGeometry& g) const;
  // the write pass of span caches: the host books the spans, the coder
  // (span_encode.cuh; or the host's, tuning "span.coder") makes each
  // frame's image, a scatter puts the images into the pages
  absl::Status kv_append_span(int32_t layer, std::span<const KvWriteRequest> writes,
                              const std::vector<KvAppendPlan>& plans, const std::vector<std::vector<int32_t>>& tables,
                              const float* k, const float* v);
  // the coder's jobs on the host (tuning "span.coder" 2 or 3, and the auto
  // choice's checks): downloads their rows (and waits for the queued
  // download of *params, the QSAC weights), runs the CPU's coder, and
  // writes the k-means centroids of a job with job.given >= 0 at given +
  // job.given (2), or, for the other jobs and for every job when given is
  // null, its codes and tables into image, where the device's coder would
  // put them (3)
  absl::Status code_spans_on_host(const SpanRowLayout& L, int32_t heads, int32_t coeff_bits,
                                  const std::vector<SpanEncodeJob>& jobs, const std::vector<int64_t>& frame_images,
                                  const std::vector<float>& params, float* given, uint8_t* image);
  // a checked append of the auto choice: the device's image (image_bytes at
  // device_image, its coder queued) against the host coder's, byte for
  // byte; where they differ the host's replaces the device's, so that the
  // append stores the CPU's codes, and the choice moves a rung down
  absl::Status check_span_image(const SpanRowLayout& L, int32_t heads, int32_t coeff_bits,
                                const std::vector<SpanEncodeJob>& jobs, const std::vector<int64_t>& frame_images,
                                const std::vector<float>& params, uint8_t* device_image, int64_t image_bytes);
  // QuantWM-2's query statistics: the rows of each span cache that observes them
  absl::Status observe_queries(int32_t layer, std::span<DeviceKvCache* const> caches,
                               std::span<const WmSessionRows> rows, const float* q);
  // x [n, in] fp32 as a GEMM operand: bf16 rows of ld, the valid copy when
  // there is one, else converted now (and kept as the copy)
  absl::StatusOr<const uint16_t*> bf16_operand(const float* x, int32_t n, int32_t in, int32_t ld);
  absl::StatusOr<const RopeFreqTable*> rope_table(const WmRopeParams& rope, int32_t head_dim);
  // the kept plan made from these caches and rows whose caches have not
  // changed at `layer` since; null if none
  PlanSlot* fitting_plan(int32_t layer, std::span<DeviceKvCache* const> caches,
                         std::span<const WmSessionRows> rows) const;
  // a fitting plan: kept, else made and uploaded now
  absl::StatusOr<PlanSlot*> plan_for(int32_t layer, std::span<DeviceKvCache* const> caches,
                                     std::span<const WmSessionRows> rows);
  absl::StatusOr<PlanSlot*> make_plan(std::span<DeviceKvCache* const> caches, std::span<const WmSessionRows> rows);

  int32_t device_ = 0;
  WmPluginDeviceInfo info_{};
  cudaStream_t stream_ = nullptr;
  cudaEvent_t timer_begin_ = nullptr, timer_end_ = nullptr;
  std::unique_ptr<Gemm> gemm_;

  // KV page pool: one allocation, bookkeeping in PagePool
  int64_t page_bytes_ = 0;
  DeviceBuffer pool_memory_;
  PagePool pool_;
  // tensors for TMA (cuda/tensor_map.h), CUtensorMaps of 128 bytes in
  // device memory: the pool for head_dim 64 and 128, encoded once at
  // start-up (false where the driver has no encoder or refuses the shape),
  // then qkv16_'s rows for head_dim 64 and 128, encoded again whenever
  // qkv16_ grows
  DeviceBuffer tensor_maps_;
  TensorMapEncodeTiled tensor_map_encoder_ = nullptr;
  bool tensor_maps_ready_ = false, block_maps_ready_ = false;
  std::pair<const void*, size_t> block_maps_of_{nullptr, 0};  // the qkv16_ they describe
  void encode_tensor_maps();
  void encode_block_maps();
  uint64_t next_cache_id_ = 1;

  std::vector<std::unique_ptr<DeviceWeight>> weights_;
  DeviceBuffer weight_staging_;
  DeviceBuffer shadow_memory_;
  Shadow shadow_;
  DeviceBuffer ffn_hidden_;  // the feed-forward block's hidden layer, bf16 [n][w2->ld]
  // the widest row (bytes) each of the two has held, for prepare_recording
  size_t shadow_row_bytes_ = 0, ffn_hidden_row_bytes_ = 0;
  // grows `buffer` to rows x row_bytes; `widest` remembers the widest row
  static absl::Status reserve_rows(DeviceBuffer& buffer, size_t& widest, int64_t rows, size_t row_bytes);
  bool fused_ffn_ = true;    // tuning "ffn.fused"
  int64_t ffn_fused_calls_ = 0;
  std::map<std::tuple<uint32_t, int32_t, int32_t, int32_t, int32_t>, std::unique_ptr<RopeFreqTable>> rope_tables_;

  // attention
  DeviceBuffer append_scratch_;
  DeviceBuffer noise_scratch_;  // a batch's seeds and frame indices
  int64_t append_launches_ = 0;
  int64_t probe_launches_ = 0;  // kv_probe calls that ran the kernels
  int64_t kivi_attention_launches_ = 0, span_attention_launches_ = 0;
  int64_t span_appends_ = 0;                  // window frames coded
  // the host's time inside span appends (counters kv.span_append_host_us and
  // kv.span_append_wait_us): the whole of it, and of that the waits for the
  // device (the statistics' downloads, the checks', a host coder's rows)
  int64_t span_append_ns_ = 0, span_append_wait_ns_ = 0;
  bool in_span_append_ = false;  // synchronize() adds its wait to span_append_wait_ns_
  int64_t span_encode_launches_ = 0;
  // the span coder's scratch per launch (rows, centroids, k-means state:
  // some 1.4 MB per head and side of a Matrix-Game-2 block); a write pass
  // with more runs in rounds
  static constexpr int64_t kSpanScratchBytes = int64_t{64} << 20;
  int64_t span_scratch_bytes_ = kSpanScratchBytes;  // tuning "span.scratch_bytes"
  int32_t span_threads_ = 0;                         // tuning "span.threads"
  // where the span formats are coded (tuning "span.coder"): the device
  // (span_encode.cuh), k-means on the host with the tokens' codes on the
  // device, or the host (quant/span_codec.h), which makes the CPU cache's
  // codes by construction; the device scatters the image in every case.
  // 0: the default, WM_CUDA_SPAN_CODER's, else "auto": span_choice_, which
  // checks the first appends against the host's coder (span_coder_choice.h)
  static constexpr int32_t kSpanCoderDevice = SpanCoderChoice::kDevice,
                           kSpanCoderHostKmeans = SpanCoderChoice::kHostKmeans, kSpanCoderHost = SpanCoderChoice::kHost;
  static constexpr int32_t kDefaultSpanChecks = 16;
  int32_t span_coder_tuning_ = 0;
  int32_t span_coder_pinned_ = 0;                    // WM_CUDA_SPAN_CODER's coder; 0: auto
  int32_t default_span_checks_ = kDefaultSpanChecks;  // WM_CUDA_SPAN_CHECKS
  SpanCoderChoice span_choice_{kDefaultSpanChecks};
  bool span_check_fault_ = false;  // tuning "span.check_fault": every check sees a difference (a drill)
  int32_t span_coder() const { return span_coder_tuning_ != 0 ? span_coder_tuning_ : span_choice_.coder(); }
  // the auto choice from the device again, `checks` appends per rung checked (0: the default)
  void restart_span_choice(int32_t checks);
  int64_t span_jobs_host_coded_ = 0;
  // QuantWM-2's query statistics: the jobs of an attention call (its
  // observing sessions' rows and heads, their statistics pages) and the
  // calls' row flags, uploaded once per batch composition and kept for the
  // last kGramJobSets, so that a recorded pass uploads nothing
  struct GramJobSet {
    std::vector<std::tuple<uint64_t, int32_t, int32_t>> key;  // cache id, row0, rows of each observing session
    DeviceBuffer memory;  // jobs, then the sessions' page lists, then the flags
    int32_t n_jobs = 0, head_dim = 0;
    int64_t layer_doubles = 0;
    size_t flags_at = 0;
    uint64_t used = 0;
  };
  static constexpr size_t kGramJobSets = 8;
  std::vector<std::unique_ptr<GramJobSet>> gram_sets_;
  uint64_t gram_clock_ = 0;
  // the set for these caches and rows: kept, else made and uploaded now
  // (refused while recording); null when no session observes its queries
  absl::StatusOr<const GramJobSet*> gram_jobs(std::span<DeviceKvCache* const> caches,
                                              std::span<const WmSessionRows> rows);
  // a layer's running statistics of each observing cache of a write pass,
  // downloaded into its coder (the append reads them)
  absl::Status download_statistics(int32_t layer, std::span<const KvWriteRequest> writes);
  std::vector<double> gram_host_;  // that download
  int64_t gram_launches_ = 0, gram_downloads_ = 0, qsac_weight_launches_ = 0;
  std::vector<uint8_t> span_upload_;          // the write pass's upload
  // uploads of the step path go through pinned memory (staging_ring.h);
  // without it (cudaHostAlloc refused) they copy from pageable memory
  static constexpr size_t kStagingBytes = size_t{8} << 20;
  static constexpr size_t kStagingEvents = 32;
  void* staging_host_ = nullptr;
  std::vector<cudaEvent_t> staging_events_;
  std::unique_ptr<StagingRing> staging_;
  int64_t staged_uploads_ = 0, pageable_uploads_ = 0;
  // host -> device in stream order; `host` may change as soon as this returns
  absl::Status copy_to_device(void* dst, const void* host, size_t bytes);
  // LayerNorm + modulation of x into y (and its bf16 copy); with ry, first
  // x += gate_f * ry (the gated residual) in the same launch
  absl::Status norm_modulate(float* x, const float* ry, const float* gate, int32_t gate_stride, int32_t n, int32_t d,
                             int32_t tokens_per_frame, const float* shift, const float* scale, int32_t mod_stride,
                             float eps, float* y);
  // a plan's conversion and partial-result buffers (shared by all plans:
  // their calls run one after another in stream order)
  absl::Status reserve_attention_workspaces(const AttentionPlan& p);
  // graphs
  bool recording_ = false, recording_broken_ = false;
  std::vector<void*> frees_after_recording_;
  // rows, split, block_q of each attention call of the recorded pass, and the tuning generation
  using GraphKey = std::pair<std::vector<std::tuple<int32_t, bool, int32_t, int32_t>>, int64_t>;
  struct GraphSlot {
    GraphKey key;
    cudaGraphExec_t exec = nullptr;
    uint64_t used = 0;
  };
  static constexpr size_t kGraphSlots = 8;
  std::vector<GraphSlot> graph_slots_;
  cudaGraphExec_t graph_exec_ = nullptr;  // the last recorded (one of the slots)
  uint64_t graph_clock_ = 0;
  int64_t graphs_recorded_ = 0, graph_recordings_failed_ = 0, graph_launches_ = 0, graphs_instantiated_ = 0;
  std::vector<std::tuple<int32_t, bool, int32_t, int32_t>> recorded_attention_;  // the recording's calls (GraphKey): rows, split, query tile, KIVI group (0: fp16)
  DeviceBuffer qkv16_;
  // q and k as the attention kernels read them (fp16 [heads, rows,
  // head_dim] in qkv16_), written by rms_norm_rope_qk with its results:
  // attention() then converts v alone (tuning "attention.fused_inputs")
  struct HalfInputs {
    bool valid = false;
    const float *q = nullptr, *k = nullptr;  // the fp32 tensors they are copies of
    const void* buffer = nullptr;            // qkv16_ as it was (a reserve that grows it drops them)
    size_t buffer_bytes = 0;
    int32_t rows = 0, heads = 0, head_dim = 0;
  };
  HalfInputs half_inputs_;
  bool fused_inputs_ = true;
  int64_t fused_input_calls_ = 0;  // attention calls that converted v alone
  // attention() also writes its output in bf16 into the activation copy
  // (shadow_), as the output projection's operand, where the call writes
  // every row of the batch (tuning "attention.bf16_output")
  bool attention_bf16_output_ = true;
  int64_t bf16_output_calls_ = 0;  // attention calls that wrote it
  int64_t operand_conversions_ = 0;  // fp32 -> bf16 conversions of a linear's input (bf16_operand)
  DeviceBuffer partials_;
  DeviceBuffer probe_memory_;  // the drift probes' inputs, logits, partials and outputs (audit mode only)
  // kept plans: at least kPlanSlots, and all of the current pass's; when a
  // new one needs a slot the least recently used that the pass has not used goes
  static constexpr size_t kPlanSlots = 64;
  std::vector<std::unique_ptr<PlanSlot>> plan_slots_;
  const PlanSlot* last_plan_ = nullptr;
  uint64_t plan_clock_ = 0;
  uint64_t pass_start_ = 0;  // plan_clock_ of the current pass's first use
  bool last_use_was_prepare_ = false;
  int32_t last_use_layer_ = -1;
  int64_t plans_made_ = 0, attention_launches_ = 0;

  // tuning (set_tuning): see docs/CUDA.md
  PlanTuning plan_tuning_;
  // attention kernels: 1 mma.sync, 2 wgmma, 3 wgmma with the softmax
  // overlapped (on compute capability 9.0; 2: head_dim 128, where 64 runs
  // 3; 3: head_dim 64/128); tuning "attention.kernel" 0 means the default:
  // WM_CUDA_ATTENTION's choice at start-up, else 4 for 128-query tiles at
  // head_dim 128 and 3 for the rest where they run, else 1
  // 4: the warp-specialised kernel (attention_ws.cuh: a producer warp,
  // named barriers; head_dim 64/128 on compute capability 9.0)
  static constexpr int32_t kMma = 1, kWgmma = 2, kOverlap = 3, kWs = 4;
  int32_t attention_kernel_ = 0, default_attention_kernel_ = 0;
  // "attention.stages" (3..6; kernel 3 runs 3..5, 6 as 5) 0: the default,
  // WM_CUDA_ATTENTION_STAGES at start-up, else kDefaultStages for kernel 3
  // docs/CUDA.md, "Split-KV": 3 stages hold two CTAs per SM at head_dim 128
  static constexpr int32_t kDefaultStages = 3;
  int32_t attention_stages_ = 0, default_attention_stages_ = 0;
  // kernel 3 with two warpgroups: ping-pong their MMAs ("attention.pingpong"
  // 0 or 1; -1: the default, WM_CUDA_ATTENTION_PINGPONG at start-up, else
  // kDefaultPingpong)
  static constexpr int32_t kDefaultPingpong = 1;  // docs/PERFORMANCE.md: 6-12% at 2640 queries
  int32_t attention_pingpong_ = -1, default_attention_pingpong_ = kDefaultPingpong;
  int32_t pingpong() const { return attention_pingpong_ >= 0 ? attention_pingpong_ : default_attention_pingpong_; }
  int32_t overlap_stages() const;
  // kernel 4's K/V stages asked for: "attention.stages" or
  // WM_CUDA_ATTENTION_STAGES where set, else kDefaultWsStages (4 stages of
  // 64 keys: 2,682 us at 2640 queries over 65,120 cached tokens on the H200,
  // 3 stages of 128 keys 3,044; docs/PERFORMANCE.md); what runs is
  // attention_sm90_ws_stages of it (3 with 128 keys a step; 3 or 4 by
  // cp.async, 3 to 6 by TMA at 64)
  static constexpr int32_t kDefaultWsStages = 4;
  int32_t ws_stages() const;
  // the TMA build's deepest ring at 64 keys a step that fits every head size
  // and query tile here (4 to 6; measured at start-up)
  int32_t ws_tma_max_stages_ = 4;
  // kernel 4's keys per step for a plan of block_q ("attention.ws_keys" 64
  // or 128; 0: the default, WM_CUDA_ATTENTION_WS_KEYS at start-up, else 64)
  int32_t attention_ws_keys_ = 0, default_attention_ws_keys_ = 0;
  int32_t ws_keys(int32_t block_q) const;
  // kernel 4 copies whole key tiles by TMA ("attention.ws_tma" 0 or
  // 1; -1: the default, WM_CUDA_ATTENTION_WS_TMA at start-up, else 0 until
  // the H200 has timed it); only where ws_tma_ready_
  int32_t attention_ws_tma_ = -1, default_attention_ws_tma_ = 0;
  bool ws_tma() const;
  // kernel 4 with its loads or its consumers' work taken out
  // ("attention.ws_ablate" 1 or 2, AttentionArgs::ws_ablate; 0: neither):
  // a benchmark's diagnosis, whose outputs are wrong
  int32_t attention_ws_ablate_ = 0;
  bool ws_tma_ready_ = false;  // the tensor maps, and every TMA instantiation fits an SM
  int64_t ws_tma_launches_ = 0;
  void measure_ctas_per_sm();
  bool sm90_ready_ = false;  // compute capability 9.0 and the sm_90a kernels loaded
  bool span_ready_ = false, span_sm90_ready_ = false;  // the span formats' mma.sync and sm_90a kernels loaded
  bool ws_ready_ = false;    // and the occupancy calculator fits every warp-specialised instantiation
  // the kernel that attends head_dim in tiles of block_q queries now (0: none)
  int32_t kernel_for(int32_t head_dim, int32_t block_q) const;
  // CTAs per SM, [kernel - 1][head_dim 32, 64, 128][block_q 64, 128]
  static constexpr std::array<int32_t, 3> kHeadDims = {32, 64, 128};
  std::array<std::array<std::array<int32_t, 2>, 3>, 4> ctas_per_sm_{};
  int64_t sm90_launches_ = 0, overlap_launches_ = 0, ws_launches_ = 0;
  bool use_shadow_ = true;
  int64_t tuning_generation_ = 0;
};

}  // namespace wm::cuda
