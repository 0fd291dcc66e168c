// The compute backend: every op the model needs, on memory the backend owns.
//
// The CPU backend (backend_cpu.cc) implements every op and is the reference;
// other backends (the CUDA plugin, loaded with dlopen behind the versioned C
// ABI in plugin_api.h) answer supports(op) and are tested op by op against
// the CPU (tests/engine/backend_ops_test.cc).
//
// Pointers passed to ops are backend memory (alloc()); on the CPU backend that
// is host memory. Shapes are in the comments; all activations are fp32 rows.
// Threading: a backend is used by one thread at a time (the engine thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include <span>

#include "absl/status/statusor.h"
#include "engine/noise.h"
#include "quant/kv_cache.h"

namespace wm {

enum class BackendOp : int32_t {
  linear = 0,
  layer_norm_modulate,
  rms_norm_rope,
  gelu,
  gated_residual,
  patchify,
  unpatchify,
  euler_step,
  attention,
  count
};

// a weight matrix W [out, in] (y = x W^T + b) uploaded once at load
struct LinearWeight {
  const void* w = nullptr;   // backend handle of W (fp32 on the CPU, bf16 on CUDA)
  const float* b = nullptr;  // [out] or null, backend memory
  int out = 0;
  int in = 0;
};

struct RopeParams {
  float theta = 10000.0f;
  int t_pairs = 0, h_pairs = 0, w_pairs = 0;
};

struct FrameShape {
  int height = 0, width = 0, channels = 0, patch = 0;
  int grid_h() const { return height / patch; }
  int grid_w() const { return width / patch; }
  int tokens() const { return grid_h() * grid_w(); }
  int patch_dim() const { return channels * patch * patch; }
};

// device memory, for metrics and admission (all zero on the CPU backend)
struct BackendMemory {
  int64_t device_total = 0, device_free = 0;
  int64_t kv_pool_capacity = 0;   // bytes of KV pages the backend holds
  int64_t kv_pool_reserved = 0;   // promised to open caches (their worst case)
  int64_t kv_pool_used = 0;       // holding data now
};

// a session's frames inside a batch
struct SessionSlice {
  KvCache* cache = nullptr;
  int batch_frame = 0;        // first frame of this session in the batch
  int frames = 0;
  // batch-invariant: the model runs this session's dense ops on their own
  // (SessionOptions::batch_invariant)
  bool invariant = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::string_view name() const = 0;
  virtual bool supports(BackendOp op) const = 0;

  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* src, size_t bytes) = 0;
  // weight W [out, in] from host fp32; the handle lives until the backend dies
  virtual const void* upload_weight(const float* host, int out, int in) = 0;

