// KIVI-2. Storage per layer: fp16 sink tokens (never quantized), quantized
// chunks of G tokens, and the fp16 buffer of the newest tokens; each store is
// head-major ([heads][tokens][head_dim]) so one head's tile is contiguous.
// A chunk is held whole until all its tokens left the window; attention masks
// its evicted front (kv_ledger.h).
#include "quant/kv_kivi.h"

#include <deque>

#include "absl/strings/str_cat.h"
#include "quant/attention_cpu.h"
#include "quant/fp16_rows.h"
#include "quant/frame_window.h"
#include "quant/kv_layouts.h"

namespace wm {
namespace {

// tokens per tile: enough chunks to keep the GEMMs busy, small enough for the scratch
constexpr int kTileTokens = 256;

template <int G>
class KiviKvCache final : public KvCache {
  using Block = BlockQ2Asym<G>;

 public:
  KiviKvCache(std::string name, const KvGeometry& g, const KvFormatOptions& o)
      : name_(std::move(name)), g_(g), plan_(kivi_plan(g, o)), window_(g.window_frames, g.sink_frames) {
    for (int l = 0; l < g.layers; ++l) layers_.emplace_back(plan_, g.heads);
  }

  absl::string_view format() const override { return name_; }
  const KvGeometry& geometry() const override { return g_; }

  // one chunk: G tokens of every head. keys quantized: [heads][head_dim]
  // blocks over the G tokens of one channel; values quantized: [heads][G]
  // [head_dim / G] blocks over G channels of one token; a side kept fp16:
  // [heads][G][head_dim]
  struct Chunk {
    std::vector<Block> kq, vq;
    std::vector<uint16_t> kf, vf;
  };
  struct Layer {
    Layer(const KiviPlan& p, int heads) : ledger(p), sink_k(heads), sink_v(heads), buf_k(heads), buf_v(heads) {}
    KiviLedger ledger;
    std::vector<std::vector<uint16_t>> sink_k, sink_v;  // [heads][sink tokens * head_dim]
    std::vector<std::vector<uint16_t>> buf_k, buf_v;    // [heads][buffered tokens * head_dim]
    std::deque<Chunk> chunks;
  };

  // the tile source (attention_cpu.h): sinks, runs of chunks, the buffer
  struct Tiles {
    struct Ref {
      int kind;         // 0 sinks, 1 chunks, 2 buffer
      int first, last;  // chunk range [first, last) for kind 1
      int skip;         // evicted tokens at the front of chunk `first`
      int tokens;
    };
    const Layer* layer;
    int head_dim;
    bool kq, vq;        // which sides are quantized
    std::vector<Ref> refs;

    int tiles() const { return static_cast<int>(refs.size()); }
    int tile_tokens(int t) const { return refs[static_cast<size_t>(t)].tokens; }
    void add_logit_bias(int, int, const float*, int, int, float*, int) const {}

    void load(int t, int head, float* k, float* v) const {
      const Ref& r = refs[static_cast<size_t>(t)];
      const int D = head_dim;
      if (r.kind != 1) {
        const auto& ks = r.kind == 0 ? layer->sink_k : layer->buf_k;
        const auto& vs = r.kind == 0 ? layer->sink_v : layer->buf_v;
        load_row(ks[static_cast<size_t>(head)].data(), k, r.tokens * D);
        load_row(vs[static_cast<size_t>(head)].data(), v, r.tokens * D);
        return;
      }
      float zf[512], sf[512];
      int row = 0;
      for (int c = r.first; c < r.last; ++c) {
        const Chunk& ch = layer->chunks[static_cast<size_t>(c)];
        const int skip = c == r.first ? r.skip : 0;
        const int n = G - skip;
        if (kq) {
          const Block* kb = ch.kq.data() + static_cast<size_t>(head) * D;
          for (int d = 0; d < D; ++d) {
            zf[d] = f16_to_f32(kb[d].zero);
            sf[d] = f16_to_f32(kb[d].scale);
          }
          for (int i = 0; i < n; ++i) {
            const int tok = skip + i;
            const int byte = tok >> 2, sh = (tok & 3) * 2;
            float* kr = k + static_cast<size_t>(row + i) * D;
            for (int d = 0; d < D; ++d) kr[d] = zf[d] + sf[d] * static_cast<float>((kb[d].codes[byte] >> sh) & 3);
          }
        } else {
          load_row(ch.kf.data() + (static_cast<size_t>(head) * G + skip) * D, k + static_cast<size_t>(row) * D, n * D);
        }
        if (vq) {
          const int nb = D / G;
          const Block* vb = ch.vq.data() + (static_cast<size_t>(head) * G + skip) * nb;
          for (int i = 0; i < n * nb; ++i) {
            const float z = f16_to_f32(vb[i].zero), s = f16_to_f32(vb[i].scale);
            float* out = v + static_cast<size_t>(row) * D + static_cast<size_t>(i) * G;
            for (int j = 0; j < G; ++j) out[j] = z + s * static_cast<float>((vb[i].codes[j >> 2] >> ((j & 3) * 2)) & 3);
          }
        } else {
          load_row(ch.vf.data() + (static_cast<size_t>(head) * G + skip) * D, v + static_cast<size_t>(row) * D, n * D);
        }
        row += n;
      }
    }
  };

