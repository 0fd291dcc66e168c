#include "quant/kv_audit.h"

#include "quant/kmeans_ops.h"
#include "quant/kv_fp.h"
#include "quant/probe.h"

namespace wm {

using kmeans_ops::mix64;
using kmeans_ops::uniform01;

AuditedKvCache::AuditedKvCache(std::unique_ptr<KvCache> primary, const AuditOptions& options, DeviceReader reader,
                               std::unique_ptr<KvCache> device_shadow)
    : primary_(std::move(primary)),
      shadow_(std::move(device_shadow)),
      shadow_on_device_(shadow_ != nullptr),
      options_(options),
      reader_(std::move(reader)) {
  if (shadow_ == nullptr) shadow_ = make_fp32_cache(primary_->geometry());
}

const float* AuditedKvCache::on_host(const float* p, size_t values, std::vector<float>* buf) const {
  if (!reader_) return p;
  buf->resize(values);
  reader_(buf->data(), p, values * sizeof(float));
  return buf->data();
}

void AuditedKvCache::attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) {
  primary_->attend(layer, q, k_cur, v_cur, n, out);
  const uint64_t call = calls_++;
  if (uniform01(options_.seed, call) >= options_.call_fraction) return;
  const KvGeometry& g = primary_->geometry();
  const auto samples = probe_sample(n, g.heads, options_.queries_per_head, mix64(options_.seed + call));
  if (shadow_on_device_) {
    // on the device, where both caches are: only each sample's top tokens,
    // squared logit error and outputs come back (docs/CUDA.md)
    if (shadow_->frames(layer) != primary_->frames(layer)) return;
    if (primary_->probe_against(*shadow_, layer, q, k_cur, v_cur, n, samples, options_.topk, &probe_ranks_) &&
        probe_ranks_stats(probe_ranks_, samples.size(), g.head_dim, &drift_))
      ++probed_calls_;
    return;
  }
  const size_t values = static_cast<size_t>(n) * g.heads * g.head_dim;
  q = on_host(q, values, &host_q_);
  k_cur = on_host(k_cur, values, &host_k_);
  v_cur = on_host(v_cur, values, &host_v_);
  if (probe_caches(*shadow_, *primary_, layer, q, k_cur, v_cur, n, samples, options_.topk, &drift_)) ++probed_calls_;
}

absl::Status AuditedKvCache::append(int layer, const float* k, const float* v, int64_t first_frame, int frames) {
  if (auto st = primary_->append(layer, k, v, first_frame, frames); !st.ok()) return st;
  const KvGeometry& g = primary_->geometry();
  const size_t values = static_cast<size_t>(frames) * g.tokens_per_frame * g.heads * g.head_dim;
  if (shadow_on_device_) return shadow_->append(layer, k, v, first_frame, frames);
  return shadow_->append(layer, on_host(k, values, &host_k_), on_host(v, values, &host_v_), first_frame, frames);
}

bool AuditedKvCache::shadow_block(int64_t first_frame) const {
  return uniform01(options_.block_seed, static_cast<uint64_t>(first_frame)) < options_.block_fraction;
}

void AuditedKvCache::observe_queries(int layer, const float* q, int n) { primary_->observe_queries(layer, q, n); }

std::unique_ptr<KvCache> make_audited_cache(std::unique_ptr<KvCache> primary, const AuditOptions& options,
                                            DeviceReader reader) {
  return std::make_unique<AuditedKvCache>(std::move(primary), options, std::move(reader));
}

}  // namespace wm