  // y[n, out] = x[n, in] W^T + b
  virtual void linear(const LinearWeight& w, const float* x, int n, float* y) = 0;
  // y[n, d] = LN(x) * (1 + scale_f) + shift_f, f = token / tokens_per_frame;
  // shift/scale rows of frame f at shift + f * mod_stride
  virtual void layer_norm_modulate(const float* x, int n, int d, const float* shift, const float* scale,
                                   int mod_stride, int tokens_per_frame, float eps, float* y) = 0;
  // in place on x [n, heads, head_dim] (row stride `row_stride` floats):
  // per-head RMSNorm with weight norm_w [head_dim], then 3-D RoPE at pos [n, 3] (t, row, col)
  virtual void rms_norm_rope(float* x, int n, int heads, int head_dim, int row_stride, const float* norm_w,
                             const int32_t* pos, const RopeParams& rope, float eps) = 0;
  // rms_norm_rope of q with q_norm and of k with k_norm (same shape, distinct
  // tensors) in one pass where the backend can; the default runs it twice
  virtual void rms_norm_rope_qk(float* q, const float* q_norm, float* k, const float* k_norm, int n, int heads,
                                int head_dim, int row_stride, const int32_t* pos, const RopeParams& rope, float eps) {
    rms_norm_rope(q, n, heads, head_dim, row_stride, q_norm, pos, rope, eps);
    rms_norm_rope(k, n, heads, head_dim, row_stride, k_norm, pos, rope, eps);
  }
  // out[b, r, :] = rows[r, :] + per_block[b, :] for b < blocks, r < n_rows
  // (rows [n_rows, width], per_block [blocks, width]): every layer's
  // modulation from the frame's conditioning and the layer's own vector
  virtual void add_rows(const float* rows, const float* per_block, int n_rows, int blocks, int width,
                        float* out) = 0;
  // x = GELU_tanh(x), count values
  virtual void gelu(float* x, int64_t count) = 0;
  // the feed-forward block: y[n, w2.out] = GELU_tanh(x W0^T + b0) W2^T + b2.
  // hidden [n, w0.out] is scratch: its contents afterwards are unspecified (a
  // device may keep the hidden layer in its own form and never write it).
  // The default is linear, gelu, linear through hidden.
  virtual void ffn(const LinearWeight& w0, const LinearWeight& w2, const float* x, int n, float* hidden, float* y) {
    linear(w0, x, n, hidden);
    gelu(hidden, static_cast<int64_t>(n) * w0.out);
    linear(w2, hidden, n, y);
  }
  // h[n, d] += gate_f * y[n, d], gate rows of frame f at gate + f * mod_stride
  virtual void gated_residual(float* h, const float* y, const float* gate, int mod_stride, int n, int d,
                              int tokens_per_frame) = 0;
  // gated_residual(h, y, gate, gate_stride, ...), then layer_norm_modulate of
  // the new h into u [n, d] (shift/scale rows at mod_stride): one pass over h
  // where the backend can. u, y and h are distinct. The default runs the two ops.
  virtual void gated_residual_norm(float* h, const float* y, const float* gate, int gate_stride, int n, int d,
                                   int tokens_per_frame, const float* shift, const float* scale, int mod_stride,
                                   float eps, float* u) {
    gated_residual(h, y, gate, gate_stride, n, d, tokens_per_frame);
    layer_norm_modulate(h, n, d, shift, scale, mod_stride, tokens_per_frame, eps, u);
  }
  // frames [frames, H, W, C] -> tokens [frames * T, P]
  virtual void patchify(const float* frames, int frames_count, const FrameShape& s, float* tokens) = 0;
  virtual void unpatchify(const float* tokens, int frames_count, const FrameShape& s, float* frames) = 0;
  // x += dt_f * v per frame (values_per_frame each); if clamp, x is clamped to [-1, 1] afterwards
  virtual void euler_step(float* x, const float* v, const float* dt_per_frame, int frames_count,
                          int64_t values_per_frame, bool clamp) = 0;

  // the initial noise of a batch: frame i of seeds.size() is
  // noise_fill_frame(seeds[i], frames[i]) (engine/noise.h) at out + i *
  // values_per_frame, out in backend memory. The default fills on the host
  // and uploads.
  virtual void noise_frames(std::span<const uint64_t> seeds, std::span<const int64_t> frames,
                            int64_t values_per_frame, float* out) {
    const size_t n = std::min(seeds.size(), frames.size());
    std::vector<float> host(n * static_cast<size_t>(values_per_frame));
    for (size_t i = 0; i < n; ++i)
      noise_fill_frame(seeds[i], frames[i], host.data() + i * static_cast<size_t>(values_per_frame), values_per_frame);
    upload(out, host.data(), host.size() * sizeof(float));
  }

