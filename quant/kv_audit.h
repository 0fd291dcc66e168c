// The audited cache (server audit mode, DESIGN §6): a primary cache (the
// session's format) plus a full-precision shadow fed the same K/V and
// queries: an fp32 cache in host memory, or (on a device) an fp16 cache of
// the device's own. Attention returns the primary's result; for a sampled fraction of
// calls it also probes a few queries per head against the shadow
// (probe.h) and accumulates DriftStats, exposed through drift(). The engine
// also makes a sampled fraction of blocks a second time with the shadow as
// the history (shadow_block(), shadow()) and adds the frames' differences
// (add_frame()).
//
// Cost, bounded by AuditOptions: the shadow's memory (all frames of the
// window: shadow_bytes(), NOT part of bytes(), which stays the session's KV
// bytes as its format holds them), one shadow append per append,
// and per sampled call one reconstruction of the layer in both caches plus
// heads x queries_per_head probes (with a device shadow: the probes run
// on the device, probe_against).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "quant/kv_cache.h"

namespace wm {

struct AuditOptions {
  double call_fraction = 0.05;  // attention calls probed
  int queries_per_head = 4;     // queries probed per head in a probed call
  int topk = 8;
  uint64_t seed = 1;
  // blocks the engine makes again against the shadow (the frame PSNR); 0:
  // none. Which ones: a hash of (block_seed, the block's first frame)
  double block_fraction = 0.125;
  uint64_t block_seed = 0;
};

// copies device memory to the host (Backend::download). An audited cache
// with one takes device pointers for its K/V and queries, as a device
// backend's cache does: the probes get host copies, the primary the device
// pointers, and the shadow the device pointers too when it is a device
// cache (`device_shadow`), else host copies.
using DeviceReader = std::function<void(void* host, const void* device, size_t bytes)>;

class AuditedKvCache final : public KvCache {
 public:
  // `device_shadow`: the shadow, a cache of the device that holds the
  // primary (with a reader); null: an fp32 cache in host memory
  AuditedKvCache(std::unique_ptr<KvCache> primary, const AuditOptions& options, DeviceReader reader = {},
                 std::unique_ptr<KvCache> device_shadow = nullptr);

  absl::string_view format() const override { return primary_->format(); }
  const KvGeometry& geometry() const override { return primary_->geometry(); }
  void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) override;
  absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override;
  void observe_queries(int layer, const float* q, int n) override;
  KvBytes bytes() const override { return primary_->bytes(); }
  std::vector<int64_t> frames(int layer) const override { return primary_->frames(layer); }
  void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const override {
    primary_->reconstruct(layer, k, v);
  }
  const DriftStats* drift() const override { return &drift_; }

  KvBytes shadow_bytes() const { return shadow_->bytes(); }
  // the full-precision cache: attended as a session's history (on the
  // primary's device), it gives the frames the session would get without
  // its format's error (never appended to but through this cache)
  KvCache& shadow() { return *shadow_; }
  // whether the session's block that starts at frame `first_frame` is made
  // again against the shadow: a pure function of (block_seed, first_frame),
  // block_fraction of the blocks
  bool shadow_block(int64_t first_frame) const;
  // a served frame and the same frame made against the shadow (8-bit RGB)
  void add_frame(const uint8_t* served, const uint8_t* shadow, size_t values) {
    drift_.add_frame(served, shadow, values);
  }
  int64_t probed_calls() const { return probed_calls_; }
  const KvCache& primary() const { return *primary_; }

 private:
  // p itself, or (with a reader) a host copy of its `values` floats in *buf
  const float* on_host(const float* p, size_t values, std::vector<float>* buf) const;

  std::unique_ptr<KvCache> primary_, shadow_;
  bool shadow_on_device_ = false;
  AuditOptions options_;
  DeviceReader reader_;
  std::vector<float> host_q_, host_k_, host_v_;
  ProbeRanks probe_ranks_;  // a device shadow's probes
  DriftStats drift_;
  uint64_t calls_ = 0;
  int64_t probed_calls_ = 0;
};

std::unique_ptr<KvCache> make_audited_cache(std::unique_ptr<KvCache> primary, const AuditOptions& options = {},
                                            DeviceReader reader = {});

}  // namespace wm
