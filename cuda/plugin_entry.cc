// The plugin's one exported symbol and the C ABI (engine/plugin_api.h) over
// CudaBackend: argument translation, errors to codes plus a message, and
// no exception or abort ever crossing the boundary.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cuda/cuda_backend.h"
#include "engine/plugin_api.h"

struct WmPluginBackend {
  std::unique_ptr<wm::cuda::CudaBackend> impl;
  std::string error;
};

struct WmPluginKv {
  std::unique_ptr<wm::cuda::DeviceKvCache> impl;
};

namespace {

using wm::cuda::CudaBackend;

constexpr int32_t kOpCount = 9;  // engine/backend.h BackendOp::count

int32_t code_of(const absl::Status& s) { return static_cast<int32_t>(s.code()); }

void write_error(const absl::Status& s, char* err, size_t len) {
  if (err == nullptr || len == 0) return;
  const std::string m(s.message());
  std::strncpy(err, m.c_str(), len - 1);
  err[len - 1] = '\0';
}

int32_t finish(WmPluginBackend* b, const absl::Status& s) {
  if (s.ok()) return WM_OK;
  b->error = std::string(s.message());
  return code_of(s);
}

// what an entry point leaves valid of the copies the calls before it made:
// the bf16 activation copy (linear reuses it) and the fp16 q and k of
// rms_norm_rope_qk (attention reads them); those that write no device memory keep both
enum Keeps : uint32_t { kKeepsNothing = 0, kKeepsShadow = 1, kKeepsHalfInputs = 2, kKeepsAll = 3 };

// runs one entry point: the backend's device current on this thread, the
// copies it does not keep dropped, exceptions caught
template <class F>
int32_t guarded(WmPluginBackend* b, Keeps keeps, F&& body) {
  if (b == nullptr || b->impl == nullptr) return WM_INVALID_ARGUMENT;
  try {
    const cudaError_t e = cudaSetDevice(b->impl->device());
    if (e != cudaSuccess) return finish(b, wm::cuda::cuda_status(e, "cudaSetDevice", __FILE__, __LINE__));
    if ((keeps & kKeepsShadow) == 0) b->impl->invalidate_shadow();
    if ((keeps & kKeepsHalfInputs) == 0) b->impl->invalidate_half_inputs();
    absl::Status s = body(*b->impl);
    // the graph being recorded would lack this op's work
    if (!s.ok() && b->impl->recording()) b->impl->recording_failed();
    return finish(b, s);
  } catch (const std::exception& ex) {
    if (b->impl->recording()) b->impl->recording_failed();
    return finish(b, absl::InternalError(std::string("exception in the CUDA plugin: ") + ex.what()));
  } catch (...) {
    if (b->impl->recording()) b->impl->recording_failed();
    return finish(b, absl::InternalError("unknown exception in the CUDA plugin"));
  }
}

int32_t api_probe(int32_t device, WmPluginDeviceInfo* info, char* err, size_t err_len) {
  try {
    const absl::Status s = wm::cuda::cuda_probe(device, info);
    write_error(s, err, err_len);
    return code_of(s);
  } catch (const std::exception& ex) {
    write_error(absl::InternalError(ex.what()), err, err_len);
    return WM_INTERNAL;
  } catch (...) {
    write_error(absl::InternalError("unknown exception in the CUDA plugin"), err, err_len);
    return WM_INTERNAL;
  }
}

int32_t api_create(const WmPluginOptions* options, WmPluginBackend** out, char* err, size_t err_len) {
  if (options == nullptr || out == nullptr) return WM_INVALID_ARGUMENT;
  *out = nullptr;
  try {
    auto impl = CudaBackend::create(*options);
    if (!impl.ok()) {
      write_error(impl.status(), err, err_len);
      return code_of(impl.status());
    }
    auto* b = new WmPluginBackend();
    b->impl = std::move(*impl);
    *out = b;
    return WM_OK;
  } catch (const std::exception& ex) {
    write_error(absl::InternalError(ex.what()), err, err_len);
    return WM_INTERNAL;
  } catch (...) {
    write_error(absl::InternalError("unknown exception in the CUDA plugin"), err, err_len);
    return WM_INTERNAL;
  }
}

void api_destroy(WmPluginBackend* b) {
  if (b == nullptr) return;
  if (b->impl != nullptr) cudaSetDevice(b->impl->device());
  delete b;
}

const char* api_last_error(WmPluginBackend* b) { return b == nullptr ? "null backend" : b->error.c_str(); }

int32_t api_device_info(WmPluginBackend* b, WmPluginDeviceInfo* info) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) {
    if (info == nullptr) return absl::InvalidArgumentError("null info");
    *info = c.info();
    return absl::OkStatus();
  });
}

