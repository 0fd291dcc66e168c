// Full-precision formats: fp32 (exact) and fp16 (the reference cache).
// Storage: one page per (layer, frame), K and V each [heads, tokens, head_dim]
// so that a head's tile is contiguous.
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "quant/attention_cpu.h"
#include "quant/fp16_rows.h"
#include "quant/frame_window.h"
#include "quant/kv_fp.h"

namespace wm {
namespace {

inline void store_value(float x, float* dst) { *dst = x; }
inline void store_value(float x, uint16_t* dst) { *dst = f32_to_f16(x); }

template <class Store>
class FpKvCache final : public KvCache {
 public:
  FpKvCache(std::string name, const KvGeometry& g) : name_(std::move(name)), g_(g), window_(g.window_frames, g.sink_frames),
                                                     layers_(static_cast<size_t>(g.layers)) {}

  absl::string_view format() const override { return name_; }
  const KvGeometry& geometry() const override { return g_; }

  struct Page {
    int64_t frame;
    std::vector<Store> k, v;  // [heads, tokens, head_dim]
  };

  struct Tiles {
    const std::deque<Page>* pages;
    const KvGeometry* g;
    int tiles() const { return static_cast<int>(pages->size()); }
    int tile_tokens(int) const { return g->tokens_per_frame; }
    void load(int tile, int head, float* k, float* v) const {
      const Page& p = (*pages)[static_cast<size_t>(tile)];
      const size_t off = static_cast<size_t>(head) * g->tokens_per_frame * g->head_dim;
      const int n = g->tokens_per_frame * g->head_dim;
      load_row(p.k.data() + off, k, n);
      load_row(p.v.data() + off, v, n);
    }
    void add_logit_bias(int, int, const float*, int, int, float*, int) const {}
  };

  void attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, float* out) override {
    Tiles tiles{&layers_[static_cast<size_t>(layer)], &g_};
    attend_all_heads(tiles, g_.heads, g_.head_dim, q, k_cur, v_cur, n, out);
  }

  absl::Status append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override {
    auto& pages = layers_[static_cast<size_t>(layer)];
    if (!pages.empty() && first_frame <= pages.back().frame)
      return absl::FailedPreconditionError(absl::StrCat("frame ", first_frame, " appended after frame ", pages.back().frame));
    const int T = g_.tokens_per_frame, H = g_.heads, Dh = g_.head_dim;
    for (int f = 0; f < frames; ++f) {
      Page p;
      p.frame = first_frame + f;
      p.k.resize(static_cast<size_t>(H) * T * Dh);
      p.v.resize(p.k.size());
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < Dh; ++d) {
            const size_t src = (static_cast<size_t>(f * T + t) * H + h) * Dh + d;
            const size_t dst = (static_cast<size_t>(h) * T + t) * Dh + d;
            store_value(k[src], &p.k[dst]);
            store_value(v[src], &p.v[dst]);
          }
      pages.push_back(std::move(p));
    }
    const int64_t generated = first_frame + frames;
    for (auto it = pages.begin(); it != pages.end();) {
      if (!window_.keeps(it->frame, generated)) it = pages.erase(it);
      else ++it;
    }
    return absl::OkStatus();
  }

  KvBytes bytes() const override {
    KvBytes b;
    for (const auto& pages : layers_)
      for (const auto& p : pages) b.fp_values += static_cast<int64_t>((p.k.size() + p.v.size()) * sizeof(Store));
    return b;
  }

  std::vector<int64_t> frames(int layer) const override {
    std::vector<int64_t> out;
    for (const auto& p : layers_[static_cast<size_t>(layer)]) out.push_back(p.frame);
    return out;
  }

  void reconstruct(int layer, std::vector<float>* k, std::vector<float>* v) const override {
    const int T = g_.tokens_per_frame, H = g_.heads, Dh = g_.head_dim;
    const auto& pages = layers_[static_cast<size_t>(layer)];
    k->assign(pages.size() * T * H * Dh, 0.0f);
    v->assign(k->size(), 0.0f);
    std::vector<float> row(static_cast<size_t>(Dh));
    for (size_t f = 0; f < pages.size(); ++f)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) {
          const size_t src = (static_cast<size_t>(h) * T + t) * Dh;
          const size_t dst = ((f * T + t) * H + h) * Dh;
          load_row(pages[f].k.data() + src, k->data() + dst, Dh);
          load_row(pages[f].v.data() + src, v->data() + dst, Dh);
        }
  }

 private:
  std::string name_;
  KvGeometry g_;
  FrameWindow window_;
  std::vector<std::deque<Page>> layers_;
};

}  // namespace

std::unique_ptr<KvCache> make_fp32_cache(const KvGeometry& g) { return std::make_unique<FpKvCache<float>>("fp32", g); }
std::unique_ptr<KvCache> make_fp16_cache(const KvGeometry& g) { return std::make_unique<FpKvCache<uint16_t>>("fp16", g); }

}  // namespace wm
