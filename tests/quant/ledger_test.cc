// The bookkeeping, step by step against tables of expected states (STYLE 7).
#include "quant/kv_ledger.h"

#include <gtest/gtest.h>

#include <vector>

#include "quant/kv_cache.h"

namespace wm {
namespace {

SpanPlan plan(int window, int sinks, int span, bool quantize_sinks = false, bool psac = false, int refresh = 4) {
  SpanPlan p;
  p.heads = 2;
  p.head_dim = 64;
  p.tokens_per_frame = 64;
  p.window_frames = window;
  p.sink_frames = sinks;
  p.span_frames = span;
  p.block = 64;
  p.max_centroids = 256;
  p.tokens_per_centroid = 64;
  p.quantize_sinks = quantize_sinks;
  p.psac = psac;
  p.coeff_bits = 8;
  p.psac_refresh_frames = refresh;
  return p;
}

struct SpanState {
  std::vector<int64_t> pending;
  std::vector<std::vector<int64_t>> spans;  // {first_frame, frames, evicted, basis}
};

void expect_state(const SpanLedger& l, const SpanState& s, int step) {
  EXPECT_EQ(std::vector<int64_t>(l.pending().begin(), l.pending().end()), s.pending) << "after frame " << step;
  std::vector<std::vector<int64_t>> got;
  for (const auto& sp : l.spans()) got.push_back({sp.first_frame, sp.frames, sp.evicted, sp.basis});
  EXPECT_EQ(got, s.spans) << "after frame " << step;
}

TEST(SpanLedger, SpansOfTwoWindowFourSinkOneStepByStep) {
  SpanLedger l(plan(/*window=*/4, /*sinks=*/1, /*span=*/2, false, /*psac=*/true, /*refresh=*/4));
  const std::vector<SpanState> want = {
      {{0}, {}},                                          // frame 0: the sink stays fp16
      {{0, 1}, {}},                                       // 1: span [1,2] open
      {{0}, {{1, 2, 0, 0}}},                              // 2: span complete, first basis
      {{0, 3}, {{1, 2, 0, 0}}},
      {{0}, {{1, 2, 0, 0}, {3, 2, 0, 0}}},                // 4: basis 0 reused (3 < 1 + 4)
      {{0, 5}, {{1, 2, 1, 0}, {3, 2, 0, 0}}},             // 5: window 2..5 -> frame 1 evicted, its span split
      {{0}, {{3, 2, 0, 0}, {5, 2, 0, 1}}},                // 6: span [1,2] gone; new basis for span 5
      {{0, 7}, {{3, 2, 1, 0}, {5, 2, 0, 1}}},
      {{0}, {{5, 2, 0, 1}, {7, 2, 0, 1}}},                // 8: basis 0 has no span left
  };
  for (int f = 0; f < static_cast<int>(want.size()); ++f) {
    l.add_frame(f);
    l.end_append(/*queries_seen=*/true);
    expect_state(l, want[static_cast<size_t>(f)], f);
  }
  EXPECT_EQ(l.live_bases(), 1);
}

TEST(SpanLedger, NoBasisBeforeQueriesAndQuantizedSinks) {
  SpanLedger l(plan(3, 2, 1, /*quantize_sinks=*/true, /*psac=*/true, 8));
  l.add_frame(0);
  EXPECT_EQ(l.end_append(false).new_spans, 0);
  l.add_frame(1);
  auto r = l.end_append(false);  // sinks complete: one span of two frames, no basis yet
  EXPECT_EQ(r.new_spans, 1);
  EXPECT_FALSE(r.new_basis);
  l.add_frame(2);
  r = l.end_append(true);
  EXPECT_TRUE(r.new_basis);
  std::vector<std::vector<int64_t>> got;
  for (const auto& sp : l.spans()) got.push_back({sp.first_frame, sp.frames, sp.evicted, sp.basis, sp.sink});
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{0, 2, 0, -1, 1}, {2, 1, 0, 0, 0}}));
  for (int f = 3; f < 10; ++f) {
    l.add_frame(f);
    l.end_append(true);
  }
  // the sink span is never evicted; the window holds 7, 8, 9
  ASSERT_EQ(l.spans().size(), 4u);
  EXPECT_EQ(l.spans()[0].first_frame, 0);
  EXPECT_EQ(l.spans()[1].first_frame, 7);
}

