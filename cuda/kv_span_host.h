// The host half of a QVG-2 / QuantWM-2 cache on the device: the CPU cache's
// bookkeeping (one SpanLedger per layer), QuantWM's query statistics and
// its PSAC bases, and the coder itself (quant/span_codec.h), so that the
// codes the device stores are the CPU's (quant/kv_span.cc) bit for bit.
// The backend downloads an append's K/V and the queries it attends with,
// this codes them, and the backend scatters the result into the pages
// (kv_layout.h: SpanRowLayout). Pure host code.
//
// What the device holds is limited to what fits its frame slots: every
// append closes its span (span_frames 0 or 1) and the sink frames stay
// fp16 (device_span_support says why a setting is refused).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "quant/kv_cache.h"
#include "quant/kv_ledger.h"
#include "quant/query_stats.h"
#include "quant/span_codec.h"

namespace wm::cuda {

// OK if the device can hold `format` ("qvg2" or "quantwm2") with these
// options the CPU's way; else why not (INVALID_ARGUMENT for options no
// cache accepts, UNIMPLEMENTED for what only the CPU backend holds)
absl::Status device_span_support(const KvGeometry& g, const KvFormatOptions& o, bool quantwm);

// the fp16 bits a span cache keeps of x where it keeps fp16 (sink frames):
// sanitized (quant/kv_layouts.h: kv_sanitize), rounded to fp16
uint16_t span_fp16(float x);

// one frame of one head after an append, as the device stores it
struct SpanFrameCodes {
  const SpanHeadCodes* k = nullptr;  // its span's codes (keys, values)
  const SpanHeadCodes* v = nullptr;
  int32_t first_token = 0;           // the frame's first token inside the span
  int64_t span = 0;                  // the span's index among the layer's spans (0, 1, ...)
  const std::vector<uint16_t>* basis = nullptr;  // [8, head_dim] fp16 of its span; null: none
};

class SpanHostCoder {
 public:
  SpanHostCoder(const KvGeometry& g, const KvFormatOptions& o, bool quantwm);

  const SpanPlan& plan() const { return plan_; }
  bool observes_queries() const { return qsac_ || psac_; }
  // query rows [n][heads * head_dim] attended at `layer` (host)
  void observe(int32_t layer, const float* q, int32_t n);

  // codes frames [first_frame, first_frame + frames) of a layer from host
  // k, v [frames * tokens_per_frame][heads][head_dim], as the CPU's cache
  // does; frames() then describes each new non-sink frame until the next
  // append
  absl::Status append(int32_t layer, const float* k, const float* v, int64_t first_frame, int32_t frames);
  // the coded frame `frame` of the last append to `layer`, head `head`; null
  // if that append did not code it (a sink frame)
  const SpanFrameCodes* frame(int32_t layer, int64_t frame, int32_t head) const;
  // spans of a layer that still hold a frame in the window
  int32_t live_spans(int32_t layer) const {
    return static_cast<int32_t>(layers_[static_cast<size_t>(layer)].ledger.spans().size());
  }

  // per (layer, window slot): whether the span stored there carries a basis
  // (its keys decode with PSAC)
  bool slot_has_basis(int32_t layer, int32_t slot) const {
    return has_basis_[static_cast<size_t>(layer)][static_cast<size_t>(slot)];
  }
  void set_slot_has_basis(int32_t layer, int32_t slot, bool b) {
    has_basis_[static_cast<size_t>(layer)][static_cast<size_t>(slot)] = b;
  }

 private:
  struct CodedSpan {
    int64_t index = 0;  // among the layer's spans
    int64_t first_frame = 0;
    int32_t frames = 0;
    std::vector<SpanHeadCodes> k, v;  // [heads]
    std::shared_ptr<const std::vector<std::vector<uint16_t>>> basis;  // [heads][8 * head_dim]; null: none
    std::vector<SpanFrameCodes> views;  // [frames][heads]
  };
  struct Layer {
    explicit Layer(const SpanPlan& p) : ledger(p) {}
    SpanLedger ledger;
    std::vector<QueryStats> stats;  // [heads]
    std::shared_ptr<const std::vector<std::vector<uint16_t>>> basis;  // the current one
    std::vector<CodedSpan> last;    // the spans the last append coded
    int64_t spans_coded = 0;
  };

  KvGeometry g_;
  KvFormatOptions o_;
  SpanPlan plan_;
  bool qsac_ = false, psac_ = false;
  std::vector<Layer> layers_;
  std::vector<std::vector<bool>> has_basis_;  // [layers][window slots]
};

}  // namespace wm::cuda