  void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) override {
    const Layer& L = layers_[static_cast<size_t>(layer)];
    Tiles t{&L, g_.head_dim, plan_.quantize_keys, plan_.quantize_values, {}};
    const int D = g_.head_dim;
    const int sink_tokens = static_cast<int>(L.sink_k[0].size() / D);
    if (sink_tokens > 0) t.refs.push_back({0, 0, 0, 0, sink_tokens});
    const int nc = static_cast<int>(L.chunks.size());
    const int skip = nc > 0 ? static_cast<int>(L.ledger.chunk_live_from(L.ledger.chunks().front())) : 0;
    for (int c = 0; c < nc;) {
      const int last = std::min(nc, c + kTileTokens / G);
      const int tokens = (last - c) * G - (c == 0 ? skip : 0);
      t.refs.push_back({1, c, last, c == 0 ? skip : 0, tokens});
      c = last;
    }
    const int buf_tokens = static_cast<int>(L.buf_k[0].size() / D);
    if (buf_tokens > 0) t.refs.push_back({2, 0, 0, 0, buf_tokens});
    attend_all_heads(t, g_.heads, D, q, k_cur, v_cur, n, out);
  }

  absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override {
    Layer& L = layers_[static_cast<size_t>(layer)];
    if (absl::Status s = check_append_order(name_, layer, first_frame, L.ledger.frames_appended()); !s.ok()) return s;
    const int T = g_.tokens_per_frame, H = g_.heads, D = g_.head_dim;
    for (int f = 0; f < frames; ++f) {
      const int64_t frame = first_frame + f;
      auto& dk = frame < g_.sink_frames ? L.sink_k : L.buf_k;
      auto& dv = frame < g_.sink_frames ? L.sink_v : L.buf_v;
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) {
          const size_t src = (static_cast<size_t>(f * T + t) * H + h) * D;
          for (int d = 0; d < D; ++d) {
            dk[static_cast<size_t>(h)].push_back(f32_to_f16(kv_sanitize(k[src + d])));
            dv[static_cast<size_t>(h)].push_back(f32_to_f16(kv_sanitize(v[src + d])));
          }
        }
      const int flushed = L.ledger.add_frame(frame);
      for (int c = 0; c < flushed; ++c) L.chunks.push_back(quantize_front(&L));
      // follow the ledger's eviction: whole chunks from the front, and buffer
      // tokens only when R exceeds the window
      while (L.chunks.size() > L.ledger.chunks().size()) L.chunks.pop_front();
      const size_t keep = static_cast<size_t>(L.ledger.buffer_tokens()) * D;
      for (int h = 0; h < H; ++h) {
        auto& bk = L.buf_k[static_cast<size_t>(h)];
        auto& bv = L.buf_v[static_cast<size_t>(h)];
        if (bk.size() > keep) {
          bk.erase(bk.begin(), bk.end() - static_cast<std::ptrdiff_t>(keep));
          bv.erase(bv.begin(), bv.end() - static_cast<std::ptrdiff_t>(keep));
        }
      }
    }
    return absl::OkStatus();
  }

