// The host half of a QVG-2 / QuantWM-2 cache on the device: the CPU cache's
// bookkeeping (one SpanLedger per layer), QuantWM's query statistics and
// its PSAC bases, which decide what each append codes and with what seeds,
// bases (QSAC's weights are made on the device, cuda/query_gram.cuh). The
// coder itself runs on the device
// (span_encode.cuh), as the CPU's (quant/span_codec.h) does, so that the
// codes the device stores are the CPU's (quant/kv_span.cc) bit for bit.
// Pure host code.
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

namespace wm::cuda {

// OK if the device can hold `format` ("qvg2" or "quantwm2") with these
// options the CPU's way; else why not (INVALID_ARGUMENT for options no
// cache accepts, UNIMPLEMENTED for what only the CPU backend holds)
absl::Status device_span_support(const KvGeometry& g, const KvFormatOptions& o, bool quantwm);

// a span an append opened, and how each of its heads is coded
struct SpanCoding {
  int64_t index = 0;  // among the layer's spans (0, 1, ...)
  int64_t first_frame = 0;
  int32_t frames = 0;
  int32_t centroids = 1;
  int32_t iters = 0;                         // Lloyd iterations
  std::vector<uint64_t> seeds;               // [heads][2]: the keys' and the values' k-means seeds
  bool qsac = false;                         // the keys are weighed by QSAC's channel weights (made on the device)
  int32_t candidates = 1;                    // the keys' QSAC candidates (values: 1)
  std::shared_ptr<const std::vector<std::vector<uint16_t>>> basis;  // [heads][8 * head_dim] fp16; null: none
};
class SpanHostCoder {
 public:
  SpanHostCoder(const KvGeometry& g, const KvFormatOptions& o, bool quantwm);

  const SpanPlan& plan() const { return plan_; }
  bool observes_queries() const { return qsac_ || psac_; }
  float qsac_weight_floor() const { return o_.qsac_weight_floor; }
  // whether the next append to `layer` (frames [first_frame, first_frame +
  // frames)) reads the query statistics: until the layer has seen a finite
  // query (every span's basis and PSAC depend on it) and where it makes a
  // new PSAC basis. Most appends do not, so the device need not stop for
  // them
  bool needs_statistics(int32_t layer, int64_t first_frame, int32_t frames) const;
  // the statistics of a head's queries attended at `layer` so far: the
  // device's running sums (cuda/query_gram.cuh: the lower triangle, over
  // `rows` finite rows), set for every head before an append of that layer
  // that needs them (FAILED_PRECONDITION if they were not), and good for
  // that append only. The device keeps every layer's; the host only the
  // layer in hand
  void set_statistics(int32_t layer, int32_t head, const double* lower, int64_t rows);

  // books frames [first_frame, first_frame + frames) of a layer as the
  // CPU's cache does; coded() then holds the spans this append opened
  absl::Status append(int32_t layer, int64_t first_frame, int32_t frames);
  const std::vector<SpanCoding>& coded(int32_t layer) const { return layers_[static_cast<size_t>(layer)].last; }
  // the span of the last append to `layer` that holds `frame`; null if
  // that append coded no span of it (a sink frame)
  const SpanCoding* span_of(int32_t layer, int64_t frame) const;
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
  struct Layer {
    explicit Layer(const SpanPlan& p) : ledger(p) {}
    SpanLedger ledger;
    std::shared_ptr<const std::vector<std::vector<uint16_t>>> basis;  // the current one
    std::vector<SpanCoding> last;   // the spans the last append opened
    int64_t spans_coded = 0;
    bool seen = false;  // a finite query was attended at this layer (the sums only grow: for good)
  };

  KvGeometry g_;
  KvFormatOptions o_;
  SpanPlan plan_;
  bool qsac_ = false, psac_ = false;
  std::vector<Layer> layers_;
  std::vector<QueryStats> stats_;  // [heads]: the statistics of layer stats_layer_
  int32_t stats_layer_ = -1;       // -1: none set for the next append
  std::vector<std::vector<bool>> has_basis_;  // [layers][window slots]
};

}  // namespace wm::cuda
