#include "cuda/kv_span_host.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "quant/kv_layouts.h"
#include "quant/kv_span.h"

namespace wm::cuda {

absl::Status device_span_support(const KvGeometry& g, const KvFormatOptions& o, bool quantwm) {
  if (absl::Status s = span_validate(g, o); !s.ok()) return s;
  const char* name = quantwm ? "quantwm2" : "qvg2";
  if (o.span_frames > 1)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU codes every append as one span (span_frames 0 or 1, not ",
                                                 o.span_frames, "); the CPU backend serves this setting"));
  if (o.quantize_sinks)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU keeps the sink frames fp16 (quantize_sinks=false); "
                                                 "the CPU backend serves this setting"));
  if (!o.quantize_keys || !o.quantize_values)
    return absl::UnimplementedError(absl::StrCat(name, " on the GPU codes keys and values both"));
  return absl::OkStatus();
}

uint16_t span_fp16(float x) { return f32_to_f16(kv_sanitize(x)); }

SpanHostCoder::SpanHostCoder(const KvGeometry& g, const KvFormatOptions& o, bool quantwm)
    : g_(g), o_(o), plan_(span_plan(g, o, quantwm)), qsac_(quantwm && o.qsac), psac_(plan_.psac) {
  for (int l = 0; l < g.layers; ++l) {
    layers_.emplace_back(plan_);
    for (int h = 0; h < g.heads; ++h) layers_.back().stats.emplace_back(g.head_dim);
  }
  has_basis_.assign(static_cast<size_t>(g.layers), std::vector<bool>(static_cast<size_t>(g.window_frames), false));
}

void SpanHostCoder::observe(int32_t layer, const float* q, int32_t n) {
  if (!observes_queries() || layer < 0 || layer >= g_.layers) return;
  Layer& L = layers_[static_cast<size_t>(layer)];
  const int H = g_.heads, D = g_.head_dim;
#pragma omp parallel for schedule(static)
  for (int h = 0; h < H; ++h) L.stats[static_cast<size_t>(h)].add(q + h * D, H * D, n);
}

absl::Status SpanHostCoder::append(int32_t layer, const float* k, const float* v, int64_t first_frame,
                                   int32_t frames) {
  if (layer < 0 || layer >= g_.layers) return absl::InvalidArgumentError("span coder: bad layer");
  Layer& L = layers_[static_cast<size_t>(layer)];
  if (first_frame != L.ledger.frames_appended())
    return absl::FailedPreconditionError(absl::StrCat("span coder: layer ", layer, " expects frame ",
                                                      L.ledger.frames_appended(), " next, got ", first_frame));
  for (int32_t f = 0; f < frames; ++f) L.ledger.add_frame(first_frame + f);
  const bool seen = std::any_of(L.stats.begin(), L.stats.end(), [](const QueryStats& s) { return s.count() > 0; });
  const SpanLedger::AppendResult res = L.ledger.end_append(seen);
  const auto& spans = L.ledger.spans();
  const int H = g_.heads, D = g_.head_dim, T = g_.tokens_per_frame;
  if (res.new_basis) {  // the CPU's compute_basis: fp16 rows, zero for a head with no finite query yet
    auto basis = std::make_shared<std::vector<std::vector<uint16_t>>>(static_cast<size_t>(H));
    std::vector<float> u(static_cast<size_t>(kPsacRank) * D);
    for (int h = 0; h < H; ++h) {
      auto& b = (*basis)[static_cast<size_t>(h)];
      b.assign(u.size(), 0);
      if (!L.stats[static_cast<size_t>(h)].principal_basis(kPsacRank, u.data(), nullptr)) continue;
      for (size_t i = 0; i < u.size(); ++i) b[i] = f32_to_f16(u[i]);
    }
    L.basis = std::move(basis);
  }
  L.last.clear();
  L.last.resize(static_cast<size_t>(res.new_spans));
  for (int i = 0; i < res.new_spans; ++i) {
    const SpanLedger::Span& ls = spans[spans.size() - static_cast<size_t>(res.new_spans) + static_cast<size_t>(i)];
    CodedSpan& s = L.last[static_cast<size_t>(i)];
    s.index = L.spans_coded++;
    s.first_frame = ls.first_frame;
    s.frames = ls.frames;
    if (ls.first_frame < first_frame || ls.first_frame + ls.frames > first_frame + frames)
      return absl::InternalError("span coder: a span outside its append (span_frames must be 0 or 1)");
    if (ls.basis >= 0) s.basis = L.basis;
    s.k.resize(static_cast<size_t>(H));
    s.v.resize(static_cast<size_t>(H));
    const int N = ls.frames * T;
    const int64_t row0 = (ls.first_frame - first_frame) * T;
#pragma omp parallel for schedule(dynamic)
    for (int h = 0; h < H; ++h) {
      // the CPU's pending frames: sanitized, rounded to fp16
      std::vector<float> xk(static_cast<size_t>(N) * D), xv(xk.size());
      for (int t = 0; t < N; ++t)
        for (int d = 0; d < D; ++d) {
          const size_t src = (static_cast<size_t>(row0 + t) * H + h) * D + d, dst = static_cast<size_t>(t) * D + d;
          xk[dst] = f16_to_f32(span_fp16(k[src]));
          xv[dst] = f16_to_f32(span_fp16(v[src]));
        }
      const size_t hs = static_cast<size_t>(h);
      SpanCodecParams p;
      p.block = plan_.block;
      p.centroids = ls.centroids;
      p.iters = o_.kmeans_iters;
      p.coeff_bits = plan_.coeff_bits;
      std::vector<float> w(static_cast<size_t>(D)), basis(static_cast<size_t>(kPsacRank) * D);
      SpanCodecParams pk = p;
      pk.seed = span_seed(o_.kmeans_seed, layer, h, 0, ls.first_frame);
      if (qsac_) {
        if (L.stats[hs].channel_weights(o_.qsac_weight_floor, w.data())) pk.weights = w.data();
        pk.candidates = o_.qsac_candidates;
      }
      if (s.basis != nullptr) {
        for (size_t i = 0; i < basis.size(); ++i) basis[i] = f16_to_f32((*s.basis)[hs][i]);
        pk.basis = basis.data();
      }
      span_encode(xk.data(), N, D, D, pk, &s.k[hs]);
      SpanCodecParams pv = p;
      pv.seed = span_seed(o_.kmeans_seed, layer, h, 1, ls.first_frame);
      span_encode(xv.data(), N, D, D, pv, &s.v[hs]);
    }
    s.views.resize(static_cast<size_t>(ls.frames) * H);
    for (int f = 0; f < ls.frames; ++f)
      for (int h = 0; h < H; ++h) {
        SpanFrameCodes& c = s.views[static_cast<size_t>(f) * H + h];
        c.k = &s.k[static_cast<size_t>(h)];
        c.v = &s.v[static_cast<size_t>(h)];
        c.first_token = f * T;
        c.span = s.index;
        c.basis = s.basis != nullptr ? &(*s.basis)[static_cast<size_t>(h)] : nullptr;
      }
  }
  return absl::OkStatus();
}

const SpanFrameCodes* SpanHostCoder::frame(int32_t layer, int64_t frame, int32_t head) const {
  for (const CodedSpan& s : layers_[static_cast<size_t>(layer)].last)
    if (frame >= s.first_frame && frame < s.first_frame + s.frames)
      return &s.views[static_cast<size_t>(frame - s.first_frame) * g_.heads + head];
  return nullptr;
}

}  // namespace wm::cuda