int32_t api_memory_stats(WmPluginBackend* b, WmMemoryStats* stats) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) {
    if (stats == nullptr) return absl::InvalidArgumentError("null stats");
    auto m = c.memory_stats();
    if (!m.ok()) return m.status();
    *stats = *m;
    return absl::OkStatus();
  });
}

int32_t api_supports(WmPluginBackend* b, int32_t op) { return b != nullptr && op >= 0 && op < kOpCount ? 1 : 0; }

int32_t api_set_tuning(WmPluginBackend* b, const char* key, int64_t value) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (key == nullptr) return absl::InvalidArgumentError("null tuning key");
    return c.set_tuning(key, value);
  });
}

int32_t api_counter(WmPluginBackend* b, const char* name, int64_t* value) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) -> absl::Status {
    if (name == nullptr || value == nullptr) return absl::InvalidArgumentError("counter: null name or value");
    auto v = c.counter(name);
    if (!v.ok()) return v.status();
    *value = *v;
    return absl::OkStatus();
  });
}

void* api_alloc(WmPluginBackend* b, size_t bytes) {
  void* result = nullptr;
  guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    auto p = c.alloc(bytes);
    if (!p.ok()) return p.status();
    result = *p;
    return absl::OkStatus();
  });
  return result;
}

void api_free(WmPluginBackend* b, void* p) {
  guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    c.free(p);
    return absl::OkStatus();
  });
}

int32_t api_upload(WmPluginBackend* b, void* dst, const void* host, size_t bytes) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.upload(dst, host, bytes); });
}

int32_t api_download(WmPluginBackend* b, void* host, const void* src, size_t bytes) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.download(host, src, bytes); });
}

int32_t api_synchronize(WmPluginBackend* b) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.synchronize(); });
}

int32_t api_timer_start(WmPluginBackend* b) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) { return c.timer_start(); });
}

int32_t api_timer_stop(WmPluginBackend* b, double* ms) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) {
    auto t = c.timer_stop();
    if (!t.ok()) return t.status();
    if (ms != nullptr) *ms = *t;
    return absl::OkStatus();
  });
}

int32_t api_upload_weight(WmPluginBackend* b, const float* host, int32_t out, int32_t in, const void** handle) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (handle == nullptr) return absl::InvalidArgumentError("null weight handle");
    auto w = c.upload_weight(host, out, in);
    if (!w.ok()) return w.status();
    *handle = *w;
    return absl::OkStatus();
  });
}

int32_t api_linear(WmPluginBackend* b, const void* weight, const float* bias, int32_t out, int32_t in,
                   const float* x, int32_t n, float* y) {
  return guarded(b, kKeepsShadow, [&](CudaBackend& c) {
    return c.linear(static_cast<const wm::cuda::DeviceWeight*>(weight), bias, out, in, x, n, y);
  });
}

int32_t api_layer_norm_modulate(WmPluginBackend* b, const float* x, int32_t n, int32_t d, const float* shift,
                                const float* scale, int32_t mod_stride, int32_t tokens_per_frame, float eps,
                                float* y) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    return c.layer_norm_modulate(x, n, d, shift, scale, mod_stride, tokens_per_frame, eps, y);
  });
}

int32_t api_rms_norm_rope(WmPluginBackend* b, float* x, int32_t n, int32_t heads, int32_t head_dim,
                          int32_t row_stride, const float* norm_w, const int32_t* pos, const WmRopeParams* rope,
                          float eps) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (rope == nullptr) return absl::InvalidArgumentError("null rope params");
    return c.rms_norm_rope(x, n, heads, head_dim, row_stride, norm_w, pos, *rope, eps);
  });
}

int32_t api_gelu(WmPluginBackend* b, float* x, int64_t count) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.gelu(x, count); });
}

int32_t api_ffn(WmPluginBackend* b, const void* w0, const float* b0, const void* w2, const float* b2, int32_t in,
                int32_t hidden_dim, int32_t out, const float* x, int32_t n, float* hidden, float* y) {
  // keeps the bf16 copy: x is usually the LayerNorm output that wrote it
  return guarded(b, kKeepsShadow, [&](CudaBackend& c) {
    return c.ffn(static_cast<const wm::cuda::DeviceWeight*>(w0), b0, static_cast<const wm::cuda::DeviceWeight*>(w2),
                 b2, in, hidden_dim, out, x, n, hidden, y);
  });
}

