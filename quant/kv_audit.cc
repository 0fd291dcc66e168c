#include "quant/kv_audit.h"

#include "quant/kv_fp.h"
#include "quant/probe.h"

namespace wm {
namespace {

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

AuditedKvCache::AuditedKvCache(std::unique_ptr<KvCache> primary, const AuditOptions& options)
    : primary_(std::move(primary)), shadow_(make_fp32_cache(primary_->geometry())), options_(options) {}

void AuditedKvCache::attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) {
  primary_->attend(layer, q, k_cur, v_cur, n, out);
  const uint64_t call = calls_++;
  const double u = static_cast<double>(mix64(options_.seed ^ mix64(call)) >> 11) * 0x1.0p-53;
  if (u >= options_.call_fraction) return;
  const KvGeometry& g = primary_->geometry();
  const auto samples = probe_sample(n, g.heads, options_.queries_per_head, mix64(options_.seed + call));
  if (probe_caches(*shadow_, *primary_, layer, q, k_cur, v_cur, n, samples, options_.topk, &drift_)) ++probed_calls_;
}

absl::Status AuditedKvCache::append(int layer, const float* k, const float* v, int64_t first_frame, int frames) {
  if (auto st = primary_->append(layer, k, v, first_frame, frames); !st.ok()) return st;
  return shadow_->append(layer, k, v, first_frame, frames);
}

void AuditedKvCache::observe_queries(int layer, const float* q, int n) { primary_->observe_queries(layer, q, n); }

std::unique_ptr<KvCache> make_audited_cache(std::unique_ptr<KvCache> primary, const AuditOptions& options) {
  return std::make_unique<AuditedKvCache>(std::move(primary), options);
}

}  // namespace wm
