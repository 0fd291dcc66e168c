// The CUDA backend's host bookkeeping, without a GPU: the page pool step by
// step, the per-session page/slot bookkeeping against the cache policy, the
// attention planner's coverage and splits, and the plan run on the CPU with
// the kernel's own index math (kv_layout.h) against naive attention and
// against the CPU fp16 cache, which also measures the error budget the
// GPU parity suite states (backend_ops_test.cc).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "common/half.h"
#include "cuda/attention_plan.h"
#include "cuda/kv_layout.h"
#include "cuda/kv_pages.h"
#include "cuda/kv_span_host.h"
#include "cuda/mma_layout.h"
#include "cuda/page_pool.h"
#include "cuda/span_coder_choice.h"
#include "cuda/staging_ring.h"
#include "paged_attention_case.h"
#include "ptx_model.h"
#include "quant/frame_window.h"
#include "quant/kv_cache.h"

namespace wm::cuda {
namespace {

// ---- page pool --------------------------------------------------------------

TEST(PagePool, StepByStep) {
  PagePool pool(8);
  struct Expect {
    int32_t reserved, used;
  };
  auto state = [&](Expect e) {
    EXPECT_EQ(pool.reserved(), e.reserved);
    EXPECT_EQ(pool.used(), e.used);
    EXPECT_TRUE(pool.check());
  };
  auto a = pool.open(3);
  ASSERT_TRUE(a.ok());
  state({3, 0});
  EXPECT_EQ(*pool.take(*a), 0);
  EXPECT_EQ(*pool.take(*a), 1);
  state({3, 2});
  auto too_big = pool.open(6);  // 5 unreserved
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  state({3, 2});
  auto b = pool.open(5);
  ASSERT_TRUE(b.ok());
  state({8, 2});
  EXPECT_EQ(*pool.take(*b), 2);
  EXPECT_EQ(*pool.take(*a), 3);
  EXPECT_EQ(pool.take(*a).status().code(), absl::StatusCode::kFailedPrecondition);  // reservation used up
  state({8, 4});
  EXPECT_EQ(pool.open(1).status().code(), absl::StatusCode::kResourceExhausted);
  pool.close(*a);
  state({5, 1});
  EXPECT_EQ(*pool.take(*b), 0);  // lowest free page first
  EXPECT_EQ(*pool.take(*b), 1);
  EXPECT_EQ(pool.owner_pages(*b), (std::vector<int32_t>{2, 0, 1}));
  auto c = pool.open(3);
  ASSERT_TRUE(c.ok());
  state({8, 3});
  // a failed append hands its pages back; the reservation stays
  EXPECT_EQ(*pool.take(*c), 3);
  EXPECT_EQ(*pool.take(*c), 4);
  state({8, 5});
  const std::vector<int32_t> unused = {4, 3};
  EXPECT_TRUE(pool.put_back(*c, unused).ok());
  state({8, 3});
  EXPECT_TRUE(pool.owner_pages(*c).empty());
  EXPECT_EQ(pool.owner_reserved(*c), 3);
  const std::vector<int32_t> not_held = {2}, unknown_page = {99};
  EXPECT_EQ(pool.put_back(*c, not_held).code(), absl::StatusCode::kFailedPrecondition);  // b's page
  EXPECT_EQ(pool.put_back(*c, unknown_page).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.put_back(12345, unused).code(), absl::StatusCode::kFailedPrecondition);
  state({8, 3});
  EXPECT_EQ(*pool.take(*c), 3);  // lowest free page first again
  state({8, 4});
  EXPECT_EQ(pool.take(12345).status().code(), absl::StatusCode::kFailedPrecondition);  // unknown owner
  pool.close(*b);
  pool.close(*c);
  pool.close(*c);  // twice is harmless
  state({0, 0});
  EXPECT_EQ(pool.owners(), 0u);
  auto zero = pool.open(0);
  EXPECT_TRUE(zero.ok());
  EXPECT_EQ(pool.open(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagePool, RandomOperationsKeepInvariants) {
  std::mt19937 rng(7);
  PagePool pool(50);
  std::map<PagePool::Owner, int32_t> left;  // reservation not yet taken
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {
      const int64_t want = rng() % 20;
      auto o = pool.open(want);
      EXPECT_EQ(o.ok(), want <= pool.capacity() - (pool.reserved() - (o.ok() ? want : 0)));
      if (o.ok()) left[*o] = static_cast<int32_t>(want);
    } else if (op == 1 && !left.empty()) {
      auto it = std::next(left.begin(), static_cast<long>(rng() % left.size()));
      auto p = pool.take(it->first);
      EXPECT_EQ(p.ok(), it->second > 0);
      if (p.ok()) --it->second;
    } else if (op == 3 && !left.empty()) {
      auto it = std::next(left.begin(), static_cast<long>(rng() % left.size()));
      const std::vector<int32_t> held = pool.owner_pages(it->first);
      if (!held.empty()) {
        const std::vector<int32_t> back = {held[rng() % held.size()]};
        EXPECT_TRUE(pool.put_back(it->first, back).ok());
        ++it->second;
      }
    } else if (op == 2 && !left.empty()) {
      auto it = std::next(left.begin(), static_cast<long>(rng() % left.size()));
      pool.close(it->first);
      left.erase(it);
    }
    ASSERT_TRUE(pool.check()) << "step " << step;
  }
}

// ---- per-session pages and slots -------------------------------------------

PagedGeometry small_geometry(int T = 17, int W = 3, int S = 1, int page_tokens = 64) {
  PagedGeometry g;
  g.layers = 2;
  g.heads = 3;
  g.head_dim = 64;
  g.tokens_per_frame = T;
  g.window_frames = W;
  g.sink_frames = S;
  g.page_tokens = page_tokens;
  return g;
}

// ---- the upload staging ring ----------------------------------------------------

TEST(StagingRing, WaitsOnlyForTheRegionsInTheWay) {
  StagingRing r(100, 8);
  std::vector<uint64_t> waited;
  const auto wait = [&](uint64_t f) { waited.push_back(f); };
  EXPECT_EQ(r.place(40, wait).offset, 0u);   // fence 0: [0, 40)
  EXPECT_EQ(r.place(40, wait).offset, 40u);  // fence 1: [40, 80)
  EXPECT_TRUE(waited.empty());
  // 30 bytes do not fit after 80: wrap to 0, which fence 0 still holds
  const auto p = r.place(30, wait);
  EXPECT_EQ(p.offset, 0u);
  EXPECT_EQ(p.fence, 2u);
  EXPECT_EQ(waited, (std::vector<uint64_t>{0}));
  // [30, 40) is free, but 20 bytes are not: fence 1 first
  EXPECT_EQ(r.place(20, wait).offset, 30u);
  EXPECT_EQ(waited, (std::vector<uint64_t>{0, 1}));
  // the whole ring: everything still busy is waited for, oldest first
  EXPECT_EQ(r.place(100, wait).offset, 0u);
  EXPECT_EQ(waited, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(r.in_flight(), 1u);
}

TEST(StagingRing, BoundsTheRegionsInFlight) {
  StagingRing r(1000, 2);
  std::vector<uint64_t> waited;
  const auto wait = [&](uint64_t f) { waited.push_back(f); };
  r.place(1, wait);
  r.place(1, wait);
  EXPECT_TRUE(waited.empty());
  r.place(1, wait);  // room, but only two events
  EXPECT_EQ(waited, (std::vector<uint64_t>{0}));
  EXPECT_EQ(r.in_flight(), 2u);
}

// random sizes against a model of the device: a placed region never overlaps
// one whose fence has not been waited for, and waits come oldest first
TEST(StagingRing, RandomPlacementsNeverOverlapBusyRegions) {
  std::mt19937 rng(7);
  for (size_t cap : {64u, 1000u, 4096u}) {
    StagingRing r(cap, 5);
    std::map<uint64_t, std::pair<size_t, size_t>> busy;  // fence -> [begin, end)
    uint64_t last_waited = 0;
    bool any_waited = false;
    for (int i = 0; i < 5000; ++i) {
      const size_t n = 1 + rng() % (rng() % 4 == 0 ? cap : cap / 3 + 1);
      const auto p = r.place(n, [&](uint64_t f) {
        ASSERT_TRUE(busy.count(f)) << "waited for a fence twice or never placed";
        if (any_waited) {
          EXPECT_GT(f, last_waited) << "oldest first";
        }
        EXPECT_EQ(busy.begin()->first, f) << "oldest first";
        last_waited = f;
        any_waited = true;
        busy.erase(f);
      });
      ASSERT_LE(p.offset + n, cap);
      for (const auto& [f, span] : busy)
        ASSERT_TRUE(p.offset + n <= span.first || span.second <= p.offset)
            << "region [" << p.offset << ", " << p.offset + n << ") overlaps busy fence " << f;
      busy[p.fence] = {p.offset, p.offset + n};
      ASSERT_LE(busy.size(), 5u);
      ASSERT_EQ(busy.size(), r.in_flight());
      // the device finishes some copies on its own; the ring learns of it only by waiting
    }
  }
}

TEST(KvPages, FollowsTheCachePolicyAcrossEviction) {
  const PagedGeometry g = small_geometry();
  KvPages kv(g);
  const FrameWindow window(g.window_frames, g.sink_frames);
  int32_t next_page = 0;
  for (int64_t f = 0; f < 12;) {
    const int32_t n = f == 4 ? 3 : 1;  // one append of a whole block in between
    for (int32_t l = 0; l < g.layers; ++l) {
      auto plan = kv.plan_append(l, f, n);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<int32_t> pages;
      for (int i = 0; i < g.heads * plan->new_pages_per_head; ++i) pages.push_back(next_page++);
      const uint64_t v0 = kv.version(l);
      kv.commit_append(*plan, pages);
      EXPECT_EQ(kv.version(l), v0 + 1);
    }
    f += n;
    std::vector<int64_t> expect;
    for (int64_t j = 0; j < f; ++j)
      if (window.keeps(j, f)) expect.push_back(j);
    for (int32_t l = 0; l < g.layers; ++l) {
      EXPECT_EQ(kv.frames(l), expect) << "after frame " << f;
      EXPECT_EQ(kv.used_slots(l), static_cast<int32_t>(expect.size()));
      // slots hold distinct frames, each in the slot the rule gives
      const auto by_slot = kv.slot_frames(l);
      for (size_t s = 0; s < by_slot.size(); ++s) EXPECT_EQ(kv.slot_of(by_slot[s]), static_cast<int32_t>(s));
      // pages cover the used tokens, no more
      const int32_t need = (kv.used_tokens(l) + g.page_tokens - 1) / g.page_tokens;
      EXPECT_EQ(kv.pages_per_head(l), need);
    }
  }
  EXPECT_LE(kv.pages_held(), g.reservation_pages());
  EXPECT_EQ(kv.pages_held(), g.reservation_pages());  // the window is full: every page is in use
}

// the host half of a QuantWM-2 cache on the device asks for the query
// statistics only where its books read them: until a layer has seen a
// finite query, and at appends that open a PSAC basis (every
// psac_refresh_frames frames); an append that needs them without them is
// refused before anything is booked
TEST(SpanHostCoder, ReadsTheStatisticsOnlyWhereItsBooksNeedThem) {
  const KvGeometry g{.layers = 2, .heads = 2, .head_dim = 64, .tokens_per_frame = 64, .window_frames = 8, .sink_frames = 1};
  KvFormatOptions o;
  o.psac_refresh_frames = 4;
  const int64_t per = g.head_dim * (g.head_dim + 1) / 2;
  std::vector<double> none(static_cast<size_t>(per), 0.0), some(static_cast<size_t>(per), 0.0);
  for (int c = 0; c < g.head_dim; ++c) some[static_cast<size_t>(c) * (c + 1) / 2 + c] = 1.0 + c;
  const auto set = [&](SpanHostCoder& coder, int32_t layer, const std::vector<double>& lower, int64_t rows) {
    for (int32_t h = 0; h < g.heads; ++h) coder.set_statistics(layer, h, lower.data(), rows);
  };
  SpanHostCoder coder(g, o, true);
  ASSERT_TRUE(coder.observes_queries());
  // frame 0 (a sink), with statistics of no finite query: the layer has still seen none
  EXPECT_TRUE(coder.needs_statistics(0, 0, 1));
  set(coder, 0, none, 0);
  ASSERT_TRUE(coder.append(0, 0, 1).ok());
  EXPECT_TRUE(coder.needs_statistics(0, 1, 1));
  // without them: refused, nothing booked; the same append with them then goes through
  absl::Status st = coder.append(0, 1, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  set(coder, 0, some, 10);
  ASSERT_TRUE(coder.append(0, 1, 1).ok());
  ASSERT_EQ(coder.coded(0).size(), 1u);
  const auto first_basis = coder.coded(0)[0].basis;
  EXPECT_NE(first_basis, nullptr) << "the first seen queries make a basis";
  EXPECT_TRUE(coder.coded(0)[0].qsac);
  // frames 2 and 3 are in its epoch: no statistics, and the span keeps the basis
  for (int64_t f = 2; f < 4; ++f) {
    EXPECT_FALSE(coder.needs_statistics(0, f, 1)) << f;
    st = coder.append(0, f, 1);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(coder.coded(0)[0].basis, first_basis);
  }
  // frame 4 opens the next epoch's basis: it needs them again, set for that append only
  EXPECT_TRUE(coder.needs_statistics(0, 4, 1));
  EXPECT_EQ(coder.append(0, 4, 1).code(), absl::StatusCode::kFailedPrecondition);
  set(coder, 0, some, 20);
  ASSERT_TRUE(coder.append(0, 4, 1).ok());
  EXPECT_NE(coder.coded(0)[0].basis, first_basis);
  EXPECT_FALSE(coder.needs_statistics(0, 5, 1));
  // layer 1 keeps books of its own: nothing seen there yet
  EXPECT_TRUE(coder.needs_statistics(1, 0, 1));
  EXPECT_EQ(coder.append(1, 0, 1).code(), absl::StatusCode::kFailedPrecondition);
  // statistics set for another layer do not count for this one
  set(coder, 0, some, 20);
  EXPECT_EQ(coder.append(1, 0, 1).code(), absl::StatusCode::kFailedPrecondition);

  // QSAC without PSAC: until the layer has seen a query; QVG-2, and QuantWM-2 without either: never
  KvFormatOptions qsac_only = o;
  qsac_only.psac = false;
  SpanHostCoder weights_only(g, qsac_only, true);
  set(weights_only, 0, some, 10);
  ASSERT_TRUE(weights_only.append(0, 0, 1).ok());
  for (int64_t f = 1; f < 12; ++f) {
    EXPECT_FALSE(weights_only.needs_statistics(0, f, 1)) << f;
    ASSERT_TRUE(weights_only.append(0, f, 1).ok());
  }
  KvFormatOptions neither = o;
  neither.psac = false;
  neither.qsac = false;
  for (const auto& [quantwm, options] : {std::pair{false, o}, std::pair{true, neither}}) {
    SpanHostCoder plain(g, options, quantwm);
    EXPECT_FALSE(plain.observes_queries());
    for (int64_t f = 0; f < 6; ++f) {
      EXPECT_FALSE(plain.needs_statistics(0, f, 1));
      ASSERT_TRUE(plain.append(0, f, 1).ok());
      for (const SpanCoding& c : plain.coded(0)) EXPECT_FALSE(c.qsac);
    }
  }
}

TEST(KvPages, RejectsOutOfOrderFramesAndSkipsFramesAnAppendEvicts) {
  const PagedGeometry g = small_geometry(17, 3, 1);
  KvPages kv(g);
  EXPECT_EQ(kv.plan_append(0, 1, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv.plan_append(5, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // 6 frames at once with S = 1, W = 3: frame 0 (sink) and frames 3, 4, 5 are written
  auto plan = kv.plan_append(0, 0, 6);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->src_frame, (std::vector<int32_t>{0, 3, 4, 5}));
  std::set<int32_t> slots(plan->slot.begin(), plan->slot.end());
  EXPECT_EQ(slots.size(), 4u);  // no two writes share a slot
  std::vector<int32_t> pages(static_cast<size_t>(g.heads * plan->new_pages_per_head));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  kv.commit_append(*plan, pages);
  EXPECT_EQ(kv.frames(0), (std::vector<int64_t>{0, 3, 4, 5}));
  EXPECT_EQ(kv.plan_append(0, 5, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(kv.plan_append(0, 6, 1).ok());
}

TEST(KvPages, ValidatesGeometryForTheKernels) {
  PagedGeometry g = small_geometry();
  EXPECT_TRUE(validate_paged_geometry(g).ok());
  g.head_dim = 96;
  EXPECT_EQ(validate_paged_geometry(g).code(), absl::StatusCode::kUnimplemented);
  g = small_geometry(17, 3, 1, 96);
  EXPECT_EQ(validate_paged_geometry(g).code(), absl::StatusCode::kInvalidArgument);
}

// ---- planner ------------------------------------------------------------------

// a session's cache with `frames` frames appended (page ids from a counter)
struct FakeSession {
  KvPages kv;
  FakeSession(const PagedGeometry& g, int frames, int32_t* next_page) : kv(g) {
    for (int32_t l = 0; l < g.layers; ++l) {
      auto plan = kv.plan_append(l, 0, frames);
      std::vector<int32_t> pages;
      for (int i = 0; i < g.heads * plan->new_pages_per_head; ++i) pages.push_back((*next_page)++);
      kv.commit_append(*plan, pages);
    }
  }
};

void expect_plan_covers_everything(const AttentionPlan& p, const std::vector<PlanInput>& in) {
  std::map<std::tuple<int, int>, std::vector<int>> covered;  // (session, q tile) -> tile hits
  std::set<int32_t> partials;
  for (const WorkItem& w : p.items) {
    const PlanSession& s = p.sessions[static_cast<size_t>(w.session)];
    auto& hits = covered[{w.session, w.q_tile}];
    hits.resize(static_cast<size_t>(s.cache_tiles + block_tiles(s.rows)), 0);
    ASSERT_LE(w.tile_end, static_cast<int32_t>(hits.size()));
    ASSERT_LT(w.tile_begin, w.tile_end) << "an empty work item";
    for (int t = w.tile_begin; t < w.tile_end; ++t) ++hits[static_cast<size_t>(t)];
    if (w.partial >= 0) {
      EXPECT_TRUE(partials.insert(w.partial).second) << "partial reused";
    }
  }
  for (size_t s = 0; s < in.size(); ++s) {
    const int q_tiles = (in[s].rows + p.block_q - 1) / p.block_q;
    for (int q = 0; q < q_tiles; ++q) {
      auto it = covered.find({static_cast<int>(s), q});
      ASSERT_NE(it, covered.end()) << "session " << s << " tile " << q << " has no work";
      for (int h : it->second) EXPECT_EQ(h, 1) << "every key tile exactly once";
    }
  }
  int32_t grouped = 0;
  for (const CombineGroup& gr : p.groups) {
    for (int k = 0; k < gr.splits; ++k) EXPECT_TRUE(partials.count(gr.first_partial + k));
    grouped += gr.splits;
  }
  EXPECT_EQ(grouped, static_cast<int32_t>(partials.size()));
  EXPECT_EQ(p.partials, grouped);
}

TEST(AttentionPlan, SplitsSmallQueryBlocksOverLongCaches) {
  // the case: 64 queries over 64k cached tokens, 12 heads x 128, 132 SMs
  PagedGeometry g;
  g.layers = 1;
  g.heads = 12;
  g.head_dim = 128;
  g.tokens_per_frame = 64;
  g.window_frames = 1024;
  g.page_tokens = 128;
  int32_t next = 0;
  FakeSession s(g, 1024, &next);
  std::vector<PlanInput> in = {{&s.kv, 0, 64}};
  auto p = make_attention_plan(in, PlanTuning{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->block_q, 64);
  EXPECT_EQ(p->sessions[0].cache_tiles, 1024);
  const int64_t ctas = static_cast<int64_t>(p->items.size()) * g.heads;
  EXPECT_GE(ctas, 132 * 2 * 0.9) << "about one full wave of CTAs";
  EXPECT_LE(ctas, 132 * 2 * 1.2);
  expect_plan_covers_everything(*p, in);

  // a kernel that fits 4 CTAs per SM (the occupancy the backend measures) gets a wave twice as wide
  PlanTuning wide;
  wide.ctas_per_sm_64 = 4;
  auto p4 = make_attention_plan(in, wide);
  ASSERT_TRUE(p4.ok());
  const int64_t ctas4 = static_cast<int64_t>(p4->items.size()) * g.heads;
  EXPECT_GE(ctas4, 132 * 4 * 0.9);
  EXPECT_LE(ctas4, 132 * 4 * 1.2);
  expect_plan_covers_everything(*p4, in);
}

TEST(AttentionPlan, LargeBlocksUseBigTilesWithoutSplits) {
  // Matrix-Game-2 shape: 2640 queries (3 frames x 880), window 6
  PagedGeometry g;
  g.layers = 2;
  g.heads = 12;
  g.head_dim = 128;
  g.tokens_per_frame = 880;
  g.window_frames = 6;
  g.page_tokens = 128;
  int32_t next = 0;
  FakeSession a(g, 6, &next), b(g, 2, &next);
  std::vector<PlanInput> in = {{&a.kv, 0, 2640}, {&b.kv, 2640, 2640}};
  auto p = make_attention_plan(in, PlanTuning{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->block_q, 128);
  EXPECT_EQ(p->partials, 0);
  EXPECT_EQ(p->items.size(), 2u * 21u);
  EXPECT_EQ(p->sessions[1].cache_tiles, (2 * 880 + 63) / 64);
  EXPECT_EQ(p->rows_total, 5280);
  expect_plan_covers_everything(*p, in);
}

TEST(AttentionPlan, CoversEveryTileUnderEveryTuning) {
  const PagedGeometry g = small_geometry(17, 5, 1, 64);
  int32_t next = 0;
  FakeSession a(g, 0, &next), b(g, 3, &next), c(g, 9, &next);
  std::vector<PlanInput> in = {{&a.kv, 0, 17}, {&b.kv, 17, 34}, {&c.kv, 51, 200}};
  for (int32_t bq : {0, 64, 128})
    for (int32_t split : {-1, 1, 2, 3, 50}) {
      PlanTuning t;
      t.block_q = bq;
      t.split = split;
      auto p = make_attention_plan(in, t);
      ASSERT_TRUE(p.ok());
      SCOPED_TRACE(testing::Message() << "block_q " << bq << " split " << split);
      expect_plan_covers_everything(*p, in);
      if (split == 1) {
        EXPECT_EQ(p->partials, 0);
      }
      // page tables: a session's rows hold its pages, padded with -1
      for (size_t s = 0; s < in.size(); ++s) {
        const PlanSession& ps = p->sessions[s];
        for (int32_t l = 0; l < g.layers; ++l)
          for (int32_t h = 0; h < g.heads; ++h) {
            const auto& pages = in[s].kv->pages(l, h);
            for (int32_t i = 0; i < ps.pages_per_head; ++i) {
              const int32_t got = p->page_tables[static_cast<size_t>(page_row_offset(ps, l, g.heads, h) + i)];
              EXPECT_EQ(got, i < static_cast<int32_t>(pages.size()) ? pages[static_cast<size_t>(i)] : -1);
            }
          }
      }
    }
  std::vector<PlanInput> bad = {{&a.kv, -1, 3}};
  EXPECT_FALSE(make_attention_plan(bad, PlanTuning{}).ok());
}

// ---- the plan run on the CPU ----------------------------------------------------

// runs one batch through: device-style paged pool + plan in scalar code
// (paged_attention_case.h) vs the CPU fp16 cache; returns the max abs
// difference and the max |reference|
std::pair<double, double> paged_vs_cpu(const PagedGeometry& g, const std::vector<CaseSession>& sessions,
                                       const PlanTuning& tuning, bool p_fp16, float q_scale) {
  const PagedAttentionCase c = make_paged_attention_case(g, sessions, tuning, q_scale);
  double worst = 0, ref_max = 0;
  for (int32_t layer = 0; layer < g.layers; ++layer) {
    const std::vector<float> got = host_attention(c, layer, p_fp16);
    const std::vector<float>& ref = c.cpu[static_cast<size_t>(layer)];
    for (size_t i = 0; i < ref.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref[i])));
      ref_max = std::max(ref_max, static_cast<double>(std::fabs(ref[i])));
    }
  }
  return {worst, ref_max};
}

TEST(AttentionPlanOnHost, MatchesTheCpuCacheWithEverySplit) {
  // sessions of different lengths, one empty, one past its window (ring reuse)
  const PagedGeometry g = small_geometry(17, 4, 1, 64);
  const std::vector<CaseSession> sessions = {{0, 17}, {3, 34}, {9, 51}, {2, 5}};
  for (int32_t bq : {64, 128})
    for (int32_t split : {1, 2, 3, -1}) {
      PlanTuning t;
      t.block_q = bq;
      t.split = split;
      t.num_sms = 2;  // small "GPU": auto splits kick in
      t.min_tiles_per_split = 1;
      // exact probabilities: only fp16 storage of q and the block's k, v separates us from the CPU
      const auto [err, ref_max] = paged_vs_cpu(g, sessions, t, /*p_fp16=*/false, 1.0f);
      EXPECT_LT(err, 2e-3) << "block_q " << bq << " split " << split;
      EXPECT_GT(ref_max, 0.1);
    }
}

// the error budget the GPU suite states for attention (backend_ops_test.cc,
// kAttentionTolerance): fp16 q, block k/v and probabilities against the CPU's
// fp32 q and block k/v, at head_dim 64 and 128 and sharp softmaxes (q x 3)
TEST(AttentionPlanOnHost, Fp16ErrorBudget) {
  for (int hd : {64, 128}) {
    PagedGeometry g = small_geometry(33, 6, 1, 8192 / hd);
    g.head_dim = hd;
    for (float q_scale : {1.0f, 3.0f}) {
      PlanTuning t;
      const auto [err, ref_max] = paged_vs_cpu(g, {{5, 66}, {1, 33}}, t, /*p_fp16=*/true, q_scale);
      std::printf("attention fp16 budget: head_dim %d, q x %.0f: max |err| %.2e (max |ref| %.2f)\n", hd, q_scale, err,
                  ref_max);
      EXPECT_LT(err, 1e-2);
    }
  }
}

// ---- the attention kernel's tensor-core lane maps ---------------------------------
//
// One warp's S = Q K^T and O = P V run with the kernel's lane maps
// (mma_layout.h) through the CPU models of ldmatrix and mma.m16n8k16
// (ptx_model.h, from the PTX ISA's fragment tables), against plain matrix
// products.

using ptx_model::Acc;
using ptx_model::Lanes2;
using ptx_model::Lanes4;
using ptx_model::pack;

Lanes4 ldmatrix_x4(const std::vector<uint8_t>& smem, const std::array<uint32_t, 32>& addr, bool trans) {
  return ptx_model::ldmatrix_x4(smem.data(), addr, trans);
}

template <int HD>
void check_warp_tiles() {
  constexpr int kWarp = 2, kRows = 64, BK = kTileKeys;  // warp 2 of a 64-row query tile
  std::mt19937 rng(HD);
  std::uniform_real_distribution<float> u(-1, 1);
  auto fill = [&](int rows) {
    std::vector<float> m(static_cast<size_t>(rows) * HD);
    for (float& x : m) x = f16_to_f32(f32_to_f16(u(rng)));
    return m;
  };
  const auto Q = fill(kRows), K = fill(BK), V = fill(BK);
  // shared memory as the cp.async loads lay it out: Q, then K, then V
  const uint32_t sq = 0, sk = kRows * HD * 2, sv = sk + BK * HD * 2;
  std::vector<uint8_t> smem(sv + BK * HD * 2, 0xff);
  auto store = [&](uint32_t base, const std::vector<float>& m, int rows) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < HD / 8; ++c)
        for (int e = 0; e < 8; ++e) {
          const uint16_t h = f32_to_f16(m[static_cast<size_t>(r) * HD + c * 8 + e]);
          const uint32_t at = base + swz<HD>(r, c) + 2 * e;
          smem[at] = static_cast<uint8_t>(h & 0xff);
          smem[at + 1] = static_cast<uint8_t>(h >> 8);
        }
  };
  store(sq, Q, kRows);
  store(sk, K, BK);
  store(sv, V, BK);
  std::array<uint32_t, 32> addr{};
  auto banks_distinct = [&](const std::array<uint32_t, 32>& a) {
    for (int i = 0; i < 4; ++i) {
      std::set<uint32_t> groups;
      for (int l = 0; l < 8; ++l) groups.insert((a[static_cast<size_t>(8 * i + l)] / 16) % 8);
      if (groups.size() != 8) return false;
    }
    return true;
  };
  // Q fragments
  std::vector<Lanes4> qf(HD / 16);
  for (int kk = 0; kk < HD / 16; ++kk) {
    for (int l = 0; l < 32; ++l) addr[static_cast<size_t>(l)] = sq + swz<HD>(kWarp * 16 + a_row(l), a_chunk(l, kk));
    EXPECT_TRUE(banks_distinct(addr)) << "Q ldmatrix bank conflict, kk " << kk;
    qf[static_cast<size_t>(kk)] = ldmatrix_x4(smem, addr, false);
  }
  // S = Q K^T
  std::vector<Acc> sc(BK / 8, Acc{});
  for (int kk = 0; kk < HD / 16; ++kk)
    for (int jj = 0; jj < BK / 16; ++jj) {
      for (int l = 0; l < 32; ++l) addr[static_cast<size_t>(l)] = sk + swz<HD>(kb_row(l, jj), kb_chunk(l, kk));
      EXPECT_TRUE(banks_distinct(addr)) << "K ldmatrix bank conflict";
      const Lanes4 b = ldmatrix_x4(smem, addr, false);
      Lanes2 b01{}, b23{};
      for (int l = 0; l < 32; ++l) {
        b01[static_cast<size_t>(l)] = {b[static_cast<size_t>(l)][0], b[static_cast<size_t>(l)][1]};
        b23[static_cast<size_t>(l)] = {b[static_cast<size_t>(l)][2], b[static_cast<size_t>(l)][3]};
      }
      ptx_model::mma_16816(sc[static_cast<size_t>(2 * jj)], qf[static_cast<size_t>(kk)], b01);
      ptx_model::mma_16816(sc[static_cast<size_t>(2 * jj + 1)], qf[static_cast<size_t>(kk)], b23);
    }
  std::vector<float> P(static_cast<size_t>(16) * BK);  // this warp's rows, fp16 like the kernel's P
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < BK / 8; ++j)
      for (int e = 0; e < 4; ++e) {
        const int row = c_row(l, e), key = 8 * j + c_col(l, e);
        double ref = 0;
        for (int d = 0; d < HD; ++d)
          ref += static_cast<double>(Q[static_cast<size_t>(kWarp * 16 + row) * HD + d]) * K[static_cast<size_t>(key) * HD + d];
        const float got = sc[static_cast<size_t>(j)][static_cast<size_t>(l)][static_cast<size_t>(e)];
        ASSERT_NEAR(got, ref, 1e-4) << "S row " << row << " key " << key << " (lane " << l << ")";
        P[static_cast<size_t>(row) * BK + key] = f16_to_f32(f32_to_f16(got));
      }
  // O = P V, P repacked from the S accumulators
  std::vector<Acc> o(HD / 8, Acc{});
  for (int kk = 0; kk < BK / 16; ++kk) {
    Lanes4 pa{};
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i) {
        const auto& acc = sc[static_cast<size_t>(p_tile(kk, i))][static_cast<size_t>(l)];
        pa[static_cast<size_t>(l)][static_cast<size_t>(i)] =
            pack(acc[static_cast<size_t>(p_elem(i))], acc[static_cast<size_t>(p_elem(i) + 1)]);
      }
    for (int jj = 0; jj < HD / 16; ++jj) {
      for (int l = 0; l < 32; ++l) addr[static_cast<size_t>(l)] = sv + swz<HD>(vb_row(l, kk), vb_chunk(l, jj));
      EXPECT_TRUE(banks_distinct(addr)) << "V ldmatrix bank conflict";
      const Lanes4 b = ldmatrix_x4(smem, addr, true);
      Lanes2 b01{}, b23{};
      for (int l = 0; l < 32; ++l) {
        b01[static_cast<size_t>(l)] = {b[static_cast<size_t>(l)][0], b[static_cast<size_t>(l)][1]};
        b23[static_cast<size_t>(l)] = {b[static_cast<size_t>(l)][2], b[static_cast<size_t>(l)][3]};
      }
      ptx_model::mma_16816(o[static_cast<size_t>(2 * jj)], pa, b01);
      ptx_model::mma_16816(o[static_cast<size_t>(2 * jj + 1)], pa, b23);
    }
  }
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < HD / 8; ++j)
      for (int e = 0; e < 4; ++e) {
        const int row = c_row(l, e), col = 8 * j + c_col(l, e);
        double ref = 0;
        for (int key = 0; key < BK; ++key)
          ref += static_cast<double>(P[static_cast<size_t>(row) * BK + key]) * V[static_cast<size_t>(key) * HD + col];
        ASSERT_NEAR(o[static_cast<size_t>(j)][static_cast<size_t>(l)][static_cast<size_t>(e)], ref, 1e-3)
            << "O row " << row << " channel " << col << " (lane " << l << ")";
      }
}

TEST(TensorCoreLaneMaps, OneWarpComputesQKAndPVHeadDim32) { check_warp_tiles<32>(); }
TEST(TensorCoreLaneMaps, OneWarpComputesQKAndPVHeadDim64) { check_warp_tiles<64>(); }
TEST(TensorCoreLaneMaps, OneWarpComputesQKAndPVHeadDim128) { check_warp_tiles<128>(); }

TEST(TensorCoreLaneMaps, SwizzleIsAPermutationOfEachRow) {
  for (int r = 0; r < 64; ++r) {
    std::set<uint32_t> seen32, seen64, seen128;
    for (int c = 0; c < 4; ++c) seen32.insert(swz<32>(r, c));
    for (int c = 0; c < 8; ++c) seen64.insert(swz<64>(r, c));
    for (int c = 0; c < 16; ++c) seen128.insert(swz<128>(r, c));
    EXPECT_EQ(seen32.size(), 4u);
    EXPECT_EQ(seen64.size(), 8u);
    EXPECT_EQ(seen128.size(), 16u);
    EXPECT_EQ(*seen128.begin(), static_cast<uint32_t>(r * 256));
    EXPECT_EQ(*seen128.rbegin(), static_cast<uint32_t>(r * 256 + 240));
  }
}

// ---- the wgmma kernel's shared-memory operands (attention_sm90.cu) ----

// Where wgmma reads element (k, n) of its B operand: ptx_model.h, from the
// PTX ISA's canonical layouts with the 128-byte swizzle.
uint32_t wgmma_b_address(uint64_t desc, bool mn_major, int k, int n) {
  const ptx_model::Descriptor d(desc);
  EXPECT_EQ(d.swizzle, 1u) << "128-byte swizzle";
  EXPECT_EQ(d.base_offset, 0u) << "base offset";
  return ptx_model::wgmma_b_address(desc, mn_major, k, n);
}

// BK keys of K and of V in panels of BK rows, written as the loads write
// them: one tile of kTileKeys rows at a time, tile h at rows 64 h of the
// panel tile (load_rows_async<HD, kTileKeys, NT, true, LEAN, BK> at
// dst + h * 64 * 128: the warp-specialised kernel's 128-key steps)
template <int HD, int BK = kTileKeys>
void check_wgmma_operands() {
  constexpr uint32_t kTile = BK * HD * 2;
  // two panel tiles on 1024-byte boundaries, not at address 0, in poisoned memory
  const uint32_t sk = 3 * 1024, sv = sk + kTile;
  std::vector<uint16_t> smem((sv + kTile + 2048) / 2, 0xDEAD);
  auto value = [](int which, int row, int ch) { return static_cast<uint16_t>((which << 15) | (row << 8) | ch); };
  for (int which = 0; which < 2; ++which)
    for (int h = 0; h < BK / kTileKeys; ++h) {
      const uint32_t dst = (which == 0 ? sk : sv) + static_cast<uint32_t>(h * kTileKeys * 128);
      for (int r = 0; r < kTileKeys; ++r)
        for (int c = 0; c < HD / 8; ++c)
          for (int e = 0; e < 8; ++e)
            smem[(dst + panel_swz<HD, BK>(r, c)) / 2 + static_cast<size_t>(e)] = value(which, h * kTileKeys + r, c * 8 + e);
    }
  // S = Q K^T, k-step kk: B[k][n] = K[key n][channel 16 kk + k], N = BK (one m64n{BK}k16)
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint64_t d = key_desc<HD, BK>(sk, kk);
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < BK; ++n)
        ASSERT_EQ(smem[wgmma_b_address(d, false, k, n) / 2], value(0, n, 16 * kk + k))
            << "K operand, k-step " << kk << " k " << k << " key " << n;
  }
  // O += P V, k-step kk: B[k][n] = V[key 16 kk + k][channel n], N = HD
  for (int kk = 0; kk < BK / 16; ++kk) {
    const uint64_t d = value_desc<HD, BK>(sv, kk);
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < HD; ++n)
        ASSERT_EQ(smem[wgmma_b_address(d, true, k, n) / 2], value(1, 16 * kk + k, n))
            << "V operand, k-step " << kk << " key " << k << " channel " << n;
  }
}

