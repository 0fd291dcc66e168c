// QVG-2 and QuantWM-2 caches: storage follows the SpanLedger (kv_ledger.h),
// attention runs over SpanTiles (span_tiles.h), spans are encoded by
// span_codec.h. Append time: fp16 pending frames; when a span completes, its
// frames are clustered and coded per (head, side), QuantWM first freezing the
// query statistics it uses (weights, basis). Attention time: dequantize one
// tile per head, add the PSAC logit correction, online softmax.
#include "quant/kv_span.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "quant/attention_cpu.h"
#include "quant/fp16_rows.h"
#include "quant/frame_window.h"
#include "quant/kv_layouts.h"
#include "quant/span_tiles.h"

namespace wm {
namespace {

class SpanKvCache final : public KvCache {
 public:
  SpanKvCache(std::string name, const KvGeometry& g, const KvFormatOptions& o, bool quantwm)
      : name_(std::move(name)), g_(g), o_(o), plan_(span_plan(g, o, quantwm)), window_(g.window_frames, g.sink_frames),
        qsac_(quantwm && o.qsac), psac_(plan_.psac) {
    for (int l = 0; l < g.layers; ++l) layers_.emplace_back(plan_, g.heads, g.head_dim);
  }

  absl::string_view format() const override { return name_; }
  const KvGeometry& geometry() const override { return g_; }

  void observe_queries(int layer, const float* q, int n) override {
    if (!qsac_ && !psac_) return;
    SpanLayer& L = layers_[static_cast<size_t>(layer)];
    const int H = g_.heads, D = g_.head_dim;
#pragma omp parallel for schedule(static)
    for (int h = 0; h < H; ++h) L.stats[static_cast<size_t>(h)].add(q + h * D, H * D, n);
  }

  void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) override {
    switch (plan_.block) {
      case 16: return attend_block<16>(layer, q, k_cur, v_cur, n, out);
      case 32: return attend_block<32>(layer, q, k_cur, v_cur, n, out);
      case 64: return attend_block<64>(layer, q, k_cur, v_cur, n, out);
      default: return attend_block<128>(layer, q, k_cur, v_cur, n, out);
    }
  }

  absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override {
    SpanLayer& L = layers_[static_cast<size_t>(layer)];
    if (absl::Status s = check_append_order(name_, layer, first_frame, L.ledger.frames_appended()); !s.ok()) return s;
    const int T = g_.tokens_per_frame, H = g_.heads, D = g_.head_dim;
    for (int f = 0; f < frames; ++f) {
      PendingFrame pf;
      pf.frame = first_frame + f;
      pf.k.resize(static_cast<size_t>(H) * T * D);
      pf.v.resize(pf.k.size());
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t src = (static_cast<size_t>(f * T + t) * H + h) * D + d;
            const size_t dst = (static_cast<size_t>(h) * T + t) * D + d;
            pf.k[dst] = f32_to_f16(kv_sanitize(k[src]));
            pf.v[dst] = f32_to_f16(kv_sanitize(v[src]));
          }
      L.pending.push_back(std::move(pf));
      L.ledger.add_frame(first_frame + f);
    }
    const bool seen = std::any_of(L.stats.begin(), L.stats.end(), [](const QueryStats& s) { return s.count() > 0; });
    const SpanLedger::AppendResult res = L.ledger.end_append(seen);
    const auto& spans = L.ledger.spans();
    if (res.new_basis) L.basis = compute_basis(L, spans.back().basis);
    for (size_t i = spans.size() - static_cast<size_t>(res.new_spans); i < spans.size(); ++i)
      quantize_span(layer, &L, spans[i]);
    sync_eviction(&L);
    return absl::OkStatus();
  }