  // a KV cache whose storage lives on this backend (the CPU backend: quant/'s formats)
  virtual absl::StatusOr<std::unique_ptr<KvCache>> make_kv_cache(absl::string_view format, const KvGeometry& g,
                                                                 const KvFormatOptions& options) {
    return wm::make_kv_cache(format, g, options);
  }
  // the bytes a session's cache of this format reserves here (admission):
  // device backends round to their pages; 0 when the format cannot be made
  virtual int64_t kv_reservation_bytes(absl::string_view format, const KvGeometry& g,
                                       const KvFormatOptions& options) const {
    return kv_format_max_bytes(format, g, options);
  }
  // OK when this backend can hold the format for g with these options, else why not
  virtual absl::Status kv_format_status(absl::string_view format, const KvGeometry& g,
                                        const KvFormatOptions& options) const {
    return kv_format_check(format, g, options);
  }
  virtual BackendMemory memory() const { return {}; }
  // the write pass of one layer for every session of a batch: session i's
  // frames of k, v ([tokens, heads, head_dim], sessions' tokens in batch
  // order) become its cache's frames first_frames[i], ... (one launch where
  // the backend can). The default appends each session's cache in turn.
  virtual absl::Status kv_append(int layer, std::span<const SessionSlice> sessions,
                                 std::span<const int64_t> first_frames, int tokens_per_frame, const float* k,
                                 const float* v) {
    if (first_frames.size() != sessions.size())
      return absl::InvalidArgumentError("kv_append: sessions and first frames differ in count");
    for (size_t i = 0; i < sessions.size(); ++i) {
      const SessionSlice& s = sessions[i];
      const KvGeometry& g = s.cache->geometry();
      const size_t off = static_cast<size_t>(s.batch_frame) * tokens_per_frame * g.heads * g.head_dim;
      absl::Status st = s.cache->append(layer, k + off, v + off, first_frames[i], s.frames);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // ---- recording a forward pass once and running it again (CUDA graphs) ----
  // Makes what a recording of a pass over this batch needs now (attention's
  // plan and workspaces: a recording holds no upload); false where the
  // backend cannot record this batch: the default, or a cache that is not the
  // backend's own (a replay would skip its host-side work)
  virtual bool prepare_recording(std::span<const SessionSlice> sessions, int tokens_per_frame) {
    (void)sessions;
    (void)tokens_per_frame;
    return false;
  }
  // from now on the ops are recorded instead of run; false where the backend
  // cannot record (the default), and then nothing changes
  virtual bool graph_begin() { return false; }
  // stops recording. OK: the recorded ops ran once and are kept; else (or
  // with keep false: the caller's pass failed) none of them ran
  virtual absl::Status graph_end(bool keep = true) {
    (void)keep;
    return absl::UnimplementedError("this backend records no graphs");
  }
  // runs the kept recording again
  virtual absl::Status graph_launch() { return absl::UnimplementedError("this backend records no graphs"); }

  // attention of one layer for every session of a batch (one launch where the
  // backend can); q, k, v, out: [tokens, heads, head_dim], sessions' tokens in
  // batch order. The default runs each session's cache in turn.
  virtual void attention(int layer, std::span<const SessionSlice> sessions, int tokens_per_frame, const float* q,
                         const float* k, const float* v, float* out) {
    for (const SessionSlice& s : sessions) {
      const KvGeometry& g = s.cache->geometry();
      const size_t off = static_cast<size_t>(s.batch_frame) * tokens_per_frame * g.heads * g.head_dim;
      const int n = s.frames * tokens_per_frame;
      s.cache->observe_queries(layer, q + off, n);
      s.cache->attend(layer, q + off, k + off, v + off, n, out + off);
    }
  }
};

// The CPU backend on cpu_threads_used(threads) threads (OpenMP's loops
// and OpenBLAS's GEMMs), set for the calling thread: OpenMP's thread count
// is per thread, so a backend is made on the thread that runs it.
std::unique_ptr<Backend> make_cpu_backend(int threads);

// The threads the CPU backend runs for `threads` asked, 0 for OpenMP's
// default on the calling thread (OMP_NUM_THREADS, else every core): as
// many, but never more than the cores this process may run on
// (omp_get_num_procs, which follows the affinity mask). More would only
// contend for them, and OpenBLAS reserves a 128 MiB buffer for each thread
// it starts: under an address-space or data limit (ulimit -v) its allocator
// then fails and retries without end (128 threads ask for 16 GiB).
int cpu_threads_used(int threads);

}  // namespace wm
