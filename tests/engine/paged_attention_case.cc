#include "paged_attention_case.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "common/half.h"
#include "cuda/page_pool.h"
#include "quant/kv_cache.h"

namespace wm::cuda {
namespace {

// what kv_append.cu does, on a host pool
void host_append(const KvPages& kv, const KvAppendPlan& plan, const std::vector<int32_t>& table /*[H][pph]*/,
                 int32_t pph, const float* k, const float* v, std::vector<uint16_t>* pool, int64_t page_elems) {
  const PagedGeometry& g = kv.geometry();
  for (size_t w = 0; w < plan.slot.size(); ++w)
    for (int32_t t = 0; t < g.tokens_per_frame; ++t)
      for (int32_t h = 0; h < g.heads; ++h) {
        const int64_t src = ((static_cast<int64_t>(plan.src_frame[w]) * g.tokens_per_frame + t) * g.heads + h) *
                            g.head_dim;
        const int64_t logical = static_cast<int64_t>(plan.slot[w]) * g.tokens_per_frame + t;
        const int32_t page = table[static_cast<size_t>(h * pph + logical / g.page_tokens)];
        const int64_t dk = page * page_elems + (logical % g.page_tokens) * g.head_dim;
        const int64_t dv = dk + static_cast<int64_t>(g.page_tokens) * g.head_dim;
        for (int32_t d = 0; d < g.head_dim; ++d) {
          (*pool)[static_cast<size_t>(dk + d)] = f32_to_f16(k[src + d]);
          (*pool)[static_cast<size_t>(dv + d)] = f32_to_f16(v[src + d]);
        }
      }
}

}  // namespace

std::vector<float> host_attention(const PagedAttentionCase& c, int32_t layer, bool p_fp16) {
  const AttentionPlan& p = c.plan;
  const std::vector<uint16_t>&pool = c.pool, &q16 = c.q16, &k16 = c.k16, &v16 = c.v16;
  const int64_t page_elems = c.page_elems;
  const int32_t H = p.heads, Dh = p.head_dim, R = p.rows_total, S = static_cast<int32_t>(p.sessions.size());
  const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(Dh)));
  std::vector<float> out(static_cast<size_t>(R) * H * Dh, 0.0f);
  std::vector<float> po(static_cast<size_t>(p.partials) * H * p.block_q * Dh, 0.0f);
  std::vector<float> pml(static_cast<size_t>(p.partials) * H * p.block_q * 2, 0.0f);
  auto f16 = [](uint16_t x) { return f16_to_f32(x); };
  for (const WorkItem& w : p.items)
    for (int32_t h = 0; h < H; ++h) {
      const PlanSession& s = p.sessions[static_cast<size_t>(w.session)];
      const int32_t cached = p.cached[static_cast<size_t>(layer) * S + w.session];
      const int64_t pt = page_row_offset(s, layer, H, h);
      for (int32_t row = 0; row < p.block_q; ++row) {
        const int32_t qr = w.q_tile * p.block_q + row;
        if (qr >= s.rows) break;
        const uint16_t* q = q16.data() + (static_cast<int64_t>(h) * R + s.row0 + qr) * Dh;
        float m = -INFINITY, l = 0;
        std::vector<float> acc(static_cast<size_t>(Dh), 0.0f);
        for (int32_t tile = w.tile_begin; tile < w.tile_end; ++tile) {
          const TileRef t = tile_ref(s, cached, tile);
          std::vector<float> logits(static_cast<size_t>(t.valid));
          std::vector<const uint16_t*> vrows(static_cast<size_t>(t.valid));
          float mx = -INFINITY;
          for (int32_t j = 0; j < t.valid; ++j) {
            const uint16_t *kr, *vr;
            if (t.from_cache) {
              const int32_t page = p.page_tables[static_cast<size_t>(pt + (t.first + j) / p.page_tokens)];
              const int64_t off = page * page_elems + static_cast<int64_t>((t.first + j) % p.page_tokens) * Dh;
              kr = pool.data() + off;
              vr = kr + static_cast<int64_t>(p.page_tokens) * Dh;
            } else {
              const int64_t off = (static_cast<int64_t>(h) * R + s.row0 + t.first + j) * Dh;
              kr = k16.data() + off;
              vr = v16.data() + off;
            }
            float dot = 0;
            for (int32_t d = 0; d < Dh; ++d) dot += f16(q[d]) * f16(kr[d]);
            logits[static_cast<size_t>(j)] = dot;
            vrows[static_cast<size_t>(j)] = vr;
            mx = std::max(mx, dot);
          }
          const float m_new = std::max(m, mx * scale_log2);
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;
          const float corr = std::exp2(m - m_use);
          l *= corr;
          for (float& a : acc) a *= corr;
          for (int32_t j = 0; j < t.valid; ++j) {
            const float pr = std::exp2(logits[static_cast<size_t>(j)] * scale_log2 - m_use);
            l += pr;
            const float pv = p_fp16 ? f16_to_f32(f32_to_f16(pr)) : pr;
            for (int32_t d = 0; d < Dh; ++d) acc[static_cast<size_t>(d)] += pv * f16(vrows[static_cast<size_t>(j)][d]);
          }
          m = m_new;
        }
        if (w.partial < 0) {
          for (int32_t d = 0; d < Dh; ++d)
            out[(static_cast<size_t>(s.row0 + qr) * H + h) * Dh + d] = l > 0 ? acc[static_cast<size_t>(d)] / l : 0;
        } else {
          const size_t prow = (static_cast<size_t>(w.partial) * H + h) * p.block_q + row;
          for (int32_t d = 0; d < Dh; ++d) po[prow * Dh + d] = acc[static_cast<size_t>(d)];
          pml[2 * prow] = m;
          pml[2 * prow + 1] = l;
        }
      }
    }
  for (const CombineGroup& gr : p.groups)
    for (int32_t h = 0; h < H; ++h) {
      const PlanSession& s = p.sessions[static_cast<size_t>(gr.session)];
      for (int32_t row = 0; row < p.block_q; ++row) {
        const int32_t qr = gr.q_tile * p.block_q + row;
        if (qr >= s.rows) break;
        float mstar = -INFINITY;
        for (int k = 0; k < gr.splits; ++k)
          mstar = std::max(mstar, pml[2 * ((static_cast<size_t>(gr.first_partial + k) * H + h) * p.block_q + row)]);
        float den = 0;
        std::vector<float> num(static_cast<size_t>(Dh), 0.0f);
        for (int k = 0; k < gr.splits; ++k) {
          const size_t prow = (static_cast<size_t>(gr.first_partial + k) * H + h) * p.block_q + row;
          const float wk = pml[2 * prow] == -INFINITY ? 0.0f : std::exp2(pml[2 * prow] - mstar);
          den += wk * pml[2 * prow + 1];
          for (int32_t d = 0; d < Dh; ++d) num[static_cast<size_t>(d)] += wk * po[prow * Dh + d];
        }
        for (int32_t d = 0; d < Dh; ++d)
          out[(static_cast<size_t>(s.row0 + qr) * H + h) * Dh + d] = den > 0 ? num[static_cast<size_t>(d)] / den : 0;
      }
    }
  return out;
}