  KvBytes bytes() const override {
    // counted from what is stored (tests check it against the ledger)
    KvBytes b;
    for (const Layer& L : layers_) {
      for (int h = 0; h < g_.heads; ++h)
        b.fp_values += static_cast<int64_t>(L.sink_k[static_cast<size_t>(h)].size() + L.sink_v[static_cast<size_t>(h)].size() +
                                            L.buf_k[static_cast<size_t>(h)].size() + L.buf_v[static_cast<size_t>(h)].size()) * 2;
      for (const Chunk& c : L.chunks) {
        for (const auto* q : {&c.kq, &c.vq}) {
          b.codes += static_cast<int64_t>(q->size()) * (G / 4);
          b.scales += static_cast<int64_t>(q->size()) * 2;
          b.zeros += static_cast<int64_t>(q->size()) * 2;
        }
        b.fp_values += static_cast<int64_t>(c.kf.size() + c.vf.size()) * 2;
      }
    }
    return b;
  }

  std::vector<int64_t> frames(int layer) const override {
    return window_.kept(layers_[static_cast<size_t>(layer)].ledger.frames_appended());
  }

  void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const override {
    // the scalar reference decoder, independent of the tile loader
    const Layer& L = layers_[static_cast<size_t>(layer)];
    const int H = g_.heads, D = g_.head_dim;
    std::vector<std::vector<float>> kh(static_cast<size_t>(H)), vh(static_cast<size_t>(H));  // [heads][tokens * D]
    std::vector<float> tmp(static_cast<size_t>(G));
    const int skip = L.chunks.empty() ? 0 : static_cast<int>(L.ledger.chunk_live_from(L.ledger.chunks().front()));
    for (int h = 0; h < H; ++h) {
      auto& ko = kh[static_cast<size_t>(h)];
      auto& vo = vh[static_cast<size_t>(h)];
      for (uint16_t x : L.sink_k[static_cast<size_t>(h)]) ko.push_back(f16_to_f32(x));
      for (uint16_t x : L.sink_v[static_cast<size_t>(h)]) vo.push_back(f16_to_f32(x));
      for (size_t c = 0; c < L.chunks.size(); ++c) {
        const Chunk& ch = L.chunks[c];
        std::vector<float> kc(static_cast<size_t>(G) * D), vc(static_cast<size_t>(G) * D);
        if (plan_.quantize_keys) {
          for (int d = 0; d < D; ++d) {
            q2asym_dequantize_ref<G>(ch.kq[static_cast<size_t>(h) * D + d], tmp.data());
            for (int t = 0; t < G; ++t) kc[static_cast<size_t>(t) * D + d] = tmp[static_cast<size_t>(t)];
          }
        } else {
          for (int i = 0; i < G * D; ++i) kc[static_cast<size_t>(i)] = f16_to_f32(ch.kf[static_cast<size_t>(h) * G * D + i]);
        }
        if (plan_.quantize_values) {
          for (int i = 0; i < D; ++i)  // G tokens x D/G blocks = D blocks
            q2asym_dequantize_ref<G>(ch.vq[static_cast<size_t>(h) * D + i], vc.data() + static_cast<size_t>(i) * G);
        } else {
          for (int i = 0; i < G * D; ++i) vc[static_cast<size_t>(i)] = f16_to_f32(ch.vf[static_cast<size_t>(h) * G * D + i]);
        }
        const int from = c == 0 ? skip : 0;
        ko.insert(ko.end(), kc.begin() + static_cast<std::ptrdiff_t>(from) * D, kc.end());
        vo.insert(vo.end(), vc.begin() + static_cast<std::ptrdiff_t>(from) * D, vc.end());
      }
      for (uint16_t x : L.buf_k[static_cast<size_t>(h)]) ko.push_back(f16_to_f32(x));
      for (uint16_t x : L.buf_v[static_cast<size_t>(h)]) vo.push_back(f16_to_f32(x));
    }
    const size_t tokens = kh[0].size() / static_cast<size_t>(D);
    k->assign(tokens * H * D, 0.0f);
    v->assign(k->size(), 0.0f);
    for (int h = 0; h < H; ++h)
      for (size_t t = 0; t < tokens; ++t)
        for (int d = 0; d < D; ++d) {
          (*k)[(t * H + h) * D + d] = kh[static_cast<size_t>(h)][t * D + d];
          (*v)[(t * H + h) * D + d] = vh[static_cast<size_t>(h)][t * D + d];
        }
  }

