// Bookkeeping of the quantized formats (STYLE 7: plain code, no tensors):
// which frames one layer holds, in which form, and exactly what that costs.
// A cache reports each appended frame to its ledger and then makes its
// storage match the ledger's state; kv_format_max_bytes replays a ledger over
// a long session to find the most a session can ever hold. Every layer of a
// session holds the same frames, so one ledger describes any layer.
#pragma once

#include <cstdint>
#include <deque>

#include "quant/kv_cache.h"

namespace wm {

// ---- KIVI-2 ----

struct KiviPlan {
  int heads = 0, head_dim = 0, tokens_per_frame = 0, window_frames = 0, sink_frames = 0;
  int group = 32;     // G
  int residual = 32;  // R, a multiple of G
  bool quantize_keys = true, quantize_values = true;
};

class KiviLedger {
 public:
  struct Chunk {
    int64_t first = 0;  // sequence number of its first token (non-sink tokens, in append order)
  };
  explicit KiviLedger(const KiviPlan& plan) : plan_(plan) {}

  // frame `frame` (= frames_appended()) was appended; returns how many
  // G-token chunks were quantized from the front of the fp16 buffer
  int add_frame(int64_t frame);

  int64_t frames_appended() const { return frames_; }
  int64_t sink_tokens() const { return sink_tokens_; }      // fp16 forever
  int64_t buffer_first() const { return buffer_first_; }    // seq of the oldest buffered token
  int64_t buffer_tokens() const { return buffer_tokens_; }  // fp16, not yet quantized
  int64_t dead_before() const { return dead_before_; }      // non-sink tokens with seq < this are evicted
  const std::deque<Chunk>& chunks() const { return chunks_; }
  // live tokens of a chunk (its evicted front is masked, the chunk is held whole)
  int64_t chunk_live_from(const Chunk& c) const;
  KvBytes bytes() const;  // one layer

 private:
  KiviPlan plan_;
  int64_t frames_ = 0;
  int64_t sink_tokens_ = 0;
  int64_t buffer_first_ = 0, buffer_tokens_ = 0;
  int64_t dead_before_ = 0;
  std::deque<Chunk> chunks_;
};

// ---- QVG-2 / QuantWM-2 ----

struct SpanPlan {
  int heads = 0, head_dim = 0, tokens_per_frame = 0, window_frames = 0, sink_frames = 0;
  int span_frames = 1;            // a span closes once this many non-sink frames are pending (>= 1)
  int block = 64;                 // B
  int max_centroids = 256;
  int tokens_per_centroid = 64;
  bool quantize_keys = true, quantize_values = true, quantize_sinks = false;
  bool psac = false;              // keys carry PSAC coefficients once a basis exists
  int coeff_bits = 8;
  int psac_refresh_frames = 16;   // a new basis per this many absolute frames
  // k of a span of `tokens` tokens: tokens / tokens_per_centroid, within [1, max_centroids]
  int centroids_for(int64_t tokens) const;
};

class SpanLedger {
 public:
  struct Span {
    int64_t first_frame = 0;  // absolute index of the span's first quantized frame
    int frames = 0;           // frames quantized together
    int evicted = 0;          // frames at its front evicted (their per-token data freed)
    int centroids = 0;        // k (per head and side)
    int64_t basis = -1;       // PSAC basis id it was quantized with; -1: none
    bool sink = false;
  };
  struct AppendResult {
    int new_spans = 0;        // the last new_spans of spans() were just created from pending frames
    bool new_basis = false;   // ... with a newly computed basis (the first of them names its id)
  };
  explicit SpanLedger(const SpanPlan& plan) : plan_(plan) {}

  // one append call: its frames (contiguous, from frames_appended()) are
  // added, then end_append closes spans and evicts. A span closes once at
  // least span_frames non-sink frames are pending and takes all of them, so
  // appends of whole blocks keep spans aligned and a shorter append (a
  // prompt's last chunk) only delays its frames to the next append; the sink
  // frames form one span of their own when quantize_sinks is set.
  // `queries_seen`: PSAC statistics exist, so a basis can be computed.
  void add_frame(int64_t frame);
  AppendResult end_append(bool queries_seen);

  int64_t frames_appended() const { return frames_; }
  const std::deque<Span>& spans() const { return spans_; }
  const std::deque<int64_t>& pending() const { return pending_; }  // fp16 frames, ascending (incl. kept sinks)
  int live_bases() const;
  KvBytes bytes() const;  // one layer

 private:
  SpanPlan plan_;
  int64_t frames_ = 0;
  std::deque<Span> spans_;
  std::deque<int64_t> pending_;
  bool sink_span_done_ = false;
  int64_t basis_id_ = -1;       // the current basis
  int64_t basis_epoch_ = 0;     // first_frame / psac_refresh_frames of the span it was computed for
};

}  // namespace wm