int32_t api_gated_residual(WmPluginBackend* b, float* h, const float* y, const float* gate, int32_t mod_stride,
                           int32_t n, int32_t d, int32_t tokens_per_frame) {
  return guarded(b, kKeepsNothing,
                 [&](CudaBackend& c) { return c.gated_residual(h, y, gate, mod_stride, n, d, tokens_per_frame); });
}

int32_t api_gated_residual_norm(WmPluginBackend* b, float* h, const float* y, const float* gate, int32_t gate_stride,
                                int32_t n, int32_t d, int32_t tokens_per_frame, const float* shift,
                                const float* scale, int32_t mod_stride, float eps, float* u) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    return c.gated_residual_norm(h, y, gate, gate_stride, n, d, tokens_per_frame, shift, scale, mod_stride, eps, u);
  });
}

int32_t api_rms_norm_rope_qk(WmPluginBackend* b, float* q, const float* q_norm, float* k, const float* k_norm,
                             int32_t n, int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                             const WmRopeParams* rope, float eps) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (rope == nullptr) return absl::InvalidArgumentError("null rope params");
    if (k == nullptr) return absl::InvalidArgumentError("rms_norm_rope_qk: null k");
    return c.rms_norm_rope_qk(q, q_norm, k, k_norm, n, heads, head_dim, row_stride, pos, *rope, eps);
  });
}

int32_t api_patchify(WmPluginBackend* b, const float* frames, int32_t frames_count, const WmFrameShape* s,
                     float* tokens) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (s == nullptr) return absl::InvalidArgumentError("null frame shape");
    return c.patchify(frames, frames_count, *s, tokens);
  });
}

int32_t api_unpatchify(WmPluginBackend* b, const float* tokens, int32_t frames_count, const WmFrameShape* s,
                       float* frames) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (s == nullptr) return absl::InvalidArgumentError("null frame shape");
    return c.unpatchify(tokens, frames_count, *s, frames);
  });
}

int32_t api_euler_step(WmPluginBackend* b, float* x, const float* v, const float* dt_per_frame, int32_t frames_count,
                       int64_t values_per_frame, int32_t clamp) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    return c.euler_step(x, v, dt_per_frame, frames_count, values_per_frame, clamp != 0);
  });
}

int32_t api_kv_reservation_bytes(WmPluginBackend* b, const char* format, const WmKvGeometry* g, int64_t* bytes) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) {
    if (format == nullptr || g == nullptr || bytes == nullptr) return absl::InvalidArgumentError("null argument");
    auto r = c.kv_reservation_bytes(format, *g);
    if (!r.ok()) return r.status();
    *bytes = *r;
    return absl::OkStatus();
  });
}

int32_t api_kv_create(WmPluginBackend* b, const char* format, const WmKvGeometry* g, WmPluginKv** out) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (format == nullptr || g == nullptr || out == nullptr) return absl::InvalidArgumentError("null argument");
    *out = nullptr;
    auto kv = c.kv_create(format, *g);
    if (!kv.ok()) return kv.status();
    auto* h = new WmPluginKv();
    h->impl = std::move(*kv);
    *out = h;
    return absl::OkStatus();
  });
}

void api_kv_destroy(WmPluginBackend* b, WmPluginKv* kv) {
  if (kv == nullptr) return;
  guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    c.kv_destroy(std::move(kv->impl));
    return absl::OkStatus();
  });
  delete kv;
}

int32_t api_kv_append(WmPluginBackend* b, WmPluginKv* kv, int32_t layer, const float* k, const float* v,
                      int64_t first_frame, int32_t frames) {
  // writes cache pages and their scratch only: a write pass's output projection still finds the attention's copy
  return guarded(b, kKeepsShadow, [&](CudaBackend& c) {
    if (kv == nullptr || kv->impl == nullptr) return absl::InvalidArgumentError("null cache");
    return c.kv_append(*kv->impl, layer, k, v, first_frame, frames);
  });
}

int32_t api_kv_append_batch(WmPluginBackend* b, int32_t layer, const WmKvWrite* writes, int32_t count,
                            const float* k, const float* v) {
  return guarded(b, kKeepsShadow, [&](CudaBackend& c) {  // as api_kv_append
    if (count < 0 || (count > 0 && writes == nullptr)) return absl::InvalidArgumentError("kv append: bad write list");
    std::vector<wm::cuda::KvWriteRequest> w(static_cast<size_t>(count));
    for (int32_t i = 0; i < count; ++i) {
      const WmKvWrite& x = writes[i];
      if (x.cache == nullptr || x.cache->impl == nullptr) return absl::InvalidArgumentError("kv append: null cache");
      w[static_cast<size_t>(i)] = {x.cache->impl.get(), x.first_frame, x.batch_frame, x.frames};
    }
    return c.kv_append(layer, w, k, v);
  });
}