PagedAttentionCase make_paged_attention_case(const PagedGeometry& g, const std::vector<CaseSession>& sessions,
                                             const PlanTuning& tuning, float q_scale, uint32_t seed) {
  PagedAttentionCase out;
  out.geometry = g;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int32_t H = g.heads, Dh = g.head_dim, T = g.tokens_per_frame, L = g.layers;
  const int64_t page_elems = static_cast<int64_t>(2) * g.page_tokens * Dh;
  const int32_t capacity = static_cast<int32_t>(sessions.size() * g.reservation_pages());
  PagePool pool_book(capacity);
  // nan bits everywhere: a read of anything not written shows up
  std::vector<uint16_t> pool(static_cast<size_t>(capacity * page_elems), 0x7e00);
  KvGeometry cg;
  cg.layers = L;
  cg.heads = H;
  cg.head_dim = Dh;
  cg.tokens_per_frame = T;
  cg.window_frames = g.window_frames;
  cg.sink_frames = g.sink_frames;
  std::vector<std::unique_ptr<KvPages>> kvs;
  std::vector<std::unique_ptr<KvCache>> cpu;
  for (const CaseSession& s : sessions) {
    kvs.push_back(std::make_unique<KvPages>(g));
    auto owner = pool_book.open(g.reservation_pages());
    EXPECT_TRUE(owner.ok());
    auto c = make_kv_cache("fp16", cg);
    EXPECT_TRUE(c.ok());
    cpu.push_back(std::move(*c));
    for (int f = 0; f < s.frames_before; ++f) {
      std::vector<float> k(static_cast<size_t>(T) * H * Dh), v(k.size());
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      for (int32_t l = 0; l < L; ++l) {
        KvPages& kv = *kvs.back();
        auto plan = kv.plan_append(l, f, 1);
        EXPECT_TRUE(plan.ok());
        std::vector<int32_t> fresh;
        for (int i = 0; i < H * plan->new_pages_per_head; ++i) fresh.push_back(*pool_book.take(*owner));
        const int32_t pph = kv.pages_per_head(l) + plan->new_pages_per_head;
        std::vector<int32_t> table(static_cast<size_t>(H * pph));
        for (int32_t h = 0; h < H; ++h) {
          const auto& old = kv.pages(l, h);
          for (size_t i = 0; i < old.size(); ++i) table[static_cast<size_t>(h * pph) + i] = old[i];
          for (int32_t i = 0; i < plan->new_pages_per_head; ++i)
            table[static_cast<size_t>(h * pph) + old.size() + i] = fresh[static_cast<size_t>(h * plan->new_pages_per_head + i)];
        }
        host_append(kv, *plan, table, pph, k.data(), v.data(), &pool, page_elems);
        kv.commit_append(*plan, fresh);
        EXPECT_TRUE(cpu.back()->append(l, k.data(), v.data(), f, 1).ok());
      }
    }
  }
  int32_t rows_total = 0;
  std::vector<PlanInput> in;
  for (size_t s = 0; s < sessions.size(); ++s) {
    in.push_back({kvs[s].get(), rows_total, sessions[s].rows});
    rows_total += sessions[s].rows;
  }
  std::vector<float> q(static_cast<size_t>(rows_total) * H * Dh), k(q.size()), v(q.size());
  for (float& x : q) x = q_scale * nd(rng);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  // the kernel's inputs: fp16 [H][rows][Dh]
  std::vector<uint16_t> q16(q.size()), k16(q.size()), v16(q.size());
  for (int32_t r = 0; r < rows_total; ++r)
    for (int32_t h = 0; h < H; ++h)
      for (int32_t d = 0; d < Dh; ++d) {
        const size_t src = (static_cast<size_t>(r) * H + h) * Dh + d, dst = (static_cast<size_t>(h) * rows_total + r) * Dh + d;
        q16[dst] = f32_to_f16(q[src]);
        k16[dst] = f32_to_f16(k[src]);
        v16[dst] = f32_to_f16(v[src]);
      }
  auto plan = make_attention_plan(in, tuning);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) out.plan = *std::move(plan);
  for (int32_t layer = 0; layer < L; ++layer) {
    std::vector<float> ref(q.size());
    for (size_t s = 0; s < sessions.size(); ++s) {
      const size_t off = static_cast<size_t>(in[s].row0) * H * Dh;
      cpu[s]->attend(layer, q.data() + off, k.data() + off, v.data() + off, in[s].rows, ref.data() + off);
    }
    out.cpu.push_back(std::move(ref));
  }
  out.page_elems = page_elems;
  out.pool = std::move(pool);
  out.q16 = std::move(q16);
  out.k16 = std::move(k16);
  out.v16 = std::move(v16);
  return out;
}

}  // namespace wm::cuda
