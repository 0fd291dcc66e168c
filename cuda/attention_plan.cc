#include "cuda/attention_plan.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wm::cuda {
namespace {

size_t align16(size_t x) { return (x + 15) / 16 * 16; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

AttentionPlan::Layout AttentionPlan::layout() const {
  Layout l;
  size_t at = 0;
  l.sessions = at;
  at = align16(at + sessions.size() * sizeof(PlanSession));
  l.cached = at;
  at = align16(at + cached.size() * sizeof(int32_t));
  l.items = at;
  at = align16(at + items.size() * sizeof(WorkItem));
  l.groups = at;
  at = align16(at + groups.size() * sizeof(CombineGroup));
  l.page_tables = at;
  at = align16(at + page_tables.size() * sizeof(int32_t));
  l.bytes = std::max<size_t>(at, 16);
  return l;
}

std::vector<uint8_t> AttentionPlan::blob() const {
  const Layout l = layout();
  std::vector<uint8_t> b(l.bytes, 0);
  auto put = [&](size_t at, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(b.data() + at, src, bytes);
  };
  put(l.sessions, sessions.data(), sessions.size() * sizeof(PlanSession));
  put(l.cached, cached.data(), cached.size() * sizeof(int32_t));
  put(l.items, items.data(), items.size() * sizeof(WorkItem));
  put(l.groups, groups.data(), groups.size() * sizeof(CombineGroup));
  put(l.page_tables, page_tables.data(), page_tables.size() * sizeof(int32_t));
  return b;
}

absl::StatusOr<AttentionPlan> make_attention_plan(const std::vector<PlanInput>& in, const PlanTuning& t) {
  AttentionPlan p;
  if (in.empty()) return p;
  const PagedGeometry& g0 = in[0].kv->geometry();
  p.layers = g0.layers;
  p.heads = g0.heads;
  p.head_dim = g0.head_dim;
  p.page_tokens = g0.page_tokens;
  const int32_t S = static_cast<int32_t>(in.size());
  int64_t rows_total = 0;
  for (const PlanInput& s : in) {
    if (s.kv == nullptr) return absl::InvalidArgumentError("attention plan: a session has no cache");
    const PagedGeometry& g = s.kv->geometry();
    if (g.layers != p.layers || g.heads != p.heads || g.head_dim != p.head_dim || g.page_tokens != p.page_tokens)
      return absl::InvalidArgumentError("attention plan: the sessions' caches differ in geometry");
    if (s.row0 < 0 || s.rows < 0) return absl::InvalidArgumentError("attention plan: negative rows");
    rows_total = std::max<int64_t>(rows_total, static_cast<int64_t>(s.row0) + s.rows);
  }
  if (rows_total > (int64_t{1} << 30)) return absl::InvalidArgumentError("attention plan: too many rows");
  p.rows_total = static_cast<int32_t>(rows_total);

  // block size: 128-query tiles halve the K/V traffic, 64 fill more SMs
  if (t.block_q == 64 || t.block_q == 128) {
    p.block_q = t.block_q;
  } else {
    int64_t tiles128 = 0;
    for (const PlanInput& s : in) tiles128 += ceil_div(s.rows, 128) * p.heads;
    p.block_q = tiles128 >= t.num_sms ? 128 : 64;
  }

  // sessions, cached tokens per layer, page-table snapshots
  p.cached.assign(static_cast<size_t>(p.layers) * S, 0);
  std::vector<int64_t> tiles(static_cast<size_t>(S)), q_tiles(static_cast<size_t>(S));
  for (int32_t s = 0; s < S; ++s) {
    const KvPages& kv = *in[static_cast<size_t>(s)].kv;
    PlanSession ps;
    ps.row0 = in[static_cast<size_t>(s)].row0;
    ps.rows = in[static_cast<size_t>(s)].rows;
    int32_t most = 0, pph = 0;
    for (int32_t l = 0; l < p.layers; ++l) {
      const int32_t c = kv.used_tokens(l);
      p.cached[static_cast<size_t>(l) * S + s] = c;
      most = std::max(most, c);
      pph = std::max(pph, kv.pages_per_head(l));
    }
    ps.cache_tiles = static_cast<int32_t>(ceil_div(most, kTileKeys));
    ps.pages_per_head = pph;
    ps.pt_offset = static_cast<int64_t>(p.page_tables.size());
    for (int32_t l = 0; l < p.layers; ++l)
      for (int32_t h = 0; h < p.heads; ++h) {
        const auto& pages = kv.pages(l, h);
        p.page_tables.insert(p.page_tables.end(), pages.begin(), pages.end());
        p.page_tables.insert(p.page_tables.end(), static_cast<size_t>(pph) - pages.size(), -1);
      }
    p.sessions.push_back(ps);
    tiles[static_cast<size_t>(s)] = ps.cache_tiles + block_tiles(ps.rows);
    q_tiles[static_cast<size_t>(s)] = ceil_div(ps.rows, p.block_q);
  }

  // splits per session
  int64_t base_items = 0, work = 0;
  for (int32_t s = 0; s < S; ++s) {
    base_items += q_tiles[static_cast<size_t>(s)] * p.heads;
    work += q_tiles[static_cast<size_t>(s)] * p.heads * tiles[static_cast<size_t>(s)];
  }
  const int64_t wave = static_cast<int64_t>(std::max(1, t.num_sms)) *
                       std::max(1, p.block_q == 128 ? t.ctas_per_sm_128 : t.ctas_per_sm_64);
  std::vector<int64_t> splits(static_cast<size_t>(S), 1);
  for (int32_t s = 0; s < S; ++s) {
    const int64_t n = std::max<int64_t>(1, tiles[static_cast<size_t>(s)]);
    int64_t k = 1;
    if (t.split >= 2) {
      k = std::min<int64_t>(t.split, n);
    } else if (t.split < 0 && base_items < wave && work > 0) {
      const int64_t chunk = std::max<int64_t>(std::max(1, t.min_tiles_per_split), ceil_div(work, wave));
      k = std::min<int64_t>(n, ceil_div(n, chunk));
    }
    splits[static_cast<size_t>(s)] = std::max<int64_t>(1, k);
  }

  // work items: session, then KV range, then query tile, so that CTAs that
  // run together read the same keys (they meet in L2)
  for (int32_t s = 0; s < S; ++s) {
    const int64_t n = tiles[static_cast<size_t>(s)], k = splits[static_cast<size_t>(s)];
    const int64_t qt = q_tiles[static_cast<size_t>(s)];
    if (qt == 0) continue;
    const int32_t base = p.partials;
    for (int64_t r = 0; r < k; ++r)
      for (int64_t q = 0; q < qt; ++q) {
        WorkItem w;
        w.session = s;
        w.q_tile = static_cast<int32_t>(q);
        w.tile_begin = static_cast<int32_t>(n * r / k);
        w.tile_end = static_cast<int32_t>(n * (r + 1) / k);
        w.partial = k > 1 ? static_cast<int32_t>(base + q * k + r) : -1;
        p.items.push_back(w);
      }
    if (k > 1) {
      for (int64_t q = 0; q < qt; ++q)
        p.groups.push_back({s, static_cast<int32_t>(q), static_cast<int32_t>(base + q * k), static_cast<int32_t>(k)});
      p.partials += static_cast<int32_t>(qt * k);
    }
  }
  return p;
}

}  // namespace wm::cuda