int32_t api_kv_bytes(WmPluginBackend* b, WmPluginKv* kv, int64_t* bytes) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) {
    if (kv == nullptr || kv->impl == nullptr || bytes == nullptr) return absl::InvalidArgumentError("null argument");
    *bytes = c.kv_bytes(*kv->impl);
    return absl::OkStatus();
  });
}

int32_t api_kv_frames(WmPluginBackend* b, WmPluginKv* kv, int32_t layer, int64_t* frames, int32_t capacity,
                      int32_t* count) {
  return guarded(b, kKeepsAll, [&](CudaBackend& c) {
    if (kv == nullptr || kv->impl == nullptr || count == nullptr) return absl::InvalidArgumentError("null argument");
    if (layer < 0 || layer >= kv->impl->geometry.layers) return absl::InvalidArgumentError("bad layer");
    const std::vector<int64_t> f = kv->impl->pages.frames(layer);
    *count = static_cast<int32_t>(f.size());
    for (int32_t i = 0; i < *count && i < capacity && frames != nullptr; ++i) frames[i] = f[static_cast<size_t>(i)];
    return absl::OkStatus();
  });
}

int32_t api_kv_reconstruct(WmPluginBackend* b, WmPluginKv* kv, int32_t layer, float* k, float* v, int64_t capacity,
                           int64_t* values) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (kv == nullptr || kv->impl == nullptr || values == nullptr) return absl::InvalidArgumentError("null argument");
    std::vector<float> kh, vh;
    absl::Status s = c.kv_reconstruct(*kv->impl, layer, &kh, &vh);
    if (!s.ok()) return s;
    *values = static_cast<int64_t>(kh.size());
    if (*values <= capacity && k != nullptr && v != nullptr) {
      std::memcpy(k, kh.data(), kh.size() * sizeof(float));
      std::memcpy(v, vh.data(), vh.size() * sizeof(float));
    }
    return absl::OkStatus();
  });
}

int32_t api_kv_probe(WmPluginBackend* b, WmPluginKv* reference, WmPluginKv* candidate, int32_t layer, const float* q,
                     const float* k_cur, const float* v_cur, int32_t n, const int32_t* samples, int32_t count,
                     int32_t topk, WmProbeResults* r) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (reference == nullptr || reference->impl == nullptr || candidate == nullptr || candidate->impl == nullptr ||
        r == nullptr || (count > 0 && samples == nullptr))
      return absl::InvalidArgumentError("null argument");
    if (count < 0) return absl::InvalidArgumentError("kv probe: negative sample count");
    wm::cuda::ProbeOutcome o;
    absl::Status s = c.kv_probe(*reference->impl, *candidate->impl, layer, q, k_cur, v_cur, n,
                                std::span<const int32_t>(samples, static_cast<size_t>(count) * 2), topk, &o);
    if (!s.ok()) return s;
    r->tokens = o.tokens;
    r->k = o.k;
    if (o.tokens == 0) return absl::OkStatus();
    for (const void* p : {static_cast<const void*>(r->ref_top), static_cast<const void*>(r->cand_top),
                          static_cast<const void*>(r->sq_err), static_cast<const void*>(r->ref_nonfinite),
                          static_cast<const void*>(r->ref_out), static_cast<const void*>(r->cand_out)})
      if (p == nullptr) return absl::InvalidArgumentError("kv probe: a null result array");
    std::memcpy(r->ref_top, o.ref_top.data(), o.ref_top.size() * sizeof(int32_t));
    std::memcpy(r->cand_top, o.cand_top.data(), o.cand_top.size() * sizeof(int32_t));
    std::memcpy(r->sq_err, o.sq_err.data(), o.sq_err.size() * sizeof(double));
    std::memcpy(r->ref_nonfinite, o.ref_nonfinite.data(), o.ref_nonfinite.size() * sizeof(int32_t));
    std::memcpy(r->ref_out, o.ref_out.data(), o.ref_out.size() * sizeof(float));
    std::memcpy(r->cand_out, o.cand_out.data(), o.cand_out.size() * sizeof(float));
    return absl::OkStatus();
  });
}

// the device caches behind a session list
absl::StatusOr<std::vector<wm::cuda::DeviceKvCache*>> caches_of(const WmSessionRows* sessions, int32_t count) {
  if (count < 0 || (count > 0 && sessions == nullptr)) return absl::InvalidArgumentError("bad session list");
  std::vector<wm::cuda::DeviceKvCache*> caches(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    WmPluginKv* kv = sessions[i].cache;
    if (kv == nullptr || kv->impl == nullptr) return absl::InvalidArgumentError("a session has no device cache");
    caches[static_cast<size_t>(i)] = kv->impl.get();
  }
  return caches;
}