TEST(WgmmaOperands, DescriptorsReadTheTilesTheLoadsWroteHeadDim64) { check_wgmma_operands<64>(); }
TEST(WgmmaOperands, DescriptorsReadTheTilesTheLoadsWroteHeadDim128) { check_wgmma_operands<128>(); }
TEST(WgmmaOperands, DescriptorsReadTwoTilesAsOne128KeyPanelHeadDim64) { check_wgmma_operands<64, 128>(); }
TEST(WgmmaOperands, DescriptorsReadTwoTilesAsOne128KeyPanelHeadDim128) { check_wgmma_operands<128, 128>(); }

TEST(WgmmaOperands, PanelLayoutIsAPermutationOfTheTile) {
  for (int hd : {64, 128}) {
    std::set<uint32_t> seen;
    for (int r = 0; r < kTileKeys; ++r)
      for (int c = 0; c < hd / 8; ++c) {
        const uint32_t at = hd == 64 ? panel_swz<64, kTileKeys>(r, c) : panel_swz<128, kTileKeys>(r, c);
        EXPECT_EQ(at % 16, 0u);
        EXPECT_LT(at, static_cast<uint32_t>(kTileKeys * hd * 2));
        seen.insert(at);
      }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kTileKeys * hd / 8)) << "head_dim " << hd;
  }
  // head_dim 64: one panel, the same bytes as the mma.sync kernel's layout
  for (int r = 0; r < kTileKeys; ++r)
    for (int c = 0; c < 8; ++c) EXPECT_EQ((panel_swz<64, kTileKeys>(r, c)), swz<64>(r, c));
}

