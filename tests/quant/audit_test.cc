// Probes, the audited cache, capture/replay, and the engine's audit mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "engine/engine.h"
#include "quant/kv_audit.h"
#include "quant/kv_cases.h"
#include "quant/kv_replay.h"
#include "quant/probe.h"
#include "tests/quant/test_util.h"

namespace wm {
namespace {

TEST(Probe, IdenticalHistoriesHaveNoDrift) {
  std::mt19937 rng(1);
  const int n = 6, m = 20, H = 2, D = 16;
  auto q = testing_util::randn(static_cast<size_t>(n) * H * D, rng);
  auto kc = testing_util::randn(q.size(), rng), vc = testing_util::randn(q.size(), rng);
  auto k = testing_util::randn(static_cast<size_t>(m) * H * D, rng), v = testing_util::randn(k.size(), rng);
  DriftStats s;
  const auto samples = probe_sample(n, H, 100, 3);
  EXPECT_EQ(samples.size(), static_cast<size_t>(n * H));
  probe_attention(q.data(), kc.data(), vc.data(), n, H, D, k.data(), v.data(), k.data(), v.data(), m, samples, 5, &s);
  EXPECT_EQ(s.queries, n * H);
  EXPECT_EQ(s.top1_mismatches, 0);
  EXPECT_DOUBLE_EQ(s.topk_overlap_sum, static_cast<double>(n * H));
  EXPECT_EQ(s.logit_sq_err_sum, 0.0);
  EXPECT_EQ(s.logits, static_cast<int64_t>(n) * H * m);
  EXPECT_EQ(s.output_rel_err_sum, 0.0);
  EXPECT_EQ(s.drift(), 0.0);
}

TEST(Probe, CountsASwappedTopToken) {
  // one query, two cached keys; the quantized cache swaps which one wins
  const int D = 4;
  const float q[] = {1, 0, 0, 0};
  const float kc[] = {0, 0, 0, 0}, vc[] = {0, 0, 0, 0};
  const float kr[] = {2, 0, 0, 0, 1, 0, 0, 0};
  const float kq[] = {1, 0, 0, 0, 2, 0, 0, 0};
  const float v[] = {1, 0, 0, 0, 0, 1, 0, 0};
  DriftStats s;
  const ProbeQuery p[] = {{0, 0}};
  probe_attention(q, kc, vc, 1, 1, D, kr, v, kq, v, 2, p, 1, &s);
  EXPECT_EQ(s.queries, 1);
  EXPECT_EQ(s.top1_mismatches, 1);
  EXPECT_EQ(s.topk_overlap_sum, 0.0);
  EXPECT_NEAR(s.logit_sq_err_sum, 2 * 0.25, 1e-12);  // (1/sqrt(4))^2 per logit
  EXPECT_GT(s.output_rel_err_sum, 0.1);
  // no history: nothing counted
  DriftStats e;
  probe_attention(q, kc, vc, 1, 1, D, kr, v, kq, v, 0, p, 1, &e);
  EXPECT_EQ(e.queries, 0);
}

// ties: the earlier token ranks first, top-1 and top-k alike; a NaN logit last
TEST(Probe, TiesGoToTheEarlierToken) {
  const int D = 4;
  const float q[] = {1, 0, 0, 0};
  const float kc[] = {-9, 0, 0, 0}, vc[] = {0, 0, 0, 0};
  // reference logits (x 1/2) 0, 5, 5, 5: top-2 tokens 1, 2; candidate NaN, 5, 5, 4.9: 1, 2
  const float kr[] = {0, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0};
  const float kq[] = {NAN, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 4.9f, 0, 0, 0};
  const float v[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  const ProbeQuery p[] = {{0, 0}};
  DriftStats s;
  probe_attention(q, kc, vc, 1, 1, D, kr, v, kq, v, 4, p, 2, &s);
  EXPECT_EQ(s.queries, 1);
  EXPECT_EQ(s.top1_mismatches, 0);
  EXPECT_DOUBLE_EQ(s.topk_overlap_sum, 1.0);
  EXPECT_NEAR(s.logit_sq_err_sum, 0.05 * 0.05, 1e-7) << "the NaN term left out";
}

// the statistics from a device pair's ranks; a sample with a non-finite
// reference logit or output is skipped; arrays of the wrong size count nothing
TEST(Probe, RanksGiveTheStatistics) {
  ProbeRanks r;
  r.tokens = 10;
  r.k = 2;
  r.ref_top = {3, 1, 2, 0};
  r.cand_top = {3, 4, 0, 2};  // sample 0: same top-1, half the top-2; sample 1: top-1 moved, same top-2
  r.sq_err = {0.5, 1.5};
  r.ref_nonfinite = {0, 0};
  r.ref_out = {1, 0, 0, 2};
  r.cand_out = {1, 0, 0, 2.5f};  // relative errors 0 and 0.25
  DriftStats s;
  ASSERT_TRUE(probe_ranks_stats(r, 2, 2, &s));
  EXPECT_EQ(s.queries, 2);
  EXPECT_EQ(s.top1_mismatches, 1);
  EXPECT_DOUBLE_EQ(s.topk_overlap_sum, 1.5);
  EXPECT_DOUBLE_EQ(s.logit_sq_err_sum, 2.0);
  EXPECT_EQ(s.logits, 20);
  EXPECT_DOUBLE_EQ(s.output_rel_err_sum, 0.25);

  ProbeRanks skip = r;
  skip.ref_nonfinite[0] = 1;
  skip.ref_out[3] = NAN;
  DriftStats none;
  ASSERT_TRUE(probe_ranks_stats(skip, 2, 2, &none));
  EXPECT_EQ(none.queries, 0);
  EXPECT_FALSE(probe_ranks_stats(r, 3, 2, &none));
  EXPECT_FALSE(probe_ranks_stats(r, 2, 4, &none));
  ProbeRanks empty;  // nothing cached
  EXPECT_TRUE(probe_ranks_stats(empty, 2, 2, &none));
  EXPECT_EQ(none.queries, 0);
}

TEST(AuditedCache, ReturnsThePrimaryResultAndMeasuresDrift) {
  const KvGeometry g = kv_case_geometry(64, 2, 32, 4, 1, 2);
  AuditOptions ao;
  ao.call_fraction = 1.0;
  ao.queries_per_head = 8;
  auto audited = make_audited_cache(*make_kv_cache("qvg2", g), ao);
  auto plain = *make_kv_cache("qvg2", g);
  SyntheticKv data(g, 4);
  ASSERT_TRUE(fill_cache(audited.get(), data, 6, 16).ok());
  ASSERT_TRUE(fill_cache(plain.get(), data, 6, 16).ok());
  EXPECT_EQ(audited->format(), "qvg2");
  EXPECT_EQ(audited->bytes().total(), plain->bytes().total());  // the shadow is not session KV
  const auto* a = static_cast<const AuditedKvCache*>(audited.get());
  EXPECT_EQ(a->shadow_bytes().total(), 5 * 32 * 2 * 64 * 4 * 2 * 2);  // fp32, 5 frames, 2 layers
  std::vector<float> q, kc, vc, o1(16 * 128), o2(o1.size());
  for (int step = 0; step < 5; ++step) {
    data.queries(50 + step, 16, &q);
    data.block(50 + step, 16, &kc, &vc);
    for (int l = 0; l < 2; ++l) {
      audited->attend(l, q.data(), kc.data(), vc.data(), 16, o1.data());
      plain->attend(l, q.data(), kc.data(), vc.data(), 16, o2.data());
      EXPECT_EQ(o1, o2);
    }
  }
  ASSERT_NE(audited->drift(), nullptr);
  EXPECT_EQ(audited->drift()->queries, 5 * 2 * 2 * 8);
  EXPECT_GT(audited->drift()->logit_sq_err_sum, 0.0);
  EXPECT_EQ(plain->drift(), nullptr);
}

TEST(Replay, EvaluatorComparesFormatsOnCapturedCalls) {
  const KvGeometry g = kv_case_geometry(64, 2, 32, 4, 1, 2);
  KvEventLog log(g);
  auto cache = make_observed_cache(*make_kv_cache("fp32", g), &log);
  SyntheticKv data(g, 6);
  std::vector<float> k, v, q, kc, vc, out(16 * 128);
  for (int f = 0; f < 6; ++f) {
    data.frame(f, &k, &v);
    data.queries(f, 16, &q);
    data.block(f, 16, &kc, &vc);
    for (int l = 0; l < 2; ++l) {
      cache->observe_queries(l, q.data(), 16);
      cache->attend(l, q.data(), kc.data(), vc.data(), 16, out.data());
      ASSERT_TRUE(cache->append(l, k.data(), v.data(), f, 1).ok());
    }
  }
  ASSERT_EQ(log.events().size(), 6u * 2 * 3);
  EXPECT_TRUE(log.events()[1].q_from_previous);
  DriftStats totals[2][3];
  for (int run = 0; run < 2; ++run) {
    KvEvaluator::Options o;
    o.fused = true;
    KvEvaluator ev(g, o);
    for (const char* f : {"fp16", "qvg2", "quantwm2"}) ASSERT_TRUE(ev.add(f, {}).ok());
    kv_replay(log.events(), &ev);
    ASSERT_EQ(ev.candidates().size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const auto& c = ev.candidates()[static_cast<size_t>(i)];
      EXPECT_TRUE(c.error.empty()) << c.error;
      EXPECT_EQ(c.per_layer.size(), 2u);
      totals[run][i] = c.overall();
      EXPECT_GT(c.fused_rows, 0);
      EXPECT_GT(c.peak.total(), 0);
      EXPECT_LE(c.peak.total(), c.reserved);
    }
    EXPECT_EQ(totals[run][0].top1_mismatches, 0);  // fp16 selects the same tokens here
    EXPECT_GT(totals[run][1].logit_sq_err_sum, totals[run][0].logit_sq_err_sum);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(totals[0][i].top1_mismatches, totals[1][i].top1_mismatches);
    EXPECT_EQ(totals[0][i].logit_sq_err_sum, totals[1][i].logit_sq_err_sum);
  }
}

// the bound wmquant checks before it makes an evaluator: the caches at their
// largest (by hand for the fp formats), the span formats' query statistics
// (qvg2's too: its layers hold them), one layer's reconstructions for two
// caches, and a sum that saturates where an absurd geometry would wrap
TEST(Replay, EvaluationBytesCountWhatTheEvaluatorHolds) {
  const KvGeometry g = kv_case_geometry(64, 2, 32, 4, 1, 2);  // 2 layers x 2 heads x 64, 32 tokens, 4 + 1 frames
  const int64_t fp32 = g.values_per_frame() * g.max_frames() * 4;
  EXPECT_EQ(kv_format_max_bytes("fp32", g), fp32);
  const int64_t stats = int64_t{2} * 2 * (64 * 65 / 2) * 8;
  EXPECT_EQ(kv_format_statistics_bytes("qvg2", g), stats);
  EXPECT_EQ(kv_format_statistics_bytes("quantwm2-psac-k", g), stats);
  EXPECT_EQ(kv_format_statistics_bytes("kivi2", g), 0);
  EXPECT_EQ(kv_format_statistics_bytes("fp16", g), 0);
  EXPECT_EQ(kv_format_statistics_bytes("nope", g), 0);
  const int64_t base = fp32 + fp32 / 2 + 2 * (fp32 / g.layers);
  EXPECT_EQ(kv_evaluation_bytes(g, std::vector<std::string>{}, {}), base);
  const std::vector<std::string> formats = {"kivi2", "qvg2", "quantwm2"};
  int64_t candidates = 0;
  for (const auto& f : formats) candidates += kv_format_max_bytes(f, g) + kv_format_statistics_bytes(f, g);
  EXPECT_EQ(kv_evaluation_bytes(g, formats, {}), base + candidates);
  KvGeometry huge;
  huge.layers = huge.heads = huge.head_dim = 256;
  huge.tokens_per_frame = 2048 * 2048;
  huge.window_frames = 1024;
  huge.sink_frames = 1000;
  EXPECT_EQ(kv_evaluation_bytes(huge, std::vector<std::string>(8, "fp32"), {}), INT64_MAX);
}

TEST(EngineAudit, AuditedSessionsReportDriftByFormat) {
  EngineOptions o;
  o.random_weights = true;
  o.random_seed = 5;
  o.config_path = std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json";
  o.threads = 1;
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  SessionOptions so;
  so.cache_format = "quantwm2";
  so.audit = true;
  auto id = (*e)->open_session(so);
  ASSERT_TRUE(id.ok()) << id.status();
  SessionOptions plain;
  plain.cache_format = "qvg2";
  auto id2 = (*e)->open_session(plain);
  ASSERT_TRUE(id2.ok());
  for (int i = 0; i < 12; ++i) {
    StepRequest r[2];
    r[0].session = *id;
    r[1].session = *id2;
    r[0].actions.resize(1);
    r[1].actions.resize(1);
    ASSERT_TRUE((*e)->step(std::span<const StepRequest>(r, 2)).ok());
  }
  const auto drift = (*e)->drift_by_format();
  ASSERT_EQ(drift.count("quantwm2"), 1u);
  EXPECT_EQ(drift.count("qvg2"), 0u);
  EXPECT_GT(drift.at("quantwm2").queries, 0);
  auto info = (*e)->session_info(*id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->cache_format, "quantwm2");
  EXPECT_LE(info->kv.total(), info->kv_reserved);
}

TEST(DriftStats, PoolsFramePsnrAndKeepsTheWorstFrame) {
  DriftStats d;
  EXPECT_EQ(d.frame_psnr(), DriftStats::kPsnrCapDb);  // nothing compared yet
  std::vector<uint8_t> a(300, 100), b = a, c = a;
  d.add_frame(a.data(), b.data(), a.size());  // identical: the cap
  EXPECT_EQ(d.frames, 1);
  EXPECT_EQ(d.frame_psnr(), DriftStats::kPsnrCapDb);
  EXPECT_EQ(d.frame_psnr_min, DriftStats::kPsnrCapDb);
  for (auto& x : c) x = 101;  // every value off by one: MSE 1, PSNR 20 log10(255)
  DriftStats e;
  e.add_frame(a.data(), c.data(), a.size());
  EXPECT_NEAR(e.frame_psnr(), 20 * std::log10(255.0), 1e-9);
  EXPECT_NEAR(e.frame_psnr_min, 20 * std::log10(255.0), 1e-9);
  d += e;
  EXPECT_EQ(d.frames, 2);
  EXPECT_EQ(d.frame_values, 600);
  // pooled: MSE 0.5 over both frames; the worst frame is the second
  EXPECT_NEAR(d.frame_psnr(), 10 * std::log10(255.0 * 255.0 / 0.5), 1e-9);
  EXPECT_NEAR(d.frame_psnr_min, 20 * std::log10(255.0), 1e-9);
}

namespace {

std::unique_ptr<Engine> tiny_engine(double block_fraction, bool defer_writes = false) {
  EngineOptions o;
  o.random_weights = true;
  o.random_seed = 5;
  o.config_path = std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json";
  o.threads = 1;
  o.audit_block_fraction = block_fraction;
  o.defer_writes = defer_writes;
  auto e = Engine::create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// one session of `format` (audited or not) stepped alone for `blocks` blocks
// of varied actions; its frames, concatenated
std::vector<uint8_t> play_alone(Engine& e, const std::string& format, bool audit, int blocks) {
  SessionOptions so;
  so.cache_format = format;
  so.audit = audit;
  so.seed = 11;
  auto id = e.open_session(so);
  EXPECT_TRUE(id.ok()) << id.status();
  std::vector<uint8_t> frames;
  for (int i = 0; i < blocks; ++i) {
    StepRequest r;
    r.session = *id;
    r.actions.resize(static_cast<size_t>(e.config().frames_per_block));
    for (auto& a : r.actions) {
      a.keys = (i % 3 == 0) ? 1u : 4u;
      a.mouse[0] = static_cast<float>(i % 5) - 2.0f;
    }
    auto out = e.step(std::span<const StepRequest>(&r, 1));
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) break;
    for (const auto& f : (*out)[0].frames) frames.insert(frames.end(), f.rgb.begin(), f.rgb.end());
  }
  return frames;
}

}  // namespace

// the blocks made again against the shadow change nothing a player sees,
// and their PSNR ranks the formats: fp16 against fp32 nearly identical,
// 2-bit keys and values visibly worse
TEST(EngineAudit, ShadowFramesMeasurePsnrWithoutTouchingTheServedFrames) {
  const int blocks = 10;
  std::map<std::string, DriftStats> drift;
  for (const std::string format : {"fp16", "kivi2", "quantwm2"}) {
    auto plain = tiny_engine(1.0), audited = tiny_engine(1.0);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(audited, nullptr);
    const auto want = play_alone(*plain, format, /*audit=*/false, blocks);
    const auto got = play_alone(*audited, format, /*audit=*/true, blocks);
    EXPECT_EQ(got, want) << format << ": the audit changed the served frames";
    const auto d = audited->drift_by_format();
    ASSERT_EQ(d.count(format), 1u) << format;
    drift[format] = d.at(format);
    EXPECT_EQ(plain->drift_by_format().count(format), 0u);
  }
  const int B = tiny_engine(0)->config().frames_per_block;
  for (const auto& [format, d] : drift) {
    EXPECT_EQ(d.frames, blocks * B) << format;  // every block (fraction 1)
    EXPECT_EQ(d.frame_values, d.frames * 32 * 32 * 3) << format;
    EXPECT_LE(d.frame_psnr_min, d.frame_psnr()) << format;
  }
  // the first block has an empty history: the same frames either way, so
  // no format is below the cap on every frame, but 2-bit ones are overall
  EXPECT_LT(drift["kivi2"].frame_psnr(), DriftStats::kPsnrCapDb);
  EXPECT_LT(drift["quantwm2"].frame_psnr(), DriftStats::kPsnrCapDb);
  EXPECT_GT(drift["fp16"].frame_psnr(), drift["kivi2"].frame_psnr());
  EXPECT_GT(drift["fp16"].frame_psnr(), drift["quantwm2"].frame_psnr());
  EXPECT_GT(drift["fp16"].frame_psnr(), 40.0);
}

// which blocks are made again is a pure function of the session: the same
// on a second engine, none at fraction 0, about the fraction's share of many
TEST(EngineAudit, ShadowBlocksAreASampleOfTheFraction) {
  const int blocks = 40;
  auto a = tiny_engine(0.25), b = tiny_engine(0.25), none = tiny_engine(0.0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(none, nullptr);
  play_alone(*a, "quantwm2", true, blocks);
  play_alone(*b, "quantwm2", true, blocks);
  play_alone(*none, "quantwm2", true, blocks);
  const DriftStats da = a->drift_by_format().at("quantwm2"), db = b->drift_by_format().at("quantwm2");
  EXPECT_EQ(da.frames, db.frames);
  EXPECT_EQ(da.frame_sq_err_sum, db.frame_sq_err_sum);
  EXPECT_GE(da.frames, 3);
  EXPECT_LE(da.frames, 20);
  EXPECT_EQ(none->drift_by_format().at("quantwm2").frames, 0);
  EXPECT_GT(none->drift_by_format().at("quantwm2").queries, 0);  // the probes still run
}

// with deferred writes (the server's way) a block is made again against the
// shadow at flush_writes, after its frames went out and before its write:
// the same history, so the same numbers as without; a session closed with
// such a block pending drops it
TEST(EngineAudit, DeferredWritesMakeTheShadowBlockAfterTheFramesAreOut) {
  auto now = tiny_engine(1.0), deferred = tiny_engine(1.0, /*defer_writes=*/true);
  ASSERT_NE(now, nullptr);
  ASSERT_NE(deferred, nullptr);
  SessionOptions so;
  so.cache_format = "quantwm2";
  so.audit = true;
  so.seed = 3;
  auto a = now->open_session(so), b = deferred->open_session(so);
  ASSERT_TRUE(a.ok() && b.ok());
  const int B = now->config().frames_per_block;
  for (int i = 0; i < 6; ++i) {
    StepRequest ra{*a, std::vector<Action>(static_cast<size_t>(B)), {}}, rb{*b, ra.actions, {}};
    for (auto& x : ra.actions) x.keys = 1u << (i % 4);
    rb.actions = ra.actions;
    ASSERT_TRUE(now->step(std::span<const StepRequest>(&ra, 1)).ok());
    ASSERT_TRUE(deferred->step(std::span<const StepRequest>(&rb, 1)).ok());
    EXPECT_EQ(now->session_cache(*a)->drift()->frames, (i + 1) * B);
    EXPECT_EQ(deferred->session_cache(*b)->drift()->frames, i * B) << "made at the flush, not in the step";
    ASSERT_TRUE(deferred->flush_writes().ok());
    EXPECT_EQ(deferred->session_cache(*b)->drift()->frames, (i + 1) * B);
  }
  const DriftStats &x = *now->session_cache(*a)->drift(), &y = *deferred->session_cache(*b)->drift();
  EXPECT_EQ(x.frame_sq_err_sum, y.frame_sq_err_sum);
  EXPECT_EQ(x.frame_psnr_min, y.frame_psnr_min);
  // a block pending at close is dropped with the session
  StepRequest last{*b, std::vector<Action>(static_cast<size_t>(B)), {}};
  ASSERT_TRUE(deferred->step(std::span<const StepRequest>(&last, 1)).ok());
  EXPECT_TRUE(deferred->writes_pending());
  ASSERT_TRUE(deferred->close_session(*b).ok());
  EXPECT_FALSE(deferred->writes_pending());
  ASSERT_TRUE(deferred->flush_writes().ok());
  EXPECT_EQ(deferred->drift_by_format().at("quantwm2").frames, 6 * B);
}

TEST(EngineAudit, RejectsABlockFractionOutsideZeroToOne) {
  for (double f : {-0.1, 1.5, std::nan("")}) {
    EngineOptions o;
    o.random_weights = true;
    o.config_path = std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json";
    o.audit_block_fraction = f;
    auto e = Engine::create(o);
    ASSERT_FALSE(e.ok()) << f;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("audit block fraction"), std::string::npos) << e.status();
  }
}

}  // namespace
}  // namespace wm