 private:
  // quantizes the G oldest buffered tokens of every head into a chunk
  Chunk quantize_front(Layer* L) const {
    const int H = g_.heads, D = g_.head_dim;
    Chunk c;
    if (plan_.quantize_keys) c.kq.resize(static_cast<size_t>(H) * D);
    else c.kf.resize(static_cast<size_t>(H) * G * D);
    if (plan_.quantize_values) c.vq.resize(static_cast<size_t>(H) * D);
    else c.vf.resize(static_cast<size_t>(H) * G * D);
    std::vector<float> col(static_cast<size_t>(G)), row(static_cast<size_t>(D));
    for (int h = 0; h < H; ++h) {
      auto& bk = L->buf_k[static_cast<size_t>(h)];
      auto& bv = L->buf_v[static_cast<size_t>(h)];
      if (plan_.quantize_keys) {
        for (int d = 0; d < D; ++d) {
          for (int t = 0; t < G; ++t) col[static_cast<size_t>(t)] = f16_to_f32(bk[static_cast<size_t>(t) * D + d]);
          q2asym_quantize_ref<G>(col.data(), &c.kq[static_cast<size_t>(h) * D + d]);
        }
      } else {
        std::copy(bk.begin(), bk.begin() + static_cast<std::ptrdiff_t>(G) * D, c.kf.begin() + static_cast<std::ptrdiff_t>(h) * G * D);
      }
      if (plan_.quantize_values) {
        for (int t = 0; t < G; ++t) {
          load_row(bv.data() + static_cast<size_t>(t) * D, row.data(), D);
          for (int j = 0; j < D / G; ++j)
            q2asym_quantize_ref<G>(row.data() + j * G, &c.vq[(static_cast<size_t>(h) * G + t) * (D / G) + j]);
        }
      } else {
        std::copy(bv.begin(), bv.begin() + static_cast<std::ptrdiff_t>(G) * D, c.vf.begin() + static_cast<std::ptrdiff_t>(h) * G * D);
      }
      bk.erase(bk.begin(), bk.begin() + static_cast<std::ptrdiff_t>(G) * D);
      bv.erase(bv.begin(), bv.begin() + static_cast<std::ptrdiff_t>(G) * D);
    }
    return c;
  }

  std::string name_;
  KvGeometry g_;
  KiviPlan plan_;
  FrameWindow window_;
  std::vector<Layer> layers_;
};

}  // namespace

absl::Status kivi_validate(const KvGeometry& g, const KvFormatOptions& o) {
  const int G = o.kivi_group;
  if (G != 32 && G != 64 && G != 128) return absl::InvalidArgumentError(absl::StrCat("group ", G, " is not 32, 64 or 128"));
  if (g.head_dim % G != 0)
    return absl::InvalidArgumentError(absl::StrCat("group ", G, " does not divide head_dim ", g.head_dim));
  if (g.head_dim > 512) return absl::InvalidArgumentError("head_dim above 512");
  // the ledger's worst case replays twice the residual
  if (o.kivi_residual <= 0 || o.kivi_residual % G != 0 || o.kivi_residual > kMaxKiviResidual)
    return absl::InvalidArgumentError(absl::StrCat("residual ", o.kivi_residual, " is not a multiple of ", G,
                                                   " within ", G, "..", kMaxKiviResidual));
  return absl::OkStatus();
}

KiviPlan kivi_plan(const KvGeometry& g, const KvFormatOptions& o) {
  KiviPlan p;
  p.heads = g.heads;
  p.head_dim = g.head_dim;
  p.tokens_per_frame = g.tokens_per_frame;
  p.window_frames = g.window_frames;
  p.sink_frames = g.sink_frames;
  p.group = o.kivi_group;
  p.residual = o.kivi_residual;
  p.quantize_keys = o.quantize_keys;
  p.quantize_values = o.quantize_values;
  return p;
}

std::unique_ptr<KvCache> make_kivi_cache(std::string name, const KvGeometry& g, const KvFormatOptions& o) {
  switch (o.kivi_group) {
    case 32: return std::make_unique<KiviKvCache<32>>(std::move(name), g, o);
    case 64: return std::make_unique<KiviKvCache<64>>(std::move(name), g, o);
    default: return std::make_unique<KiviKvCache<128>>(std::move(name), g, o);
  }
}

}  // namespace wm