TEST(WgmmaOperands, DescriptorFields) {
  const uint64_t d = wgmma_desc(0x12340, 8192, 1024);
  EXPECT_EQ(d & 0x3FFF, 0x1234u);
  EXPECT_EQ((d >> 16) & 0x3FFF, 512u);
  EXPECT_EQ((d >> 32) & 0x3FFF, 64u);
  EXPECT_EQ(d >> 62, 1u);
  EXPECT_EQ(d & ((3ull << 14) | (3ull << 30) | (0xFFFFull << 46)), 0u) << "reserved bits and base offset stay 0";
}

// ---- where the span coder runs ("auto": docs/CUDA.md, "Span pages") ----------

// the device while its checked appends match the host's; one difference a
// rung down (the host's k-means), checked again; another, the host, which
// is never checked; a clean run of checks trusts the rung for good
TEST(SpanCoderChoice, FallsOneRungPerDifferenceAndTrustsAfterItsChecks) {
  SpanCoderChoice c(2);
  EXPECT_EQ(c.coder(), SpanCoderChoice::kDevice);
  EXPECT_TRUE(c.checking());
  c.record(true);
  EXPECT_TRUE(c.checking());
  c.record(false);  // the second check differs: the host's k-means, two checks again
  EXPECT_EQ(c.coder(), SpanCoderChoice::kHostKmeans);
  EXPECT_TRUE(c.checking());
  c.record(true);
  c.record(true);
  EXPECT_FALSE(c.checking()) << "two clean checks: trusted";
  c.record(false);  // an unchecked append's outcome is not one
  EXPECT_EQ(c.coder(), SpanCoderChoice::kHostKmeans);
  EXPECT_EQ(c.passed(), 3);
  EXPECT_EQ(c.mismatches(), 1);

  c.restart(1);
  c.record(false);
  c.record(false);
  EXPECT_EQ(c.coder(), SpanCoderChoice::kHost);
  EXPECT_FALSE(c.checking()) << "the host's codes are the CPU's: nothing to check";
  c.record(false);
  EXPECT_EQ(c.coder(), SpanCoderChoice::kHost) << "no rung below the host";
  EXPECT_EQ(c.mismatches(), 3);
}

TEST(SpanCoderChoice, NoChecksOrAPinnedCoderIsTrusted) {
  SpanCoderChoice none(0);
  EXPECT_EQ(none.coder(), SpanCoderChoice::kDevice);
  EXPECT_FALSE(none.checking());
  SpanCoderChoice pinned(8);
  pinned.pin(SpanCoderChoice::kHostKmeans);
  EXPECT_TRUE(pinned.pinned());
  EXPECT_FALSE(pinned.checking());
  pinned.record(false);
  EXPECT_EQ(pinned.coder(), SpanCoderChoice::kHostKmeans);
  pinned.restart(-3);  // negative: no checks
  EXPECT_FALSE(pinned.pinned());
  EXPECT_FALSE(pinned.checking());
  EXPECT_EQ(pinned.coder(), SpanCoderChoice::kDevice);
}

}  // namespace
}  // namespace wm::cuda
