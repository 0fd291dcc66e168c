// One session's paged KV cache, as bookkeeping: which frame sits in which
// frame slot, which pool pages each (layer, head) owns, and what an append
// must write where. Pure host code (DeviceKvCache in cuda_backend.h adds
// the pool memory, the kernels write it); kv_layout.h defines the page layout.
//
// Slots: sink frames 0..S-1 take slots 0..S-1 for ever; frame f >= S takes
// slot S + (f - S) mod W, overwriting the frame that left the window. Frames
// must arrive in order from 0 (the engine's write pass does), so the cached
// frames of a layer always fill the slot prefix [0, min(frames, S + W)).
//
// Threading: one thread (the engine thread).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda/kv_layout.h"

namespace wm::cuda {

// A page-table row (one layer and head) of the fp16 format holds
// page_tokens tokens per page; a KIVI-2 row is laid out by `kivi`
// (kv_layout.h: KiviRowLayout), a QVG-2/QuantWM-2 row by `span`
// (SpanRowLayout).
struct PagedGeometry {
  int32_t layers = 0, heads = 0, head_dim = 0, tokens_per_frame = 0;
  int32_t window_frames = 0, sink_frames = 0;
  int32_t page_tokens = 0;  // fp16: tokens of one (layer, head) per page; KIVI-2: of a page of units; spans: kTileKeys
  KiviRowLayout kivi;       // group 0: not KIVI-2
  SpanRowLayout span;       // block 0: not a span format
  int32_t stats_pages = 0;  // QuantWM-2's query statistics (cuda/query_gram.cuh), taken at creation
  int32_t slots() const { return window_frames + sink_frames; }
  // page-table entries that hold the first `tokens` logical tokens
  int32_t pages_for(int64_t tokens) const {
    if (span.block > 0) return span.entries_for(tokens);
    if (kivi.group > 0) return kivi.entries_for(static_cast<int32_t>((tokens + kivi.unit_tokens - 1) / kivi.unit_tokens));
    return static_cast<int32_t>((tokens + page_tokens - 1) / page_tokens);
  }
  // whether caches of the two can share an append or attention launch
  bool same_layout(const PagedGeometry& o) const {
    return heads == o.heads && head_dim == o.head_dim && tokens_per_frame == o.tokens_per_frame &&
           page_tokens == o.page_tokens && kivi.group == o.kivi.group && kivi.front_units == o.kivi.front_units &&
           span.block == o.span.block && span.front_tokens == o.span.front_tokens &&
           span.coeff_bytes == o.span.coeff_bytes && span.max_centroids == o.span.max_centroids &&
           span.window_slots == o.span.window_slots && span.n_tables == o.span.n_tables;
  }
  int32_t max_pages_per_head() const { return pages_for(static_cast<int64_t>(slots()) * tokens_per_frame); }
  // the pages a session can ever hold: what the pool reserves for it
  int64_t reservation_pages() const {
    return static_cast<int64_t>(layers) * heads * max_pages_per_head() + stats_pages;
  }
};

// checks a geometry for the paged layouts (kv_layout.h)
absl::Status validate_paged_geometry(const PagedGeometry& g);

// what one append of `frames` frames to a layer writes
struct KvAppendPlan {
  int32_t layer = 0;
  int64_t end_frame = 0;            // frames appended to this layer afterwards
  std::vector<int32_t> src_frame;   // per write: frame offset inside the appended k, v
  std::vector<int32_t> slot;        // per write: destination slot
  int32_t new_pages_per_head = 0;   // pages each head of the layer must take first
};

class KvPages {
 public:
  explicit KvPages(const PagedGeometry& g);

  const PagedGeometry& geometry() const { return g_; }
  int32_t slot_of(int64_t frame) const;

  // FAILED_PRECONDITION unless first_frame continues the layer; frames that
  // an append itself pushes out of the window are not written at all
  absl::StatusOr<KvAppendPlan> plan_append(int32_t layer, int64_t first_frame, int32_t frames) const;
  // applies a plan; new_pages: [heads][plan.new_pages_per_head] pool pages
  void commit_append(const KvAppendPlan& plan, const std::vector<int32_t>& new_pages);

  int32_t used_slots(int32_t layer) const;
  int32_t used_tokens(int32_t layer) const { return used_slots(layer) * g_.tokens_per_frame; }
  int64_t frames_appended(int32_t layer) const { return next_frame_[static_cast<size_t>(layer)]; }
  int32_t pages_per_head(int32_t layer) const;
  const std::vector<int32_t>& pages(int32_t layer, int32_t head) const {
    return pages_[static_cast<size_t>(layer) * g_.heads + head];
  }
  // bumped by every commit to that layer (plans key on it)
  uint64_t version(int32_t layer) const { return version_[static_cast<size_t>(layer)]; }
  int64_t pages_held() const;
  // absolute frame in each used slot of a layer, by slot
  std::vector<int64_t> slot_frames(int32_t layer) const;
  // cached frames of a layer, ascending
  std::vector<int64_t> frames(int32_t layer) const;

 private:
  PagedGeometry g_;
  std::vector<int64_t> next_frame_;           // [layers]
  std::vector<uint64_t> version_;             // [layers]
  std::vector<std::vector<int64_t>> slot_frame_;   // [layers][slots], -1 empty
  std::vector<std::vector<int32_t>> pages_;   // [layers * heads]
};

}  // namespace wm::cuda
