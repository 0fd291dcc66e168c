// Stand-ins for libwm_cuda.so in the loader tests, built as several shared
// objects from this one file:
//   WM_FAKE_NO_ENTRY      exports no wm_plugin_entry
//   WM_FAKE_ABI=n         reports ABI version n
//   WM_FAKE_SIZE_DELTA=d  reports a table d bytes larger than the real one
// otherwise a correct plugin whose device is missing (probe: UNAVAILABLE).
#include <cstdio>

#include "engine/plugin_api.h"

#ifndef WM_FAKE_ABI
#define WM_FAKE_ABI WM_PLUGIN_ABI_VERSION
#endif
#ifndef WM_FAKE_SIZE_DELTA
#define WM_FAKE_SIZE_DELTA 0
#endif

namespace {

void say(char* err, size_t len, const char* what) {
  if (err != nullptr && len > 0) std::snprintf(err, len, "%s", what);
}

int32_t probe(int32_t, WmPluginDeviceInfo*, char* err, size_t len) {
  say(err, len, "fake plugin: no device here");
  return WM_UNAVAILABLE;
}
int32_t create(const WmPluginOptions*, WmPluginBackend** out, char* err, size_t len) {
  *out = nullptr;
  say(err, len, "fake plugin: no device here");
  return WM_UNAVAILABLE;
}
void destroy(WmPluginBackend*) {}
const char* last_error(WmPluginBackend*) { return "fake"; }
int32_t device_info(WmPluginBackend*, WmPluginDeviceInfo*) { return WM_UNIMPLEMENTED; }
int32_t memory_stats(WmPluginBackend*, WmMemoryStats*) { return WM_UNIMPLEMENTED; }
int32_t supports(WmPluginBackend*, int32_t) { return 0; }
int32_t set_tuning(WmPluginBackend*, const char*, int64_t) { return WM_UNIMPLEMENTED; }
int32_t counter(WmPluginBackend*, const char*, int64_t*) { return WM_UNIMPLEMENTED; }
void* alloc(WmPluginBackend*, size_t) { return nullptr; }
void free_(WmPluginBackend*, void*) {}
int32_t upload(WmPluginBackend*, void*, const void*, size_t) { return WM_UNIMPLEMENTED; }
int32_t download(WmPluginBackend*, void*, const void*, size_t) { return WM_UNIMPLEMENTED; }
int32_t synchronize(WmPluginBackend*) { return WM_UNIMPLEMENTED; }
int32_t timer_start(WmPluginBackend*) { return WM_UNIMPLEMENTED; }
int32_t timer_stop(WmPluginBackend*, double*) { return WM_UNIMPLEMENTED; }
int32_t upload_weight(WmPluginBackend*, const float*, int32_t, int32_t, const void**) { return WM_UNIMPLEMENTED; }
int32_t linear(WmPluginBackend*, const void*, const float*, int32_t, int32_t, const float*, int32_t, float*) {
  return WM_UNIMPLEMENTED;
}
int32_t layer_norm_modulate(WmPluginBackend*, const float*, int32_t, int32_t, const float*, const float*, int32_t,
                            int32_t, float, float*) {
  return WM_UNIMPLEMENTED;
}
int32_t rms_norm_rope(WmPluginBackend*, float*, int32_t, int32_t, int32_t, int32_t, const float*, const int32_t*,
                      const WmRopeParams*, float) {
  return WM_UNIMPLEMENTED;
}
int32_t gelu(WmPluginBackend*, float*, int64_t) { return WM_UNIMPLEMENTED; }
int32_t gated_residual(WmPluginBackend*, float*, const float*, const float*, int32_t, int32_t, int32_t, int32_t) {
  return WM_UNIMPLEMENTED;
}
int32_t patchify(WmPluginBackend*, const float*, int32_t, const WmFrameShape*, float*) { return WM_UNIMPLEMENTED; }
int32_t unpatchify(WmPluginBackend*, const float*, int32_t, const WmFrameShape*, float*) { return WM_UNIMPLEMENTED; }
int32_t euler_step(WmPluginBackend*, float*, const float*, const float*, int32_t, int64_t, int32_t) {
  return WM_UNIMPLEMENTED;
}
int32_t kv_reservation_bytes(WmPluginBackend*, const char*, const WmKvGeometry*, int64_t*) { return WM_UNIMPLEMENTED; }
int32_t kv_create(WmPluginBackend*, const char*, const WmKvGeometry*, WmPluginKv**) { return WM_UNIMPLEMENTED; }
void kv_destroy(WmPluginBackend*, WmPluginKv*) {}
int32_t kv_append(WmPluginBackend*, WmPluginKv*, int32_t, const float*, const float*, int64_t, int32_t) {
  return WM_UNIMPLEMENTED;
}
int32_t kv_bytes(WmPluginBackend*, WmPluginKv*, int64_t*) { return WM_UNIMPLEMENTED; }
int32_t kv_frames(WmPluginBackend*, WmPluginKv*, int32_t, int64_t*, int32_t, int32_t*) { return WM_UNIMPLEMENTED; }
int32_t kv_reconstruct(WmPluginBackend*, WmPluginKv*, int32_t, float*, float*, int64_t, int64_t*) {
  return WM_UNIMPLEMENTED;
}
int32_t attention(WmPluginBackend*, int32_t, const WmSessionRows*, int32_t, const float*, const float*, const float*,
                  float*) {
  return WM_UNIMPLEMENTED;
}

int32_t ffn(WmPluginBackend*, const void*, const float*, const void*, const float*, int32_t, int32_t, int32_t,
            const float*, int32_t, float*, float*) {
  return WM_UNIMPLEMENTED;
}

int32_t kv_append_batch(WmPluginBackend*, int32_t, const WmKvWrite*, int32_t, const float*, const float*) {
  return WM_UNIMPLEMENTED;
}

int32_t gated_residual_norm(WmPluginBackend*, float*, const float*, const float*, int32_t, int32_t, int32_t, int32_t,
                            const float*, const float*, int32_t, float, float*) {
  return WM_UNIMPLEMENTED;
}
int32_t rms_norm_rope_qk(WmPluginBackend*, float*, const float*, float*, const float*, int32_t, int32_t, int32_t,
                         int32_t, const int32_t*, const WmRopeParams*, float) {
  return WM_UNIMPLEMENTED;
}

int32_t prepare_attention(WmPluginBackend*, const WmSessionRows*, int32_t) { return WM_UNIMPLEMENTED; }
int32_t graph_op(WmPluginBackend*) { return WM_UNIMPLEMENTED; }
int32_t graph_end(WmPluginBackend*, int32_t) { return WM_UNIMPLEMENTED; }
int32_t noise_frames(WmPluginBackend*, const uint64_t*, const int64_t*, int32_t, int64_t, float*) {
  return WM_UNIMPLEMENTED;
}
int32_t add_rows(WmPluginBackend*, const float*, const float*, int32_t, int32_t, int32_t, float*) {
  return WM_UNIMPLEMENTED;
}

int32_t kv_probe(WmPluginBackend*, WmPluginKv*, WmPluginKv*, int32_t, const float*, const float*, const float*,
                 int32_t, const int32_t*, int32_t, int32_t, WmProbeResults*) {
  return WM_UNIMPLEMENTED;
}

WmPluginApi make_api() {
  WmPluginApi a{};
  a.abi_version = WM_FAKE_ABI;
  a.struct_size = static_cast<uint32_t>(sizeof(WmPluginApi) + WM_FAKE_SIZE_DELTA);
  a.name = "fake";
  a.build_info = "fake plugin for loader tests";
  a.probe = probe;
  a.create = create;
  a.destroy = destroy;
  a.last_error = last_error;
  a.device_info = device_info;
  a.memory_stats = memory_stats;
  a.supports = supports;
  a.set_tuning = set_tuning;
  a.counter = counter;
  a.alloc = alloc;
  a.free = free_;
  a.upload = upload;
  a.download = download;
  a.synchronize = synchronize;
  a.timer_start = timer_start;
  a.timer_stop = timer_stop;
  a.upload_weight = upload_weight;
  a.linear = linear;
  a.layer_norm_modulate = layer_norm_modulate;
  a.rms_norm_rope = rms_norm_rope;
  a.gelu = gelu;
  a.gated_residual = gated_residual;
  a.patchify = patchify;
  a.unpatchify = unpatchify;
  a.euler_step = euler_step;
  a.kv_reservation_bytes = kv_reservation_bytes;
  a.kv_create = kv_create;
  a.kv_destroy = kv_destroy;
  a.kv_append = kv_append;
  a.kv_bytes = kv_bytes;
  a.kv_frames = kv_frames;
  a.kv_reconstruct = kv_reconstruct;
  a.attention = attention;
  a.ffn = ffn;
  a.kv_append_batch = kv_append_batch;
  a.gated_residual_norm = gated_residual_norm;
  a.rms_norm_rope_qk = rms_norm_rope_qk;
  a.prepare_attention = prepare_attention;
  a.graph_begin = graph_op;
  a.graph_end = graph_end;
  a.graph_launch = graph_op;
  a.noise_frames = noise_frames;
  a.add_rows = add_rows;
  a.kv_probe = kv_probe;
  return a;
}

}  // namespace

#ifndef WM_FAKE_NO_ENTRY
extern "C" __attribute__((visibility("default"))) const WmPluginApi* wm_plugin_entry(void) {
  static const WmPluginApi api = make_api();
  return &api;
}
#else
extern "C" __attribute__((visibility("default"))) const WmPluginApi* wm_plugin_something_else(void) {
  static const WmPluginApi api = make_api();
  return &api;
}
#endif
