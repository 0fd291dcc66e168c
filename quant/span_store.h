// What one layer of a span-format cache (kv_span.cc) stores, shared with its
// tile source (span_tiles.h). Every array is host memory; shapes in comments.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "quant/kv_ledger.h"
#include "quant/query_stats.h"
#include "quant/span_codec.h"

namespace wm {

// a PSAC basis, shared by every span quantized with it
struct PsacBasis {
  int64_t id = 0;
  std::vector<uint16_t> u;  // [heads][kPsacRank][head_dim] fp16, orthonormal rows (before rounding)
};

// a frame not (yet) quantized: the newest frames of an open span, and sink frames
struct PendingFrame {
  int64_t frame = 0;
  std::vector<uint16_t> k, v;  // [heads][tokens_per_frame][head_dim] fp16
};

// a quantized span; after eviction only its live tokens remain
struct QuantSpan {
  int64_t first_frame = 0;  // as in the ledger
  int frames = 0;
  int evicted = 0;
  int tokens = 0;           // live tokens per head
  std::shared_ptr<const PsacBasis> basis;   // null: keys carry no PSAC coefficients
  std::vector<SpanHeadCodes> k, v;          // [heads], for a quantized side
  std::vector<std::vector<uint16_t>> kf, vf;  // [heads][tokens * head_dim] fp16, for a side kept fp16
};

struct SpanLayer {
  SpanLayer(const SpanPlan& plan, int heads, int head_dim) : ledger(plan) {
    for (int h = 0; h < heads; ++h) stats.emplace_back(head_dim);
  }
  SpanLedger ledger;
  std::deque<PendingFrame> pending;  // ascending frames, as ledger.pending()
  std::deque<QuantSpan> spans;       // as ledger.spans()
  std::vector<QueryStats> stats;     // [heads] QuantWM's causal query statistics
  std::shared_ptr<const PsacBasis> basis;  // the newest basis
};

}  // namespace wm