int32_t api_attention(WmPluginBackend* b, int32_t layer, const WmSessionRows* sessions, int32_t count,
                      const float* q, const float* k, const float* v, float* out) {
  return guarded(b, kKeepsHalfInputs, [&](CudaBackend& c) {
    auto caches = caches_of(sessions, count);
    if (!caches.ok()) return caches.status();
    return c.attention(layer, *caches, std::span<const WmSessionRows>(sessions, static_cast<size_t>(count)), q, k, v,
                       out);
  });
}

int32_t api_prepare_attention(WmPluginBackend* b, const WmSessionRows* sessions, int32_t count) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    auto caches = caches_of(sessions, count);
    if (!caches.ok()) return caches.status();
    return c.prepare_recording(*caches, std::span<const WmSessionRows>(sessions, static_cast<size_t>(count)));
  });
}

int32_t api_noise_frames(WmPluginBackend* b, const uint64_t* seeds, const int64_t* frames, int32_t count,
                         int64_t values_per_frame, float* out) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) {
    if (count < 0 || (count > 0 && (seeds == nullptr || frames == nullptr)))
      return absl::InvalidArgumentError("noise_frames: bad frame list");
    return c.noise_frames(seeds, frames, count, values_per_frame, out);
  });
}

int32_t api_add_rows(WmPluginBackend* b, const float* rows, const float* per_block, int32_t n_rows, int32_t blocks,
                     int32_t width, float* out) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.add_rows(rows, per_block, n_rows, blocks, width, out); });
}

int32_t api_graph_begin(WmPluginBackend* b) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.graph_begin(); });
}

int32_t api_graph_end(WmPluginBackend* b, int32_t keep) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.graph_end(keep != 0); });
}

int32_t api_graph_launch(WmPluginBackend* b) {
  return guarded(b, kKeepsNothing, [&](CudaBackend& c) { return c.graph_launch(); });
}

#define WM_STR2(x) #x
#define WM_STR(x) WM_STR2(x)

const WmPluginApi* build_api() {
  static WmPluginApi api;
  api.abi_version = WM_PLUGIN_ABI_VERSION;
  api.struct_size = sizeof(WmPluginApi);
  api.name = "cuda";
  api.build_info = "wmserve CUDA plugin: CUDA runtime " WM_STR(CUDART_VERSION) ", cuBLASLt " WM_STR(
      CUBLAS_VERSION) ", sm_90 SASS + compute_90 PTX";
  api.probe = api_probe;
  api.create = api_create;
  api.destroy = api_destroy;
  api.last_error = api_last_error;
  api.device_info = api_device_info;
  api.memory_stats = api_memory_stats;
  api.supports = api_supports;
  api.set_tuning = api_set_tuning;
  api.counter = api_counter;
  api.alloc = api_alloc;
  api.free = api_free;
  api.upload = api_upload;
  api.download = api_download;
  api.synchronize = api_synchronize;
  api.timer_start = api_timer_start;
  api.timer_stop = api_timer_stop;
  api.upload_weight = api_upload_weight;
  api.linear = api_linear;
  api.layer_norm_modulate = api_layer_norm_modulate;
  api.rms_norm_rope = api_rms_norm_rope;
  api.gelu = api_gelu;
  api.gated_residual = api_gated_residual;
  api.patchify = api_patchify;
  api.unpatchify = api_unpatchify;
  api.euler_step = api_euler_step;
  api.kv_reservation_bytes = api_kv_reservation_bytes;
  api.kv_create = api_kv_create;
  api.kv_destroy = api_kv_destroy;
  api.kv_append = api_kv_append;
  api.kv_append_batch = api_kv_append_batch;
  api.gated_residual_norm = api_gated_residual_norm;
  api.prepare_attention = api_prepare_attention;
  api.graph_begin = api_graph_begin;
  api.graph_end = api_graph_end;
  api.graph_launch = api_graph_launch;
  api.noise_frames = api_noise_frames;
  api.add_rows = api_add_rows;
  api.rms_norm_rope_qk = api_rms_norm_rope_qk;
  api.kv_bytes = api_kv_bytes;
  api.kv_frames = api_kv_frames;
  api.kv_reconstruct = api_kv_reconstruct;
  api.kv_probe = api_kv_probe;
  api.attention = api_attention;
  api.ffn = api_ffn;
  return &api;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const WmPluginApi* wm_plugin_entry(void) {
  static const WmPluginApi* api = build_api();
  return api;
}
