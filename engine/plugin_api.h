/* The versioned C ABI between wmserve and a compute-backend plugin
 * (libwm_cuda.so). docs/CUDA.md explains the design.
 *
 * A plugin exports exactly one symbol, WM_PLUGIN_ENTRY_SYMBOL:
 *
 *     const WmPluginApi* wm_plugin_entry(void);
 *
 * The loader (engine/plugin_loader.cc) dlopen()s the library, calls it, and
 * rejects the plugin unless api->abi_version == WM_PLUGIN_ABI_VERSION and
 * api->struct_size == sizeof(WmPluginApi). Any change to a struct or a
 * function signature below bumps WM_PLUGIN_ABI_VERSION; abi_version and
 * struct_size stay the first two fields forever so that the check itself never
 * breaks.
 *
 * Conventions:
 *  - plain C types only; no C++ object crosses the boundary;
 *  - functions that can fail return a status code (WmStatusCode, the numbering
 *    of absl::StatusCode) and leave a message for last_error(); codes are never
 *    thrown, and a plugin never aborts the process;
 *  - pointers called "device" are memory from alloc() (or inside it); all
 *    activations are fp32 rows, shapes as in engine/backend.h;
 *  - one backend is used by one thread at a time (the engine thread); work is
 *    asynchronous on the backend's stream, download() and synchronize() wait.
 */
#ifndef WM_ENGINE_PLUGIN_API_H_
#define WM_ENGINE_PLUGIN_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WM_PLUGIN_ABI_VERSION 7u
#define WM_PLUGIN_ENTRY_SYMBOL "wm_plugin_entry"

/* absl::StatusCode numbering */
typedef enum WmStatusCode {
  WM_OK = 0,
  WM_INVALID_ARGUMENT = 3,
  WM_NOT_FOUND = 5,
  WM_RESOURCE_EXHAUSTED = 8,
  WM_FAILED_PRECONDITION = 9,
  WM_UNIMPLEMENTED = 12,
  WM_INTERNAL = 13,
  WM_UNAVAILABLE = 14
} WmStatusCode;

typedef struct WmPluginBackend WmPluginBackend; /* opaque: one device, one stream */
typedef struct WmPluginKv WmPluginKv;           /* opaque: one session's device KV cache */

typedef struct WmPluginDeviceInfo {
  char name[128];
  int32_t ordinal;
  int32_t sm_major, sm_minor;
  int32_t multiprocessors;
  int64_t total_bytes, free_bytes;
  int32_t driver_version, runtime_version; /* e.g. 13000 */
} WmPluginDeviceInfo;

typedef struct WmPluginOptions {
  uint32_t struct_size;  /* sizeof(WmPluginOptions) as the caller compiled it */
  int32_t device;        /* device ordinal */
  int64_t kv_pool_bytes; /* the KV page pool, allocated once at create */
  int64_t kv_page_bytes; /* bytes of one page: a multiple of 32 KiB */
  int64_t reserve_bytes; /* device memory the caller needs besides the pool
                            (weights, activations): create fails early when
                            pool + reserve does not fit */
} WmPluginOptions;

typedef struct WmRopeParams {
  float theta;
  int32_t t_pairs, h_pairs, w_pairs;
} WmRopeParams;

typedef struct WmFrameShape {
  int32_t height, width, channels, patch;
} WmFrameShape;

/* a session's cache: the model's geometry, then the format options a
 * device format reads (quant/kv_cache.h: KvFormatOptions): KIVI-2's
 * (version 5), the span formats' (version 6; booleans are 0 or 1) */
typedef struct WmKvGeometry {
  int32_t layers, heads, head_dim, tokens_per_frame;
  int32_t window_frames, sink_frames, frames_per_block;
  int32_t kivi_group, kivi_residual;
  int32_t span_frames, centroids, tokens_per_centroid, block, kmeans_iters;
  int32_t quantize_sinks, qsac, psac, psac_rank, psac_bits, psac_refresh_frames, qsac_candidates;
  int32_t quantize_keys, quantize_values;
  float qsac_weight_floor;
  uint64_t kmeans_seed;
} WmKvGeometry;

/* one session's rows inside a batched attention call: its queries (and the
 * keys/values of its own block) are rows [row0, row0 + rows) of q, k, v, out */
typedef struct WmSessionRows {
  WmPluginKv* cache;
  int32_t row0;
  int32_t rows;
} WmSessionRows;

/* one cache's part of a batched append (version 4): frames [batch_frame,
 * batch_frame + frames) of the batch's k, v become its frames first_frame, ... */
typedef struct WmKvWrite {
  WmPluginKv* cache;
  int64_t first_frame;
  int32_t batch_frame;
  int32_t frames;
} WmKvWrite;

typedef struct WmMemoryStats {
  int64_t device_total, device_free;  /* cudaMemGetInfo */
  int64_t kv_pool_capacity;           /* bytes of pages in the pool */
  int64_t kv_pool_reserved;           /* bytes of pages promised to open caches */
  int64_t kv_pool_used;               /* bytes of pages holding data */
  int64_t kv_page_bytes;
} WmMemoryStats;