TEST(SpanLedger, BytesByHand) {
  // window 2, no sinks, span 1, keys and values quantized, psac 8-bit:
  // per span per head per side: codes 64*64/4 = 1024, scales 64, ids 64,
  // centroids 1*64*2 = 128; keys add 64 * 10 coefficient bytes; each basis
  // 2 heads * 8 * 64 * 2 = 2048 bytes
  SpanLedger l(plan(2, 0, 1, false, true, 100));
  for (int f = 0; f < 5; ++f) {
    l.add_frame(f);
    l.end_append(true);
  }
  const KvBytes b = l.bytes();
  EXPECT_EQ(b.fp_values, 0);
  EXPECT_EQ(b.codes, 2 * 2 * 2 * 1024);
  EXPECT_EQ(b.scales, 2 * 2 * 2 * 64);
  EXPECT_EQ(b.ids, 2 * 2 * 2 * 64);
  EXPECT_EQ(b.centroids, 2 * 2 * 2 * 128);
  EXPECT_EQ(b.coeffs, 2 * 2 * 640);
  EXPECT_EQ(b.bases, 2048);
  EXPECT_EQ(b.zeros, 0);
}

TEST(SpanLedger, BlocksOfThreeWithAShortPromptTail) {
  // span = one block of 3; a prompt of 4 frames arrives as calls of 3 and 1:
  // the lone frame waits for the next block and joins its span
  SpanLedger l(plan(/*window=*/6, 0, /*span=*/3));
  auto call = [&](int n) {
    for (int i = 0; i < n; ++i) l.add_frame(l.frames_appended());
    return l.end_append(true).new_spans;
  };
  EXPECT_EQ(call(3), 1);
  EXPECT_EQ(call(1), 0);
  EXPECT_EQ(std::vector<int64_t>(l.pending().begin(), l.pending().end()), (std::vector<int64_t>{3}));
  EXPECT_EQ(call(3), 1);  // frames 3..6 in one span
  EXPECT_EQ(l.spans().back().first_frame, 3);
  EXPECT_EQ(l.spans().back().frames, 4);
  EXPECT_TRUE(l.pending().empty());
  EXPECT_EQ(call(3), 1);  // aligned again: 7..9
  EXPECT_EQ(l.spans().back().frames, 3);
  // window 6 after 10 frames keeps 4..9: span 3..6 split (frame 3 evicted), span 0..2 gone
  ASSERT_EQ(l.spans().size(), 2u);
  EXPECT_EQ(l.spans().front().evicted, 1);
}

TEST(SpanLedger, CentroidRule) {
  SpanPlan p = plan(4, 0, 1);
  EXPECT_EQ(p.centroids_for(10), 1);
  EXPECT_EQ(p.centroids_for(64), 1);
  EXPECT_EQ(p.centroids_for(2640), 41);
  EXPECT_EQ(p.centroids_for(1 << 20), 256);
}

TEST(KiviLedger, FlushAndEvictStepByStep) {
  KiviPlan p;
  p.heads = 1;
  p.head_dim = 32;
  p.tokens_per_frame = 24;
  p.window_frames = 2;
  p.sink_frames = 1;
  p.group = 32;
  p.residual = 32;
  KiviLedger l(p);
  struct Want {
    int flushed;
    int64_t sink, buffer_first, buffer, dead;
    std::vector<int64_t> chunks;
  };
  const std::vector<Want> want = {
      {0, 24, 0, 0, 0, {}},        // frame 0: sink
      {0, 24, 0, 24, 0, {}},       // frame 1: 24 buffered
      {1, 24, 32, 16, 0, {0}},     // frame 2: 48 -> one chunk [0, 32), 16 left
      {1, 24, 64, 8, 24, {0, 32}},  // frame 3: window 2..3 evicts frame 1 = seq [0, 24): chunk 0 partly live
      {1, 24, 96, 0, 48, {32, 64}},    // frame 4: dead < 48: chunk 0 gone, chunk 32 live from 16
  };
  for (int f = 0; f < static_cast<int>(want.size()); ++f) {
    const Want& w = want[static_cast<size_t>(f)];
    EXPECT_EQ(l.add_frame(f), w.flushed) << f;
    EXPECT_EQ(l.sink_tokens(), w.sink) << f;
    EXPECT_EQ(l.buffer_first(), w.buffer_first) << f;
    EXPECT_EQ(l.buffer_tokens(), w.buffer) << f;
    EXPECT_EQ(l.dead_before(), w.dead) << f;
    std::vector<int64_t> got;
    for (const auto& c : l.chunks()) got.push_back(c.first);
    EXPECT_EQ(got, w.chunks) << f;
  }
  EXPECT_EQ(l.chunk_live_from(l.chunks().front()), 16);
  // bytes: sink 24 tokens fp16 K+V; two chunks of D=32 blocks: codes 32*32/4 each side
  const KvBytes b = l.bytes();
  EXPECT_EQ(b.fp_values, 24 * 32 * 2 * 2);
  EXPECT_EQ(b.codes, 2 * 2 * 256);
  EXPECT_EQ(b.scales, 2 * 2 * 64);
  EXPECT_EQ(b.zeros, 2 * 2 * 64);
}

}  // namespace
}  // namespace wm
