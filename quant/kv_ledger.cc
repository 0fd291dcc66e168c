#include "quant/kv_ledger.h"

#include <algorithm>
#include <set>

#include "quant/kv_layouts.h"
#include "quant/span_codec.h"

namespace wm {

// ---- KIVI-2 ----

int KiviLedger::add_frame(int64_t frame) {
  const int64_t T = plan_.tokens_per_frame;
  ++frames_;
  int flushed = 0;
  if (frame < plan_.sink_frames) {
    sink_tokens_ += T;
  } else {
    buffer_tokens_ += T;
    // the fp16 residual is quantized whenever it is full
    while (buffer_tokens_ >= plan_.residual) {
      for (int64_t i = 0; i < plan_.residual; i += plan_.group) chunks_.push_back({buffer_first_ + i});
      flushed += plan_.residual / plan_.group;
      buffer_first_ += plan_.residual;
      buffer_tokens_ -= plan_.residual;
    }
  }
  // eviction: non-sink frames older than the window
  const int64_t dead_frames = std::max<int64_t>(0, frames_ - plan_.window_frames - plan_.sink_frames);
  dead_before_ = std::max(dead_before_, dead_frames * T);
  while (!chunks_.empty() && chunks_.front().first + plan_.group <= dead_before_) chunks_.pop_front();
  if (buffer_first_ < dead_before_) {  // only when R exceeds the window's tokens
    const int64_t drop = std::min(buffer_tokens_, dead_before_ - buffer_first_);
    buffer_first_ += drop;
    buffer_tokens_ -= drop;
  }
  return flushed;
}

int64_t KiviLedger::chunk_live_from(const Chunk& c) const {
  return std::min<int64_t>(plan_.group, std::max<int64_t>(0, dead_before_ - c.first));
}

KvBytes KiviLedger::bytes() const {
  const int64_t H = plan_.heads, D = plan_.head_dim, G = plan_.group;
  KvBytes b;
  b.fp_values = (sink_tokens_ + buffer_tokens_) * H * D * 2 * 2;
  const int64_t n = static_cast<int64_t>(chunks_.size()) * H;
  // keys: D blocks of G tokens per chunk; values: G tokens x D/G blocks: D blocks as well
  for (bool quantized : {plan_.quantize_keys, plan_.quantize_values}) {
    if (quantized) {
      b.codes += n * D * G / 4;
      b.scales += n * D * 2;
      b.zeros += n * D * 2;
    } else {
      b.fp_values += n * G * D * 2;
    }
  }
  return b;
}

// ---- QVG-2 / QuantWM-2 ----

int SpanPlan::centroids_for(int64_t tokens) const {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_centroids, tokens / tokens_per_centroid)));
}

void SpanLedger::add_frame(int64_t frame) {
  ++frames_;
  pending_.push_back(frame);
}

SpanLedger::AppendResult SpanLedger::end_append(bool queries_seen) {
  AppendResult res;
  const int S = plan_.sink_frames;
  const int64_t keep_from = frames_ - plan_.window_frames;
  // pending frames that already left the window are dropped, not quantized
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (*it >= S && *it < keep_from) it = pending_.erase(it);
    else ++it;
  }
  auto close = [&](std::deque<int64_t>::iterator first, std::deque<int64_t>::iterator last, bool sink) {
    Span sp;
    sp.sink = sink;
    sp.first_frame = *first;
    sp.frames = static_cast<int>(last - first);
    sp.centroids = plan_.centroids_for(static_cast<int64_t>(sp.frames) * plan_.tokens_per_frame);
    if (plan_.psac && plan_.quantize_keys && queries_seen) {
      // a new basis per epoch of psac_refresh_frames absolute frames, and at
      // most one per append (every span it closes sees the same statistics)
      const int64_t epoch = sp.first_frame / plan_.psac_refresh_frames;
      if (basis_id_ < 0 || (!res.new_basis && epoch != basis_epoch_)) {
        ++basis_id_;
        basis_epoch_ = epoch;
        res.new_basis = true;
      }
      sp.basis = basis_id_;
    }
    spans_.push_back(sp);
    ++res.new_spans;
    return pending_.erase(first, last);
  };
  // the sink span, once every sink frame is in
  if (plan_.quantize_sinks && S > 0 && !sink_span_done_ && frames_ >= S) {
    auto last = std::lower_bound(pending_.begin(), pending_.end(), static_cast<int64_t>(S));
    if (last != pending_.begin()) close(pending_.begin(), last, true);
    sink_span_done_ = true;
  }
  auto first = std::lower_bound(pending_.begin(), pending_.end(), static_cast<int64_t>(S));
  if (pending_.end() - first >= plan_.span_frames) close(first, pending_.end(), false);
  // eviction: non-sink frames older than the window (a span is split: its
  // evicted frames' per-token data is freed, the shared part stays until the
  // span is empty)
  for (Span& sp : spans_) {
    if (sp.sink) continue;
    sp.evicted = static_cast<int>(std::min<int64_t>(sp.frames, std::max<int64_t>(0, keep_from - sp.first_frame)));
  }
  spans_.erase(std::remove_if(spans_.begin(), spans_.end(), [](const Span& s) { return s.evicted == s.frames; }),
               spans_.end());
  return res;
}

int SpanLedger::live_bases() const {
  std::set<int64_t> ids;
  for (const Span& s : spans_)
    if (s.basis >= 0) ids.insert(s.basis);
  return static_cast<int>(ids.size());
}

KvBytes SpanLedger::bytes() const {
  const int64_t H = plan_.heads, D = plan_.head_dim, T = plan_.tokens_per_frame;
  KvBytes b;
  b.fp_values = static_cast<int64_t>(pending_.size()) * T * H * D * 2 * 2;
  for (const Span& s : spans_) {
    const int64_t live = static_cast<int64_t>(s.frames - s.evicted) * T * H;
    for (int side = 0; side < 2; ++side) {
      const bool quantized = side == 0 ? plan_.quantize_keys : plan_.quantize_values;
      if (!quantized) {
        b.fp_values += live * D * 2;
        continue;
      }
      b.codes += live * D / 4;
      b.scales += live * (D / plan_.block);
      b.ids += live;
      b.centroids += static_cast<int64_t>(s.centroids) * H * D * 2;
      if (side == 0 && s.basis >= 0) b.coeffs += live * span_coeff_bytes(plan_.coeff_bits);
    }
  }
  b.bases = static_cast<int64_t>(live_bases()) * H * kPsacRank * D * 2;
  return b;
}

}  // namespace wm
