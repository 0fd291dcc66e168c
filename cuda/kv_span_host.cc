#include "cuda/kv_span_host.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "quant/kv_layouts.h"
#include "quant/kv_span.h"
#include "quant/span_codec.h"

namespace wm::cuda {

absl::Status device_span_support(const KvGeometry& g, const KvFormatOptions& o, bool quantwm) {
  if (absl::Status s = span_validate(g, o); !s.ok()) return s;
  const char* name = quantwm ? "quantwm2" : "qvg2";
  if (o.span_frames > 1)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU codes every append as one span (span_frames 0 or 1, not ",
                                                 o.span_frames, "); the CPU backend serves this setting"));
  if (g.head_dim > 128)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU codes heads of at most 128 channels, not ",
                                                 g.head_dim, "; the CPU backend serves this model"));
  if (quantwm && o.qsac && o.qsac_candidates > 16)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU tries at most 16 QSAC candidates, not ",
                                                 o.qsac_candidates, "; the CPU backend serves this setting"));
  if (o.quantize_sinks)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU keeps the sink frames fp16 (quantize_sinks=false); "
                                                 "the CPU backend serves this setting"));
  if (!o.quantize_keys || !o.quantize_values)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU codes keys and values both"));
  return absl::OkStatus();
}

SpanHostCoder::SpanHostCoder(const KvGeometry& g, const KvFormatOptions& o, bool quantwm)
    : g_(g), o_(o), plan_(span_plan(g, o, quantwm)), qsac_(quantwm && o.qsac), psac_(plan_.psac) {
  for (int l = 0; l < g.layers; ++l) {
    layers_.emplace_back(plan_);
  }
  for (int h = 0; h < g.heads; ++h) stats_.emplace_back(g.head_dim);
  has_basis_.assign(static_cast<size_t>(g.layers), std::vector<bool>(static_cast<size_t>(g.window_frames), false));
}

void SpanHostCoder::set_statistics(int32_t layer, int32_t head, const double* lower, int64_t rows) {
  if (!observes_queries() || layer < 0 || layer >= g_.layers || head < 0 || head >= g_.heads) return;
  stats_layer_ = layer;
  stats_[static_cast<size_t>(head)].set_gram(lower, rows);
}

bool SpanHostCoder::needs_statistics(int32_t layer, int64_t first_frame, int32_t frames) const {
  if (!observes_queries() || layer < 0 || layer >= g_.layers) return false;
  const Layer& L = layers_[static_cast<size_t>(layer)];
  if (!L.seen) return true;
  if (!psac_) return false;
  // the append on a copy of the ledger (a window's spans): does it open a basis?
  SpanLedger next = L.ledger;
  for (int32_t f = 0; f < frames; ++f) next.add_frame(first_frame + f);
  return next.end_append(true).new_basis;
}

absl::Status SpanHostCoder::append(int32_t layer, int64_t first_frame, int32_t frames) {
  if (layer < 0 || layer >= g_.layers) return absl::InvalidArgumentError("span coder: bad layer");
  Layer& L = layers_[static_cast<size_t>(layer)];
  if (first_frame != L.ledger.frames_appended())
    return absl::FailedPreconditionError(absl::StrCat("span coder: layer ", layer, " expects frame ",
                                                      L.ledger.frames_appended(), " next, got ", first_frame));
  const bool have = stats_layer_ == layer;
  stats_layer_ = -1;  // this append's only
  const auto unset = [layer] {
    return absl::FailedPreconditionError(absl::StrCat("span coder: layer ", layer, "'s query statistics were not set"));
  };
  if (observes_queries() && !L.seen) {
    if (!have) return unset();
    L.seen = std::any_of(stats_.begin(), stats_.end(), [](const QueryStats& s) { return s.count() > 0; });
  }
  if (psac_ && L.seen && !have && needs_statistics(layer, first_frame, frames)) return unset();
  for (int32_t f = 0; f < frames; ++f) L.ledger.add_frame(first_frame + f);
  const SpanLedger::AppendResult res = L.ledger.end_append(L.seen);
  const auto& spans = L.ledger.spans();
  const int H = g_.heads, D = g_.head_dim;
  if (res.new_basis) {  // the CPU's compute_basis: fp16 rows, zero for a head with no finite query yet
    const std::vector<uint16_t> rows = principal_bases_f16(stats_, kPsacRank);
    const size_t per = static_cast<size_t>(kPsacRank) * D;
    auto basis = std::make_shared<std::vector<std::vector<uint16_t>>>(static_cast<size_t>(H));
    for (int h = 0; h < H; ++h)
      (*basis)[static_cast<size_t>(h)].assign(rows.begin() + static_cast<ptrdiff_t>(h * per),
                                              rows.begin() + static_cast<ptrdiff_t>((h + 1) * per));
    L.basis = std::move(basis);
  }
  L.last.clear();
  L.last.resize(static_cast<size_t>(res.new_spans));
  for (int i = 0; i < res.new_spans; ++i) {
    const SpanLedger::Span& ls = spans[spans.size() - static_cast<size_t>(res.new_spans) + static_cast<size_t>(i)];
    SpanCoding& s = L.last[static_cast<size_t>(i)];
    s.index = L.spans_coded++;
    s.first_frame = ls.first_frame;
    s.frames = ls.frames;
    s.centroids = ls.centroids;
    s.iters = o_.kmeans_iters;
    if (ls.first_frame < first_frame || ls.first_frame + ls.frames > first_frame + frames)
      return absl::InternalError("span coder: a span outside its append (span_frames must be 0 or 1)");
    if (ls.basis >= 0) s.basis = L.basis;
    s.seeds.resize(static_cast<size_t>(H) * 2);
    s.qsac = qsac_;
    if (qsac_) s.candidates = o_.qsac_candidates;
    for (int h = 0; h < H; ++h) {
      const size_t hs = static_cast<size_t>(h);
      s.seeds[2 * hs] = span_seed(o_.kmeans_seed, layer, h, 0, ls.first_frame);
      s.seeds[2 * hs + 1] = span_seed(o_.kmeans_seed, layer, h, 1, ls.first_frame);
    }
  }
  return absl::OkStatus();
}

const SpanCoding* SpanHostCoder::span_of(int32_t layer, int64_t frame) const {
  for (const SpanCoding& s : layers_[static_cast<size_t>(layer)].last)
    if (frame >= s.first_frame && frame < s.first_frame + s.frames) return &s;
  return nullptr;
}

}  // namespace wm::cuda