/* kv_probe's results (version 7), per sample: host arrays the caller
 * sizes for `count` samples and `topk` tokens. Logits are q.k / sqrt(head_dim)
 * against the layer's cached tokens in frame order; the plugin sets tokens
 * (the cached tokens, 0: nothing else written) and k = min(topk, tokens) */
typedef struct WmProbeResults {
  int32_t* ref_top;       /* [count][k]: the reference's top k tokens, descending, the earlier first on ties */
  int32_t* cand_top;      /* [count][k]: the candidate's */
  double* sq_err;         /* [count]: sum over the tokens of (candidate - reference logit)^2, finite terms */
  int32_t* ref_nonfinite; /* [count]: reference logits that are not finite */
  float* ref_out;         /* [count][head_dim]: attention output over the cache and the block */
  float* cand_out;        /* [count][head_dim] */
  int64_t tokens;
  int32_t k;
} WmProbeResults;

typedef struct WmPluginApi {
  uint32_t abi_version; /* WM_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size; /* sizeof(WmPluginApi) in the plugin */
  const char* name;       /* "cuda" */
  const char* build_info; /* toolkit and targets, for logs */

  /* is a usable device there? WM_UNAVAILABLE (with the reason in err) if not */
  int32_t (*probe)(int32_t device, WmPluginDeviceInfo* info, char* err, size_t err_len);
  int32_t (*create)(const WmPluginOptions* options, WmPluginBackend** out, char* err, size_t err_len);
  void (*destroy)(WmPluginBackend* b);
  /* message of the last failed call on b (valid until the next call) */
  const char* (*last_error)(WmPluginBackend* b);
  int32_t (*device_info)(WmPluginBackend* b, WmPluginDeviceInfo* info);
  int32_t (*memory_stats)(WmPluginBackend* b, WmMemoryStats* stats);
  /* 1 if the op (engine/backend.h BackendOp numbering) runs on this backend */
  int32_t (*supports)(WmPluginBackend* b, int32_t op);
  /* named tuning knobs for tests and benchmarks (docs/CUDA.md lists them) */
  int32_t (*set_tuning)(WmPluginBackend* b, const char* key, int64_t value);
  /* named event counters since create (docs/CUDA.md lists them); WM_NOT_FOUND for an unknown name */
  int32_t (*counter)(WmPluginBackend* b, const char* name, int64_t* value);

  /* memory: alloc returns null (with last_error set) when the device is full */
  void* (*alloc)(WmPluginBackend* b, size_t bytes);
  void (*free)(WmPluginBackend* b, void* p);
  int32_t (*upload)(WmPluginBackend* b, void* dst, const void* host, size_t bytes);
  int32_t (*download)(WmPluginBackend* b, void* host, const void* src, size_t bytes);
  int32_t (*synchronize)(WmPluginBackend* b);
  /* device-side timing of everything enqueued between the two calls */
  int32_t (*timer_start)(WmPluginBackend* b);
  int32_t (*timer_stop)(WmPluginBackend* b, double* milliseconds);

  /* a weight W [out, in] from host fp32 (kept as bf16); the handle lives until destroy */
  int32_t (*upload_weight)(WmPluginBackend* b, const float* host, int32_t out, int32_t in, const void** handle);

  /* ops: see engine/backend.h for the exact semantics */
  int32_t (*linear)(WmPluginBackend* b, const void* weight, const float* bias, int32_t out, int32_t in,
                    const float* x, int32_t n, float* y);
  int32_t (*layer_norm_modulate)(WmPluginBackend* b, const float* x, int32_t n, int32_t d, const float* shift,
                                 const float* scale, int32_t mod_stride, int32_t tokens_per_frame, float eps,
                                 float* y);
  int32_t (*rms_norm_rope)(WmPluginBackend* b, float* x, int32_t n, int32_t heads, int32_t head_dim,
                           int32_t row_stride, const float* norm_w, const int32_t* pos, const WmRopeParams* rope,
                           float eps);
  int32_t (*gelu)(WmPluginBackend* b, float* x, int64_t count);
  int32_t (*gated_residual)(WmPluginBackend* b, float* h, const float* y, const float* gate, int32_t mod_stride,
                            int32_t n, int32_t d, int32_t tokens_per_frame);
  int32_t (*patchify)(WmPluginBackend* b, const float* frames, int32_t frames_count, const WmFrameShape* s,
                      float* tokens);
  int32_t (*unpatchify)(WmPluginBackend* b, const float* tokens, int32_t frames_count, const WmFrameShape* s,
                        float* frames);
  int32_t (*euler_step)(WmPluginBackend* b, float* x, const float* v, const float* dt_per_frame,
                        int32_t frames_count, int64_t values_per_frame, int32_t clamp);

  /* KV caches in the device page pool */
  int32_t (*kv_reservation_bytes)(WmPluginBackend* b, const char* format, const WmKvGeometry* g, int64_t* bytes);
  int32_t (*kv_create)(WmPluginBackend* b, const char* format, const WmKvGeometry* g, WmPluginKv** out);
  void (*kv_destroy)(WmPluginBackend* b, WmPluginKv* kv);
  /* k, v: device [frames * tokens_per_frame, heads, head_dim] */
  int32_t (*kv_append)(WmPluginBackend* b, WmPluginKv* kv, int32_t layer, const float* k, const float* v,
                       int64_t first_frame, int32_t frames);
  int32_t (*kv_bytes)(WmPluginBackend* b, WmPluginKv* kv, int64_t* bytes);
  /* absolute indices of the cached frames of a layer, ascending; *count is
   * the number cached (only the first `capacity` are written) */
  int32_t (*kv_frames)(WmPluginBackend* b, WmPluginKv* kv, int32_t layer, int64_t* frames, int32_t capacity,
                       int32_t* count);
  /* host k, v [tokens, heads, head_dim] in frame order; *values is the count
   * per tensor (only written when it fits `capacity`) */
  int32_t (*kv_reconstruct)(WmPluginBackend* b, WmPluginKv* kv, int32_t layer, float* k, float* v,
                            int64_t capacity, int64_t* values);

  /* attention of one layer for sessions batched in one launch:
   * q, k, v, out device [rows, heads, head_dim] */
  int32_t (*attention)(WmPluginBackend* b, int32_t layer, const WmSessionRows* sessions, int32_t count,
                       const float* q, const float* k, const float* v, float* out);

  /* the feed-forward block (version 3): y = GELU_tanh(x W0^T + b0) W2^T + b2,
   * W0 [hidden_dim, in], W2 [out, hidden_dim]; hidden device [n, hidden_dim] is
   * scratch whose contents afterwards are unspecified */
  int32_t (*ffn)(WmPluginBackend* b, const void* w0, const float* b0, const void* w2, const float* b2, int32_t in,
                 int32_t hidden_dim, int32_t out, const float* x, int32_t n, float* hidden, float* y);

  /* the write pass of one layer for several caches in one launch (version 4):
   * k, v device [batch frames * tokens_per_frame, heads, head_dim]; the caches
   * share one geometry and none appears twice; on failure no cache changes */
  int32_t (*kv_append_batch)(WmPluginBackend* b, int32_t layer, const WmKvWrite* writes, int32_t count,
                             const float* k, const float* v);
  /* gated_residual of h, then layer_norm_modulate of the new h into u, in one
   * pass (version 4); gate rows at gate_stride, shift/scale rows at mod_stride */
  int32_t (*gated_residual_norm)(WmPluginBackend* b, float* h, const float* y, const float* gate,
                                 int32_t gate_stride, int32_t n, int32_t d, int32_t tokens_per_frame,
                                 const float* shift, const float* scale, int32_t mod_stride, float eps, float* u);
  /* rms_norm_rope of q and of k (same shape, own norm weights) in one pass (version 4) */
  int32_t (*rms_norm_rope_qk)(WmPluginBackend* b, float* q, const float* q_norm, float* k, const float* k_norm,
                              int32_t n, int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                              const WmRopeParams* rope, float eps);

  /* makes the attention plan for a batch now, as the first attention call of
   * a step would (version 4): a graph recorded next then needs no upload */
  int32_t (*prepare_attention)(WmPluginBackend* b, const WmSessionRows* sessions, int32_t count);
  /* graphs over a forward pass (version 4; docs/CUDA.md "Graphs"): after
   * graph_begin the backend's work is recorded instead of run; graph_end stops
   * and, if every op recorded cleanly and keep is nonzero, keeps the work as
   * its graph and runs it once, else nothing ran (WM_FAILED_PRECONDITION; run
   * the ops again); graph_launch runs the kept graph again */
  int32_t (*graph_begin)(WmPluginBackend* b);
  int32_t (*graph_end)(WmPluginBackend* b, int32_t keep);
  int32_t (*graph_launch)(WmPluginBackend* b);
  /* the initial noise of a batch (version 4): frame i of count is
   * engine/noise.h's noise_fill_frame(seeds[i], frames[i]) at out + i *
   * values_per_frame; seeds, frames host [count], out device */
  int32_t (*noise_frames)(WmPluginBackend* b, const uint64_t* seeds, const int64_t* frames, int32_t count,
                          int64_t values_per_frame, float* out);
  /* out[b, r, :] = rows[r, :] + per_block[b, :] (version 4) */
  int32_t (*add_rows)(WmPluginBackend* b, const float* rows, const float* per_block, int32_t n_rows, int32_t blocks,
                      int32_t width, float* out);

  /* audit mode's drift probes (version 7): one attention call's sampled
   * queries against a reference cache and a candidate holding the same
   * frames (q, k_cur, v_cur device [n, heads, head_dim], as attention's;
   * samples host [count][2], (head, query)); results as WmProbeResults says */
  int32_t (*kv_probe)(WmPluginBackend* b, WmPluginKv* reference, WmPluginKv* candidate, int32_t layer,
                      const float* q, const float* k_cur, const float* v_cur, int32_t n, const int32_t* samples,
                      int32_t count, int32_t topk, WmProbeResults* results);
} WmPluginApi;

typedef const WmPluginApi* (*WmPluginEntryFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* WM_ENGINE_PLUGIN_API_H_ */