  KvBytes bytes() const override {
    // counted from what is stored (tests check it against the ledger)
    KvBytes b;
    const int D = g_.head_dim;
    for (const SpanLayer& L : layers_) {
      for (const PendingFrame& p : L.pending) b.fp_values += static_cast<int64_t>(p.k.size() + p.v.size()) * 2;
      std::set<const PsacBasis*> bases;
      for (const QuantSpan& s : L.spans) {
        if (s.basis != nullptr) bases.insert(s.basis.get());
        for (const auto* side : {&s.k, &s.v})
          for (const SpanHeadCodes& c : *side) {
            const int64_t nblocks = static_cast<int64_t>(c.ids.size()) * (D / plan_.block);
            b.scales += nblocks;
            b.codes += static_cast<int64_t>(c.blocks.size()) - nblocks;
            b.ids += static_cast<int64_t>(c.ids.size());
            b.centroids += static_cast<int64_t>(c.centroids.size()) * 2;
            b.coeffs += static_cast<int64_t>(c.coeffs.size());
          }
        for (const auto* side : {&s.kf, &s.vf})
          for (const auto& f : *side) b.fp_values += static_cast<int64_t>(f.size()) * 2;
      }
      for (const PsacBasis* p : bases) b.bases += static_cast<int64_t>(p->u.size()) * 2;
    }
    return b;
  }

  std::vector<int64_t> frames(int layer) const override {
    return window_.kept(layers_[static_cast<size_t>(layer)].ledger.frames_appended());
  }

