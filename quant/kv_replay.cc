#include "quant/kv_replay.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "quant/kv_fp.h"
#include "quant/probe.h"

namespace wm {
namespace {

class ObservedKvCache final : public KvCache {
 public:
  ObservedKvCache(std::unique_ptr<KvCache> inner, KvObserver* observer) : inner_(std::move(inner)), observer_(observer) {}
  absl::string_view format() const override { return inner_->format(); }
  const KvGeometry& geometry() const override { return inner_->geometry(); }
  void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) override {
    inner_->attend(layer, q, k_cur, v_cur, n, out);
    observer_->on_attend(layer, q, k_cur, v_cur, n, out);
  }
  absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override {
    if (auto st = inner_->append(layer, k, v, first_frame, frames); !st.ok()) return st;
    observer_->on_append(layer, k, v, first_frame, frames);
    return absl::OkStatus();
  }
  void observe_queries(int layer, const float* q, int n) override {
    inner_->observe_queries(layer, q, n);
    observer_->on_observe(layer, q, n);
  }
  KvBytes bytes() const override { return inner_->bytes(); }
  std::vector<int64_t> frames(int layer) const override { return inner_->frames(layer); }
  void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const override {
    inner_->reconstruct(layer, k, v);
  }
  const DriftStats* drift() const override { return inner_->drift(); }

 private:
  std::unique_ptr<KvCache> inner_;
  KvObserver* observer_;
};

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

KvBytes max_bytes(const KvBytes& a, const KvBytes& b) { return b.total() > a.total() ? b : a; }

}  // namespace

std::unique_ptr<KvCache> make_observed_cache(std::unique_ptr<KvCache> inner, KvObserver* observer) {
  return std::make_unique<ObservedKvCache>(std::move(inner), observer);
}

// ---- KvEventLog ----

void KvEventLog::on_observe(int layer, const float* q, int n) {
  KvEvent e;
  e.kind = KvEvent::Kind::observe;
  e.layer = layer;
  e.rows = n;
  e.q.assign(q, q + static_cast<size_t>(n) * g_.heads * g_.head_dim);
  events_.push_back(std::move(e));
}

void KvEventLog::on_attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, const float*) {
  KvEvent e;
  e.kind = KvEvent::Kind::attend;
  e.layer = layer;
  e.rows = n;
  const size_t count = static_cast<size_t>(n) * g_.heads * g_.head_dim;
  const KvEvent* prev = events_.empty() ? nullptr : &events_.back();
  // the backend observes a block's queries right before attending with them: store them once
  if (prev != nullptr && prev->kind == KvEvent::Kind::observe && prev->layer == layer && prev->rows == n &&
      std::memcmp(prev->q.data(), q, count * sizeof(float)) == 0) {
    e.q_from_previous = true;
  } else {
    e.q.assign(q, q + count);
  }
  e.k.assign(k_cur, k_cur + count);
  e.v.assign(v_cur, v_cur + count);
  events_.push_back(std::move(e));
}

void KvEventLog::on_append(int layer, const float* k, const float* v, int64_t first_frame, int frames) {
  KvEvent e;
  e.kind = KvEvent::Kind::append;
  e.layer = layer;
  e.rows = frames * g_.tokens_per_frame;
  e.first_frame = first_frame;
  e.frames = frames;
  const size_t count = static_cast<size_t>(e.rows) * g_.heads * g_.head_dim;
  e.k.assign(k, k + count);
  e.v.assign(v, v + count);
  events_.push_back(std::move(e));
}

void kv_replay(std::span<const KvEvent> events, KvObserver* observer) {
  const std::vector<float>* last_q = nullptr;
  std::vector<float> out;
  for (const KvEvent& e : events) {
    switch (e.kind) {
      case KvEvent::Kind::observe:
        observer->on_observe(e.layer, e.q.data(), e.rows);
        last_q = &e.q;
        break;
      case KvEvent::Kind::attend: {
        const std::vector<float>& q = e.q_from_previous && last_q != nullptr ? *last_q : e.q;
        observer->on_attend(e.layer, q.data(), e.k.data(), e.v.data(), e.rows, nullptr);
        break;
      }
      case KvEvent::Kind::append:
        observer->on_append(e.layer, e.k.data(), e.v.data(), e.first_frame, e.frames);
        break;
    }
  }
}

// ---- KvEvaluator ----

int64_t kv_evaluation_bytes(const KvGeometry& g, std::span<const std::string> formats, const KvFormatOptions& options) {
  // an absurd geometry's caches can pass 2^63 bytes together
  int64_t total = 0;
  auto add = [&total](int64_t bytes) { total = bytes > INT64_MAX - total ? INT64_MAX : total + bytes; };
  add(kv_format_max_bytes("fp32", g, options));
  add(kv_format_max_bytes("fp16", g, options));
  for (const std::string& f : formats) {
    add(kv_format_max_bytes(f, g, options));
    add(kv_format_statistics_bytes(f, g, options));
  }
  // fp32 K and V of one layer's window, for the reference and a candidate
  add(2 * (kv_format_max_bytes("fp32", g, options) / std::max(1, g.layers)));
  return total;
}