  void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const override {
    // the scalar reference decoder (PSAC folded into the keys), in frame order
    const SpanLayer& L = layers_[static_cast<size_t>(layer)];
    const int H = g_.heads, D = g_.head_dim, T = g_.tokens_per_frame;
    struct Item {
      int64_t frame;
      const PendingFrame* p;
      const QuantSpan* s;
    };
    std::vector<Item> items;
    for (const auto& p : L.pending) items.push_back({p.frame, &p, nullptr});
    for (const auto& s : L.spans) items.push_back({s.first_frame + s.evicted, nullptr, &s});
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.frame < b.frame; });
    size_t tokens = 0;
    for (const Item& it : items) tokens += it.p != nullptr ? static_cast<size_t>(T) : static_cast<size_t>(it.s->tokens);
    k->assign(tokens * H * D, 0.0f);
    v->assign(k->size(), 0.0f);
    std::vector<float> basis(static_cast<size_t>(kPsacRank) * D);
    size_t row = 0;
    for (const Item& it : items) {
      const int n = it.p != nullptr ? T : it.s->tokens;
      for (int h = 0; h < H; ++h) {
        float* ko = k->data() + (row * H + h) * D;
        float* vo = v->data() + (row * H + h) * D;
        const size_t hs = static_cast<size_t>(h);
        if (it.p != nullptr) {
          for (int t = 0; t < T; ++t) {
            load_row(it.p->k.data() + (hs * T + t) * D, ko + static_cast<size_t>(t) * H * D, D);
            load_row(it.p->v.data() + (hs * T + t) * D, vo + static_cast<size_t>(t) * H * D, D);
          }
          continue;
        }
        const QuantSpan& s = *it.s;
        if (plan_.quantize_keys) {
          const float* b = nullptr;
          if (s.basis != nullptr) {
            for (size_t i = 0; i < basis.size(); ++i) basis[i] = f16_to_f32(s.basis->u[hs * basis.size() + i]);
            b = basis.data();
          }
          span_decode_ref(s.k[hs], n, D, plan_.block, plan_.coeff_bits, b, ko, H * D);
        } else {
          for (int t = 0; t < n; ++t) load_row(s.kf[hs].data() + static_cast<size_t>(t) * D, ko + static_cast<size_t>(t) * H * D, D);
        }
        if (plan_.quantize_values) {
          span_decode_ref(s.v[hs], n, D, plan_.block, plan_.coeff_bits, nullptr, vo, H * D);
        } else {
          for (int t = 0; t < n; ++t) load_row(s.vf[hs].data() + static_cast<size_t>(t) * D, vo + static_cast<size_t>(t) * H * D, D);
        }
      }
      row += static_cast<size_t>(n);
    }
  }

 private:
  template <int B>
  void attend_block(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) {
    if (plan_.coeff_bits == 8) return attend_tiles<B, PsacCoeffsI8<kPsacRank>>(layer, q, k_cur, v_cur, n, out);
    return attend_tiles<B, PsacCoeffsI4<kPsacRank>>(layer, q, k_cur, v_cur, n, out);
  }

  template <int B, class Coeffs>
  void attend_tiles(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) {
    const SpanLayer& L = layers_[static_cast<size_t>(layer)];
    SpanTiles<B, Coeffs> t;
    t.head_dim = g_.head_dim;
    t.tokens_per_frame = g_.tokens_per_frame;
    t.keys_quantized = plan_.quantize_keys;
    t.values_quantized = plan_.quantize_values;
    t.scratch.resize(static_cast<size_t>(g_.heads));
    // frame order: pending sinks, spans, pending frames of the open span
    auto pit = L.pending.begin();
    for (const QuantSpan& s : L.spans) {
      for (; pit != L.pending.end() && pit->frame < s.first_frame; ++pit) t.refs.push_back({&*pit, nullptr, 0, g_.tokens_per_frame});
      for (int b = 0; b < s.tokens; b += kSpanTileTokens)
        t.refs.push_back({nullptr, &s, b, std::min(kSpanTileTokens, s.tokens - b)});
    }
    for (; pit != L.pending.end(); ++pit) t.refs.push_back({&*pit, nullptr, 0, g_.tokens_per_frame});
    attend_all_heads(t, g_.heads, g_.head_dim, q, k_cur, v_cur, n, out);
  }

  std::shared_ptr<const PsacBasis> compute_basis(const SpanLayer& L, int64_t id) const {
    auto b = std::make_shared<PsacBasis>();
    b->id = id;
    b->u = principal_bases_f16(L.stats, kPsacRank);  // a head with no finite query yet: zeros, no correction
    return b;
  }

  void quantize_span(int layer, SpanLayer* L, const SpanLedger::Span& ls) {
    const int T = g_.tokens_per_frame, H = g_.heads, D = g_.head_dim;
    // the span's frames are consecutive pending frames
    auto first = std::lower_bound(L->pending.begin(), L->pending.end(), ls.first_frame,
                                  [](const PendingFrame& p, int64_t f) { return p.frame < f; });
    auto last = std::lower_bound(first, L->pending.end(), ls.first_frame + ls.frames,
                                 [](const PendingFrame& p, int64_t f) { return p.frame < f; });
    std::vector<const PendingFrame*> fr;
    for (auto it = first; it != last; ++it) fr.push_back(&*it);
    const int N = static_cast<int>(fr.size()) * T;
    QuantSpan s;
    s.first_frame = ls.first_frame;
    s.frames = ls.frames;
    s.tokens = N;
    if (ls.basis >= 0) s.basis = L->basis;
    if (plan_.quantize_keys) s.k.resize(static_cast<size_t>(H));
    else s.kf.resize(static_cast<size_t>(H));
    if (plan_.quantize_values) s.v.resize(static_cast<size_t>(H));
    else s.vf.resize(static_cast<size_t>(H));
#pragma omp parallel for schedule(dynamic)
    for (int h = 0; h < H; ++h) {
      const size_t hs = static_cast<size_t>(h);
      std::vector<float> xk(static_cast<size_t>(N) * D), xv(xk.size());
      for (size_t f = 0; f < fr.size(); ++f) {
        load_row(fr[f]->k.data() + hs * T * D, xk.data() + f * T * D, T * D);
        load_row(fr[f]->v.data() + hs * T * D, xv.data() + f * T * D, T * D);
      }
      SpanCodecParams p;
      p.block = plan_.block;
      p.centroids = ls.centroids;
      p.iters = o_.kmeans_iters;
      p.coeff_bits = plan_.coeff_bits;
      // the statistics are read now and never again for this span (causality)
      std::vector<float> w(static_cast<size_t>(D)), basis(static_cast<size_t>(kPsacRank) * D);
      if (plan_.quantize_keys) {
        SpanCodecParams pk = p;
        pk.seed = span_seed(o_.kmeans_seed, layer, h, 0, ls.first_frame);
        if (qsac_) {
          if (L->stats[hs].channel_weights(o_.qsac_weight_floor, w.data())) pk.weights = w.data();
          pk.candidates = o_.qsac_candidates;
        }
        if (s.basis != nullptr) {
          for (size_t i = 0; i < basis.size(); ++i) basis[i] = f16_to_f32(s.basis->u[hs * basis.size() + i]);
          pk.basis = basis.data();
        }
        span_encode(xk.data(), N, D, D, pk, &s.k[hs]);
      } else {
        for (const PendingFrame* f : fr) s.kf[hs].insert(s.kf[hs].end(), f->k.begin() + static_cast<std::ptrdiff_t>(hs * T * D),
                                                         f->k.begin() + static_cast<std::ptrdiff_t>((hs + 1) * T * D));
      }
      if (plan_.quantize_values) {
        SpanCodecParams pv = p;
        pv.seed = span_seed(o_.kmeans_seed, layer, h, 1, ls.first_frame);
        span_encode(xv.data(), N, D, D, pv, &s.v[hs]);
      } else {
        for (const PendingFrame* f : fr) s.vf[hs].insert(s.vf[hs].end(), f->v.begin() + static_cast<std::ptrdiff_t>(hs * T * D),
                                                         f->v.begin() + static_cast<std::ptrdiff_t>((hs + 1) * T * D));
      }
    }
    L->pending.erase(first, last);
    L->spans.push_back(std::move(s));
  }

  // makes the storage follow the ledger's evictions
  void sync_eviction(SpanLayer* L) const {
    const auto& lp = L->ledger.pending();
    std::deque<PendingFrame> kept;
    size_t j = 0;
    for (auto& p : L->pending) {
      while (j < lp.size() && lp[j] < p.frame) ++j;
      if (j < lp.size() && lp[j] == p.frame) kept.push_back(std::move(p));
    }
    L->pending.swap(kept);
    const auto& ls = L->ledger.spans();
    std::deque<QuantSpan> spans;
    for (auto& s : L->spans) {
      auto it = std::find_if(ls.begin(), ls.end(), [&](const SpanLedger::Span& x) { return x.first_frame == s.first_frame; });
      if (it == ls.end()) continue;
      if (it->evicted > s.evicted) {
        const int drop = (it->evicted - s.evicted) * g_.tokens_per_frame;
        for (auto& c : s.k) span_drop_front(&c, drop, g_.head_dim, plan_.block, plan_.coeff_bits);
        for (auto& c : s.v) span_drop_front(&c, drop, g_.head_dim, plan_.block, plan_.coeff_bits);
        for (auto* side : {&s.kf, &s.vf})
          for (auto& f : *side) f.erase(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(drop) * g_.head_dim);
        s.tokens -= drop;
        s.evicted = it->evicted;
      }
      spans.push_back(std::move(s));
    }
    L->spans.swap(spans);
  }

  std::string name_;
  KvGeometry g_;
  KvFormatOptions o_;
  SpanPlan plan_;
  FrameWindow window_;
  bool qsac_, psac_;
  std::vector<SpanLayer> layers_;
};

}  // namespace

// B, capped at head_dim so that the default fits small heads
static int effective_block(const KvGeometry& g, const KvFormatOptions& o) { return std::min(o.block, g.head_dim); }

absl::Status span_validate(const KvGeometry& g, const KvFormatOptions& o) {
  // the value given is checked, not the one capped at head_dim, so that 256 fails like 48
  if (o.block != 16 && o.block != 32 && o.block != 64 && o.block != 128)
    return absl::InvalidArgumentError(absl::StrCat("block ", o.block, " is not 16, 32, 64 or 128"));
  // and the block it takes, capped at head_dim, is one the codec has: a head_dim of 48 caps 64 at 48
  const int B = effective_block(g, o);
  if (B != 16 && B != 32 && B != 64 && B != 128)
    return absl::InvalidArgumentError(absl::StrCat("block ", o.block, " capped at head_dim ", g.head_dim, " is ", B,
                                                   ", not 16, 32, 64 or 128"));
  if (g.head_dim % B != 0) return absl::InvalidArgumentError(absl::StrCat("block ", B, " does not divide head_dim ", g.head_dim));
  if (o.span_frames < 0 || o.span_frames > g.window_frames)
    return absl::InvalidArgumentError(absl::StrCat("span_frames ", o.span_frames, " must be within 0..window (",
                                                   g.window_frames, "; 0: one block)"));
  if (o.centroids < 1 || o.centroids > 256)
    return absl::InvalidArgumentError(absl::StrCat("centroids ", o.centroids, " must be within 1..256 (u8 ids)"));
  if (o.tokens_per_centroid < 1)
    return absl::InvalidArgumentError(absl::StrCat("tokens_per_centroid ", o.tokens_per_centroid, " must be positive"));
  if (o.kmeans_iters < 0 || o.kmeans_iters > kMaxKmeansIters)
    return absl::InvalidArgumentError(absl::StrCat("kmeans_iters ", o.kmeans_iters, " must be within 0..", kMaxKmeansIters));
  if (o.psac_rank != kPsacRank) return absl::InvalidArgumentError(absl::StrCat("psac_rank must be ", kPsacRank, " (the layout)"));
  if (o.psac_bits != 8 && o.psac_bits != 4)
    return absl::InvalidArgumentError(absl::StrCat("psac_bits ", o.psac_bits, " must be 8 or 4"));
  if (o.psac && g.head_dim < kPsacRank) return absl::InvalidArgumentError("head_dim below the PSAC rank");
  if (o.qsac_candidates < 1) return absl::InvalidArgumentError("qsac_candidates must be positive");
  if (!(o.qsac_weight_floor > 0.0f)) return absl::InvalidArgumentError("qsac_weight_floor must be positive");
  if (!o.psac) return absl::OkStatus();  // qvg2, -v and -qsac never refresh a basis
  // the ledger's worst case replays a multiple of the refresh period
  if (o.psac_refresh_frames < 1 || o.psac_refresh_frames > kMaxPsacRefreshFrames)
    return absl::InvalidArgumentError(absl::StrCat("psac_refresh_frames ", o.psac_refresh_frames, " must be within 1..",
                                                   kMaxPsacRefreshFrames));
  const int64_t period = std::lcm(std::lcm<int64_t>(std::max(o.span_frames, g.frames_per_block), o.psac_refresh_frames),
                                  g.frames_per_block);
  if (period > kMaxPsacRefreshFrames)
    return absl::InvalidArgumentError(absl::StrCat("spans of ", std::max(o.span_frames, g.frames_per_block),
                                                   " frames, blocks of ", g.frames_per_block, " and psac_refresh_frames ",
                                                   o.psac_refresh_frames, " line up only every ", period,
                                                   " frames, above ", kMaxPsacRefreshFrames));
  return absl::OkStatus();
}

SpanPlan span_plan(const KvGeometry& g, const KvFormatOptions& o, bool quantwm) {
  SpanPlan p;
  p.heads = g.heads;
  p.head_dim = g.head_dim;
  p.tokens_per_frame = g.tokens_per_frame;
  p.window_frames = g.window_frames;
  p.sink_frames = g.sink_frames;
  // 0: every append closes a span (the engine appends one block at a time)
  p.span_frames = std::max(1, o.span_frames);
  p.block = effective_block(g, o);
  p.max_centroids = o.centroids;
  p.tokens_per_centroid = o.tokens_per_centroid;
  p.quantize_keys = o.quantize_keys;
  p.quantize_values = o.quantize_values;
  p.quantize_sinks = o.quantize_sinks;
  p.psac = quantwm && o.psac && o.quantize_keys;
  p.coeff_bits = o.psac_bits;
  p.psac_refresh_frames = o.psac_refresh_frames;
  return p;
}

std::unique_ptr<KvCache> make_span_cache(std::string name, const KvGeometry& g, const KvFormatOptions& o, bool quantwm) {
  return std::make_unique<SpanKvCache>(std::move(name), g, o, quantwm);
}

}  // namespace wm