DriftStats KvEvaluator::Candidate::overall() const {
  DriftStats s;
  for (const DriftStats& d : per_layer) s += d;
  return s;
}

KvEvaluator::KvEvaluator(const KvGeometry& g, const Options& options)
    : g_(g), options_(options), reference_(make_fp32_cache(g)), fp16_(make_fp16_cache(g)) {}

absl::Status KvEvaluator::add(const std::string& format, const KvFormatOptions& options) {
  auto cache = make_kv_cache(format, g_, options);
  if (!cache.ok()) return cache.status();
  Candidate c;
  c.format = format;
  c.cache = std::move(*cache);
  c.per_layer.resize(static_cast<size_t>(g_.layers));
  c.reserved = kv_format_max_bytes(format, g_, options);
  candidates_.push_back(std::move(c));
  return absl::OkStatus();
}

void KvEvaluator::on_observe(int layer, const float* q, int n) {
  const int nc = static_cast<int>(candidates_.size());
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < nc; ++i) {
    Candidate& c = candidates_[static_cast<size_t>(i)];
    if (c.error.empty()) c.cache->observe_queries(layer, q, n);
  }
}

void KvEvaluator::on_attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, const float* out) {
  const uint64_t call = static_cast<uint64_t>(calls_++);
  const auto samples = probe_sample(n, g_.heads, options_.queries_per_head, mix64(options_.seed ^ mix64(call)));
  std::vector<float> rk, rv;
  reference_->reconstruct(layer, &rk, &rv);
  const int m = static_cast<int>(rk.size() / (static_cast<size_t>(g_.heads) * g_.head_dim));
  const size_t count = static_cast<size_t>(n) * g_.heads * g_.head_dim;
  std::vector<float> ref_out;
  if (options_.fused && out == nullptr) {  // replayed from a dump: compute the reference output
    ref_out.resize(count);
    reference_->attend(layer, q, k_cur, v_cur, n, ref_out.data());
    out = ref_out.data();
  }
  const auto ref_frames = reference_->frames(layer);
  const int nc = static_cast<int>(candidates_.size());
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < nc; ++i) {
    Candidate& c = candidates_[static_cast<size_t>(i)];
    if (!c.error.empty()) continue;
    if (c.cache->frames(layer) != ref_frames) {
      c.error = absl::StrCat("layer ", layer, ": cached frames differ from the reference");
      continue;
    }
    std::vector<float> ck, cv;
    c.cache->reconstruct(layer, &ck, &cv);
    if (ck.size() != rk.size()) {
      c.error = absl::StrCat("layer ", layer, ": reconstruction holds ", ck.size(), " values, the reference ", rk.size());
      continue;
    }
    probe_attention(q, k_cur, v_cur, n, g_.heads, g_.head_dim, rk.data(), rv.data(), ck.data(), cv.data(), m, samples,
                    options_.topk, &c.per_layer[static_cast<size_t>(layer)]);
    if (options_.fused && out != nullptr) {
      std::vector<float> o(count);
      c.cache->attend(layer, q, k_cur, v_cur, n, o.data());
      for (int r = 0; r < n; ++r)
        for (int h = 0; h < g_.heads; ++h) {
          const size_t off = (static_cast<size_t>(r) * g_.heads + h) * g_.head_dim;
          double num = 0, den = 0;
          for (int d = 0; d < g_.head_dim; ++d) {
            const double e = static_cast<double>(o[off + d]) - out[off + d];
            num += e * e;
            den += static_cast<double>(out[off + d]) * out[off + d];
          }
          const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
          if (std::isfinite(rel)) {
            c.fused_rel_err_sum += rel;
            ++c.fused_rows;
          }
        }
    }
  }
}

void KvEvaluator::on_append(int layer, const float* k, const float* v, int64_t first_frame, int frames) {
  reference_->append(layer, k, v, first_frame, frames).IgnoreError();
  fp16_->append(layer, k, v, first_frame, frames).IgnoreError();
  if (layer == g_.layers - 1) fp16_peak_ = max_bytes(fp16_peak_, fp16_->bytes());
  const int nc = static_cast<int>(candidates_.size());
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < nc; ++i) {
    Candidate& c = candidates_[static_cast<size_t>(i)];
    if (!c.error.empty()) continue;
    if (auto st = c.cache->append(layer, k, v, first_frame, frames); !st.ok()) {
      c.error = std::string(st.message());
      continue;
    }
    // every layer has appended this block once the last one has
    if (layer == g_.layers - 1) c.peak = max_bytes(c.peak, c.cache->bytes());
  }
}

}  // namespace wm
