// The attention kernels' own device code (attention_kernel.cuh with SyncMma
// and WgMma, attention_sm90.cuh's overlapped kernel, the split-KV combine
// kernel) run on the host emulator (simt/simt_runtime.h), on the same paged
// batches as the GPU parity suite, against
//   - the scalar model of the same plan (paged_attention_case.h: same tile
//     walk, fp16 probabilities): within 2e-3 of max |ref|, i.e. only the
//     order of the additions differs; a wrong fragment, swizzle, descriptor,
//     stage or wait shows up as O(1) errors or NaN (shared memory starts as
//     NaN bytes);
//   - the CPU backend's fp16 cache: within the GPU suite's kAttentionAbs.
// Each kernel also runs under the three schedules and at two dynamic shared
// memory bases (0 and 16: the Hopper kernels align their stages to 1024
// themselves), and the emulator's checks (shared-memory bounds, copies not
// landed, barriers, wgmma in flight) fail a case with a message. The last
// tests show that those checks fire.
//
// What this cannot show: speed, and whatever the hardware does that the PTX
// ISA's tables (ptx_model.h) do not say. The GPU suite (backend_ops_test.cc)
// remains the judge; this one makes its first run likely to pass.
#include "simt_runtime.h"  // first: the CUDA built-ins the kernels use

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "cuda/attention_combine_kernel.cuh"
#include "cuda/attention_kernel.cuh"
#include "cuda/attention_sm90.cuh"
#include "cuda/attention_ws.cuh"
#include "cuda/sync_mma.cuh"
#include "cuda/tma.cuh"
#include "cuda/tensor_map.h"
#include "paged_attention_case.h"

namespace wm::cuda {
namespace {

using simt::Schedule;

// kOverlap5: 5 K/V stages; kOverlapPingPong: 4 stages, two warpgroups in ping-pong (AttentionArgs::pingpong);
// kWs: the warp-specialised kernel, 4 stages, ping-pong; kWs3: 3 stages, no ping-pong; kWs128: 128 keys a
// step (3 stages), ping-pong; kWsTma, kWs128Tma: kWs and kWs128 with whole key tiles copied by TMA;
// kWsTma6: kWsTma with 6 stages (the TMA build's named barriers, without FULL's)
enum class Kernel {
  kMma,
  kWgmma,
  kOverlap,
  kOverlap5,
  kOverlapPingPong,
  kWs,
  kWs3,
  kWs128,
  kWsTma,
  kWs128Tma,
  kWsTma6
};

bool uses_tma(Kernel k) { return k == Kernel::kWsTma || k == Kernel::kWs128Tma || k == Kernel::kWsTma6; }

const char* name(Kernel k) {
  switch (k) {
    case Kernel::kMma:
      return "mma";
    case Kernel::kWgmma:
      return "wgmma";
    case Kernel::kOverlap:
      return "overlap";
    case Kernel::kOverlap5:
      return "overlap5";
    case Kernel::kOverlapPingPong:
      return "overlap-pingpong";
    case Kernel::kWs:
      return "ws";
    case Kernel::kWs3:
      return "ws3";
    case Kernel::kWs128:
      return "ws128";
    case Kernel::kWsTma:
      return "ws-tma";
    case Kernel::kWs128Tma:
      return "ws128-tma";
    case Kernel::kWsTma6:
      return "ws-tma6";
  }
  return "?";
}

struct KernelLaunch {
  unsigned threads = 0;
  size_t smem = 0;
  void (*body)(const AttentionArgs&, const PagedKvFp16View&) = nullptr;
};

template <Kernel K, int HD, int BQ>
void run_kernel(const AttentionArgs& a, const PagedKvFp16View& kv) {
  if constexpr (K == Kernel::kMma) {
    attention_kernel<SyncMma, Fp16PageFormat, HD, BQ>(a, kv);
  } else if constexpr (K == Kernel::kWgmma) {
    attention_kernel<WgMma, Fp16PageFormat, HD, BQ>(a, kv);
  } else if constexpr (K == Kernel::kOverlap) {
    attention_overlap_kernel<Fp16PageFormat, HD, BQ>(a, kv);
  } else if constexpr (K == Kernel::kOverlap5) {
    attention_overlap_kernel<Fp16PageFormat, HD, BQ, 5>(a, kv);
  } else if constexpr (K == Kernel::kOverlapPingPong) {
    attention_overlap_kernel<Fp16PageFormat, HD, BQ, 4>(a, kv);
  } else if constexpr (K == Kernel::kWs) {
    attention_ws_kernel<Fp16PageFormat, HD, BQ, 4, 1>(a, kv);
  } else if constexpr (K == Kernel::kWs3) {
    attention_ws_kernel<Fp16PageFormat, HD, BQ, 3, 1>(a, kv);
  } else if constexpr (K == Kernel::kWs128) {
    attention_ws_kernel<Fp16PageFormat, HD, BQ, 3, 2>(a, kv);
  } else if constexpr (K == Kernel::kWsTma) {
    attention_ws_kernel<Fp16PageFormat, HD, BQ, 4, 1, true>(a, kv);
  } else if constexpr (K == Kernel::kWsTma6) {
    attention_ws_kernel<Fp16PageFormat, HD, BQ, 6, 1, true>(a, kv);
  } else {
    attention_ws_kernel<Fp16PageFormat, HD, BQ, 3, 2, true>(a, kv);
  }
}

template <Kernel K, int HD, int BQ>
KernelLaunch kernel_launch() {
  KernelLaunch l;
  l.body = run_kernel<K, HD, BQ>;
  if constexpr (K == Kernel::kMma) {
    l.threads = SyncMma::kThreads(BQ);
    l.smem = attention_kernel_smem<SyncMma>(HD, BQ);
  } else if constexpr (K == Kernel::kWgmma) {
    l.threads = WgMma::kThreads(BQ);
    l.smem = attention_kernel_smem<WgMma>(HD, BQ);
  } else if constexpr (K == Kernel::kOverlap) {
    l.threads = OverlapAttention<>::threads(BQ);
    l.smem = OverlapAttention<>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kOverlap5) {
    l.threads = OverlapAttention<5>::threads(BQ);
    l.smem = OverlapAttention<5>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kOverlapPingPong) {
    l.threads = OverlapAttention<4>::threads(BQ);
    l.smem = OverlapAttention<4>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kWs) {
    l.threads = WsAttention<4>::threads(BQ);
    l.smem = WsAttention<4>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kWs3) {
    l.threads = WsAttention<3>::threads(BQ);
    l.smem = WsAttention<3>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kWs128) {
    l.threads = WsAttention<3, 2>::threads(BQ);
    l.smem = WsAttention<3, 2>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kWsTma) {
    l.threads = WsAttention<4, 1, true>::threads(BQ);
    l.smem = WsAttention<4, 1, true>::smem(HD, BQ);
  } else if constexpr (K == Kernel::kWsTma6) {
    l.threads = WsAttention<6, 1, true>::threads(BQ);
    l.smem = WsAttention<6, 1, true>::smem(HD, BQ);
  } else {
    l.threads = WsAttention<3, 2, true>::threads(BQ);
    l.smem = WsAttention<3, 2, true>::smem(HD, BQ);
  }
  return l;
}

template <Kernel K>
KernelLaunch kernel_launch(int hd, int bq) {
  if (hd == 64) return bq == 64 ? kernel_launch<K, 64, 64>() : kernel_launch<K, 64, 128>();
  if (hd == 128) return bq == 64 ? kernel_launch<K, 128, 64>() : kernel_launch<K, 128, 128>();
  if constexpr (K == Kernel::kMma) {
    if (hd == 32) return bq == 64 ? kernel_launch<K, 32, 64>() : kernel_launch<K, 32, 128>();
  }
  ADD_FAILURE() << "no " << name(K) << " kernel for head_dim " << hd;
  return {};
}

KernelLaunch kernel_launch(Kernel k, int hd, int bq) {
  switch (k) {
    case Kernel::kMma:
      return kernel_launch<Kernel::kMma>(hd, bq);
    case Kernel::kWgmma:
      return kernel_launch<Kernel::kWgmma>(hd, bq);
    case Kernel::kOverlap:
      return kernel_launch<Kernel::kOverlap>(hd, bq);
    case Kernel::kOverlap5:
      return kernel_launch<Kernel::kOverlap5>(hd, bq);
    case Kernel::kOverlapPingPong:
      return kernel_launch<Kernel::kOverlapPingPong>(hd, bq);
    case Kernel::kWs:
      return kernel_launch<Kernel::kWs>(hd, bq);
    case Kernel::kWs3:
      return kernel_launch<Kernel::kWs3>(hd, bq);
    case Kernel::kWs128:
      return kernel_launch<Kernel::kWs128>(hd, bq);
    case Kernel::kWsTma:
      return kernel_launch<Kernel::kWsTma>(hd, bq);
    case Kernel::kWs128Tma:
      return kernel_launch<Kernel::kWs128Tma>(hd, bq);
    case Kernel::kWsTma6:
      return kernel_launch<Kernel::kWsTma6>(hd, bq);
  }
  return {};
}

struct Emulated {
  std::string error;
  std::vector<float> out;  // [rows_total][heads][head_dim]
};

// a device buffer of n floats between two guard zones of canary NaNs, so
// that a write past either end is seen instead of corrupting the heap
class GuardedFloats {
 public:
  explicit GuardedFloats(size_t n) : data_(n + 2 * kGuard, canary()) {}
  float* get() { return data_.data() + kGuard; }
  std::vector<float> inside() const {
    return std::vector<float>(data_.begin() + kGuard, data_.end() - static_cast<std::ptrdiff_t>(kGuard));
  }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (!same_bits(data_[i], canary()) || !same_bits(data_[data_.size() - 1 - i], canary())) return false;
    return true;
  }

 private:
  static constexpr size_t kGuard = 4096;
  static float canary() {
    const uint32_t bits = 0x7fc0deadu;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }
  std::vector<float> data_;
};

// one layer of the case's plan through kernel k and, for split items, the
// combine kernel, with arguments laid out as cuda_backend.cc lays them out;
// outputs start as NaN
Emulated emulate(const PagedAttentionCase& c, int32_t layer, Kernel k, Schedule schedule, uint32_t smem_base) {
  const AttentionPlan& p = c.plan;
  const int32_t H = p.heads, Dh = p.head_dim;
  Emulated r;
  GuardedFloats out(static_cast<size_t>(p.rows_total) * H * Dh);
  GuardedFloats partial_o(static_cast<size_t>(p.partials) * H * p.block_q * Dh);
  GuardedFloats partial_ml(static_cast<size_t>(p.partials) * H * p.block_q * 2);
  AttentionArgs a;
  a.q16 = c.q16.data();
  a.k16 = c.k16.data();
  a.v16 = c.v16.data();
  a.out = out.get();
  a.partial_o = p.partials > 0 ? partial_o.get() : nullptr;
  a.partial_ml = p.partials > 0 ? partial_ml.get() : nullptr;
  a.sessions = p.sessions.data();
  a.cached = p.cached.data() + static_cast<size_t>(layer) * p.sessions.size();
  a.items = p.items.data();
  a.groups = p.groups.data();
  a.rows_total = p.rows_total;
  a.heads = H;
  a.layer = layer;
  a.block_q = p.block_q;
  a.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(Dh)));
  a.pingpong = k == Kernel::kOverlapPingPong || k == Kernel::kWs || k == Kernel::kWs128 || uses_tma(k) ? 1 : 0;
  PagedKvFp16View kv;
  kv.pool = c.pool.data();
  kv.page_table = p.page_tables.data();
  kv.page_elems = c.page_elems;
  kv.page_tokens = p.page_tokens;
  kv.head_dim = Dh;
  // TMA: the pool's map, and the block's keys and values as one buffer of rows (as the plugin's qkv16) with its
  // map; host memory here, device memory in the plugin
  CUtensorMap map, block_map;
  std::vector<uint16_t> kv16;
  if (uses_tma(k)) {
    const int64_t pages = static_cast<int64_t>(c.pool.size()) / c.page_elems;
    kv16 = c.k16;
    kv16.insert(kv16.end(), c.v16.begin(), c.v16.end());
    const CUresult e = encode_fp16_pool_map(simt::tensor_map_encode_tiled, &map, c.pool.data(), pages,
                                            c.page_elems * 2, Dh, p.page_tokens, kTileKeys);
    const CUresult eb = encode_rows_map(simt::tensor_map_encode_tiled, &block_map, kv16.data(),
                                        static_cast<int64_t>(kv16.size()) / Dh, Dh, kTileKeys);
    if (e != CUDA_SUCCESS || eb != CUDA_SUCCESS) {
      r.error = "encoding the tensor maps: " + std::to_string(static_cast<int>(e)) + ", " +
                std::to_string(static_cast<int>(eb));
      return r;
    }
    kv.tensor_map = &map;
    a.k16 = kv16.data();
    a.v16 = kv16.data() + c.k16.size();
    a.block_map = &block_map;
    a.k_map_row = 0;
    a.v_map_row = static_cast<int64_t>(c.k16.size()) / Dh;
  }

  simt::clear_globals();
  const std::vector<uint16_t>& block_rows = kv16;
  for (const std::vector<uint16_t>* v : {&c.q16, &c.k16, &c.v16, &c.pool, &block_rows})
    if (!v->empty()) simt::register_global(v->data(), v->size() * sizeof(uint16_t));
  const KernelLaunch l = kernel_launch(k, Dh, p.block_q);
  if (l.body == nullptr) {
    r.error = "no kernel";
    return r;
  }
  simt::LaunchConfig cfg;
  cfg.grid = dim3(static_cast<unsigned>(p.items.size()), static_cast<unsigned>(H));
  cfg.block = dim3(l.threads);
  cfg.dynamic_smem = l.smem;
  cfg.smem_base = smem_base;
  cfg.schedule = schedule;
  r.error = simt::launch(cfg, [&] { l.body(a, kv); });
  if (r.error.empty() && !p.groups.empty()) {
    simt::LaunchConfig combine;
    combine.grid = combine_grid(static_cast<int32_t>(p.groups.size()), H, p.block_q);
    combine.block = dim3(kCombineThreads);
    combine.schedule = schedule;
    r.error = simt::launch(combine, [&] { attention_combine_kernel(a, Dh); });
  }
  simt::clear_globals();
  if (r.error.empty() && !(out.guards_intact() && partial_o.guards_intact() && partial_ml.guards_intact()))
    r.error = "a write past the end of an output buffer";
  r.out = out.inside();
  return r;
}

PagedGeometry geometry(int head_dim, int tokens_per_frame, int window, int sinks, int layers = 1, int heads = 2) {
  PagedGeometry g;
  g.layers = layers;
  g.heads = heads;
  g.head_dim = head_dim;
  g.tokens_per_frame = tokens_per_frame;
  g.window_frames = window;
  g.sink_frames = sinks;
  g.page_tokens = 8192 / head_dim;  // 16 KiB pages: 128 tokens at head_dim 32, 64 at 128
  return g;
}

struct Case {
  const char* what;
  PagedGeometry g;
  std::vector<CaseSession> sessions;
  int32_t block_q;
  int32_t split;  // PlanTuning::split
  bool splits;    // the plan splits some KV range, so the combine kernel runs
};

// checks every output of one emulated layer; returns false after the first bad case
bool check(const PagedAttentionCase& c, int32_t layer, const Emulated& e, const std::string& label) {
  EXPECT_EQ(e.error, "") << label;
  if (!e.error.empty()) return false;
  const std::vector<float> model = host_attention(c, layer, /*p_fp16=*/true);
  const std::vector<float>& cpu = c.cpu[static_cast<size_t>(layer)];
  double ref_max = 0;
  for (float x : model) ref_max = std::max(ref_max, static_cast<double>(std::fabs(x)));
  EXPECT_GT(ref_max, 0.05) << label << ": a case with nothing to compare";
  double worst_model = 0, worst_cpu = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < e.out.size(); ++i) {
    const double dm = std::fabs(static_cast<double>(e.out[i]) - model[i]);
    const double dc = std::fabs(static_cast<double>(e.out[i]) - cpu[i]);
    if (!(dm <= 2e-3 * ref_max) || !(dc <= 1e-2)) {
      if (bad++ == 0) first_bad = i;
    }
    if (std::isfinite(dm)) worst_model = std::max(worst_model, dm);
    if (std::isfinite(dc)) worst_cpu = std::max(worst_cpu, dc);
  }
  const int32_t H = c.plan.heads, Dh = c.plan.head_dim;
  EXPECT_EQ(bad, 0u) << label << ": " << bad << " of " << e.out.size() << " values off; first at row "
                     << first_bad / (static_cast<size_t>(H) * Dh) << " head " << (first_bad / Dh) % H << " channel "
                     << first_bad % Dh << ": " << e.out[first_bad] << " vs model " << model[first_bad] << ", cpu "
                     << cpu[first_bad] << " (worst finite: " << worst_model << " vs model, " << worst_cpu
                     << " vs cpu)";
  return bad == 0;
}

void run_cases(Kernel k, const std::vector<Case>& cases, const std::vector<Schedule>& schedules,
               const std::vector<uint32_t>& smem_bases) {
  for (const Case& cs : cases) {
    PlanTuning t;
    t.block_q = cs.block_q;
    t.split = cs.split;
    t.num_sms = 2;  // a small "GPU": auto splits kick in
    t.min_tiles_per_split = 1;
    const PagedAttentionCase c = make_paged_attention_case(cs.g, cs.sessions, t, 1.5f);
    EXPECT_EQ(!c.plan.groups.empty(), cs.splits) << cs.what;
    for (Schedule s : schedules)
      for (uint32_t base : smem_bases)
        for (int32_t layer = 0; layer < cs.g.layers; ++layer) {
          const std::string label = std::string(name(k)) + " head_dim " + std::to_string(cs.g.head_dim) +
                                     " block_q " + std::to_string(cs.block_q) + ", " + cs.what + ", schedule " +
                                     std::to_string(static_cast<int>(s)) + ", smem base " + std::to_string(base) +
                                     ", layer " + std::to_string(layer);
          if (!check(c, layer, emulate(c, layer, k, s, base), label)) return;
        }
  }
}

// smallest first: one session, only its own block (one partial key tile);
// then one cache tile; then sessions of different lengths, a ring that
// wrapped, split KV ranges and the combine kernel
std::vector<Case> cases_for(int hd) {
  return {
      {"own block only", geometry(hd, 17, 3, 1), {{0, 17}}, 64, 1, false},
      {"one cache tile", geometry(hd, 40, 3, 1), {{1, 40}}, 64, 1, false},
      {"three sessions, split", geometry(hd, 17, 4, 1, 2), {{3, 34}, {9, 51}, {2, 5}}, 64, 3, true},
      {"three sessions, block_q 128", geometry(hd, 17, 4, 1), {{3, 34}, {9, 140}, {0, 5}}, 128, 2, true},
      // two warpgroups through 12 key tiles: every K/V stage is refilled, more than once
      {"block_q 128 over 12 key tiles", geometry(hd, 64, 10, 0), {{10, 128}}, 128, 1, false},
  };
}

const std::vector<Schedule> kAllSchedules = {Schedule::kRoundRobin, Schedule::kWarpsInOrder,
                                             Schedule::kWarpsReversed};

TEST(SimtAttention, MmaKernelHeadDim32) { run_cases(Kernel::kMma, cases_for(32), {Schedule::kRoundRobin}, {0}); }
TEST(SimtAttention, MmaKernelHeadDim64) { run_cases(Kernel::kMma, cases_for(64), kAllSchedules, {0}); }
TEST(SimtAttention, MmaKernelHeadDim128) { run_cases(Kernel::kMma, cases_for(128), {Schedule::kWarpsReversed}, {16}); }
TEST(SimtAttention, WgmmaKernelHeadDim64) { run_cases(Kernel::kWgmma, cases_for(64), kAllSchedules, {0, 16}); }
TEST(SimtAttention, WgmmaKernelHeadDim128) { run_cases(Kernel::kWgmma, cases_for(128), {Schedule::kRoundRobin}, {16}); }
TEST(SimtAttention, OverlapKernelHeadDim64) { run_cases(Kernel::kOverlap, cases_for(64), kAllSchedules, {0, 16}); }
TEST(SimtAttention, OverlapKernelHeadDim128) {
  run_cases(Kernel::kOverlap, cases_for(128), {Schedule::kWarpsInOrder}, {16});
}
TEST(SimtAttention, OverlapKernelFiveStagesHeadDim64) {
  run_cases(Kernel::kOverlap5, cases_for(64), kAllSchedules, {0, 16});
}
TEST(SimtAttention, OverlapKernelFiveStagesHeadDim128) {
  run_cases(Kernel::kOverlap5, cases_for(128), {Schedule::kWarpsReversed}, {0});
}
TEST(SimtAttention, WarpSpecialisedKernel) {
  run_cases(Kernel::kWs, cases_for(64), kAllSchedules, {0, 16});
  run_cases(Kernel::kWs, cases_for(128), kAllSchedules, {16});
}
TEST(SimtAttention, WarpSpecialisedKernelThreeStagesNoPingPong) {
  run_cases(Kernel::kWs3, cases_for(64), kAllSchedules, {16});
  run_cases(Kernel::kWs3, cases_for(128), {Schedule::kWarpsReversed}, {0});
}
// the combine kernel takes a row's partials 32 at a time: more than 32 ranges
TEST(SimtAttention, CombineOfMoreThan32Ranges) {
  const std::vector<Case> cases = {
      {"one session, 40 ranges", geometry(32, 64, 44, 1), {{45, 64}}, 64, 40, true},
      {"two sessions, 33 ranges each, 20 rows", geometry(32, 64, 40, 0), {{40, 20}, {36, 20}}, 64, 33, true},
  };
  for (const Case& cs : cases) {
    PlanTuning t;
    t.block_q = cs.block_q;
    t.split = cs.split;
    t.min_tiles_per_split = 1;
    const PagedAttentionCase c = make_paged_attention_case(cs.g, cs.sessions, t, 1.5f);
    int32_t most = 0;
    for (const CombineGroup& gr : c.plan.groups) most = std::max(most, gr.splits);
    EXPECT_GT(most, 32) << cs.what;
  }
  run_cases(Kernel::kMma, cases, {Schedule::kRoundRobin, Schedule::kWarpsReversed}, {0});
}
// 128 keys a step: odd tile counts (a zero-filled second half), a partial cache tile and the block's own keys
// in one step, 12 key tiles through 3 stages of 2
TEST(SimtAttention, WarpSpecialisedKernel128KeysAStep) {
  run_cases(Kernel::kWs128, cases_for(64), kAllSchedules, {0, 16});
  run_cases(Kernel::kWs128, cases_for(128), kAllSchedules, {16});
}
// TMA for whole key tiles, of the cache and of the block (cp.async for the rest): one cache tile that is
// partial, cache tiles through every stage more than once, several sessions, split ranges; 64 and 128 keys
// a step
TEST(SimtAttention, WarpSpecialisedKernelWithTma) {
  run_cases(Kernel::kWsTma, cases_for(64), kAllSchedules, {0, 16});
  run_cases(Kernel::kWsTma, cases_for(128), kAllSchedules, {16});
}
// 6 stages (kAhead 4): the 12 key tiles of the last case refill every stage
TEST(SimtAttention, WarpSpecialisedKernelSixStagesWithTma) {
  run_cases(Kernel::kWsTma6, cases_for(64), kAllSchedules, {16});
  run_cases(Kernel::kWsTma6, cases_for(128), kAllSchedules, {0});
}
TEST(SimtAttention, WarpSpecialisedKernel128KeysAStepWithTma) {
  run_cases(Kernel::kWs128Tma, cases_for(64), kAllSchedules, {16});
  run_cases(Kernel::kWs128Tma, cases_for(128), kAllSchedules, {0});
}
// the ping-pong changes only block_q 128 (two warpgroups): cases_for's last two cases
TEST(SimtAttention, OverlapKernelPingPong) {
  run_cases(Kernel::kOverlapPingPong, cases_for(64), kAllSchedules, {0, 16});
  run_cases(Kernel::kOverlapPingPong, cases_for(128), kAllSchedules, {16});
}

// ---- the emulator's own checks fire ----

std::vector<uint16_t>& global_tile() {
  static std::vector<uint16_t> g(64 * 64, 0x3c00);  // fp16 1.0
  return g;
}

// one CTA of the body, with `global` the device memory it may read
std::string run_one_cta(unsigned threads, size_t smem, Schedule schedule, const std::function<void()>& body,
                        const std::vector<uint16_t>& global = global_tile()) {
  simt::clear_globals();
  simt::register_global(global.data(), global.size() * 2);
  simt::LaunchConfig cfg;
  cfg.grid = dim3(1);
  cfg.block = dim3(threads);
  cfg.dynamic_smem = smem;
  cfg.schedule = schedule;
  std::string e = simt::launch(cfg, body);
  simt::clear_globals();
  return e;
}

TEST(SimtChecks, ReadBeforeTheCopyLandsFails) {
  const std::string e = run_one_cta(32, 4096, Schedule::kRoundRobin, [] {
    const int lane = static_cast<int>(threadIdx.x);
    cp_async_16(static_cast<uint32_t>(lane * 16), global_tile().data() + lane * 8, true);
    cp_async_commit();
    uint32_t r[4];
    ldmatrix_x4(r, static_cast<uint32_t>(lane * 16));  // no wait
    cp_async_wait<0>();
  });
  EXPECT_NE(e.find("has not landed"), std::string::npos) << e;
}

TEST(SimtChecks, NamedBarrierNobodyArrivesAtDeadlocks) {
  const std::string e = run_one_cta(256, 256, Schedule::kRoundRobin, [] {
    if (threadIdx.x >= 128) named_barrier_sync(1, 256);  // the first warpgroup never arrives
  });
  EXPECT_NE(e.find("named barrier 1"), std::string::npos) << e;
}

TEST(SimtChecks, NamedBarrierArrivalsLeftAtExitFail) {
  const std::string e = run_one_cta(256, 256, Schedule::kRoundRobin, [] {
    if (threadIdx.x < 128) named_barrier_arrive(1, 256);  // nobody syncs
  });
  EXPECT_NE(e.find("arrived when the CTA exited"), std::string::npos) << e;
}

TEST(SimtChecks, SetmaxnregByPartOfAWarpgroupFails) {
  const std::string e = run_one_cta(256, 256, Schedule::kRoundRobin, [] {
    if (threadIdx.x < 64) setmaxnreg_inc<232>();  // two warps of warpgroup 0
  });
  EXPECT_NE(e.find("setmaxnreg.inc"), std::string::npos) << e;
}

TEST(SimtChecks, SetmaxnregWithTwoCountsInAWarpgroupFails) {
  const std::string e = run_one_cta(128, 256, Schedule::kRoundRobin, [] {
    if (threadIdx.x < 64) {
      setmaxnreg_dec<40>();
    } else {
      setmaxnreg_dec<48>();
    }
  });
  EXPECT_NE(e.find("different counts"), std::string::npos) << e;
}

TEST(SimtChecks, NamedBarrierArriveThenSyncPasses) {
  for (Schedule sch : kAllSchedules) {
    const std::string e = run_one_cta(256, 256, sch, [] {
      for (int i = 0; i < 3; ++i) {
        if (threadIdx.x < 128) named_barrier_arrive(1, 256);
        else named_barrier_sync(1, 256);
        __syncthreads();
      }
    });
    EXPECT_EQ(e, "");
  }
}

TEST(SimtChecks, MissingBarrierBetweenWarpsFails) {
  // warp 1 copies, warp 0 reads, with a wait but no __syncthreads: the
  // warps-in-order schedule runs warp 0 to its read before warp 1 starts
  const std::string e = run_one_cta(64, 4096, Schedule::kWarpsInOrder, [] {
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
    if (tid >= 32) cp_async_16(static_cast<uint32_t>(lane * 16), global_tile().data() + lane * 8, true);
    cp_async_commit();
    cp_async_wait<0>();
    if (tid < 32) {
      uint32_t r[4];
      ldmatrix_x4(r, static_cast<uint32_t>(lane * 16));
    }
  });
  EXPECT_NE(e.find("nothing has written"), std::string::npos) << e;
}

TEST(SimtChecks, SharedMemoryOutOfBoundsFails) {
  const std::string e = run_one_cta(32, 256, Schedule::kRoundRobin, [] {
    cp_async_16(static_cast<uint32_t>(threadIdx.x * 16), global_tile().data(), true);  // 512 bytes into 256
    cp_async_commit();
    cp_async_wait<0>();
  });
  EXPECT_NE(e.find("outside the dynamic shared memory"), std::string::npos) << e;
}

TEST(SimtChecks, GlobalReadOutsideEveryBufferFails) {
  alignas(16) static uint16_t stray[8] = {};
  const std::string e = run_one_cta(32, 512, Schedule::kRoundRobin, [] {
    cp_async_16(static_cast<uint32_t>(threadIdx.x * 16), stray, true);
    cp_async_commit();
    cp_async_wait<0>();
  });
  EXPECT_NE(e.find("outside every buffer"), std::string::npos) << e;
}

TEST(SimtChecks, DivergentLanesAndDeadlocksFail) {
  std::string e = run_one_cta(32, 0, Schedule::kRoundRobin, [] {
    if (threadIdx.x == 3) {
      (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
    } else {
      uint32_t r[4];
      ldmatrix_x4(r, 0);
    }
  });
  EXPECT_NE(e.find("different instructions"), std::string::npos) << e;
  e = run_one_cta(64, 0, Schedule::kRoundRobin, [] {
    if (threadIdx.x < 32) __syncthreads();  // warp 1 never arrives
  });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
}

// a CTA of other than whole warps runs (its last warp partial) as on the
// device; a warp-wide instruction in that warp reads lanes that do not exist
TEST(SimtChecks, PartialWarpsRunPlainCodeButNoShuffle) {
  static int ran[40];
  std::fill(std::begin(ran), std::end(ran), 0);
  std::string e = run_one_cta(37, 0, Schedule::kWarpsReversed, [] {
    ++ran[threadIdx.x];
    __syncthreads();
    ++ran[threadIdx.x];
  });
  EXPECT_EQ(e, "");
  for (int t = 0; t < 40; ++t) EXPECT_EQ(ran[t], t < 37 ? 2 : 0) << "thread " << t;
  e = run_one_cta(1, 0, Schedule::kRoundRobin, [] { ran[0] = 5; });
  EXPECT_EQ(e, "");
  EXPECT_EQ(ran[0], 5);
  e = run_one_cta(40, 0, Schedule::kRoundRobin, [] {
    if (threadIdx.x < 32) return;
    (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
  });
  EXPECT_NE(e.find("partial warp of 8 threads"), std::string::npos) << e;
}

TEST(SimtChecks, WgmmaLeftInFlightFails) {
  const std::string e = run_one_cta(128, 4096, Schedule::kRoundRobin, [] {
    float d[8][4] = {};
    const uint32_t a[4] = {0, 0, 0, 0};
    wgmma_fence();
    wgmma_m64n64k16<0>(d, a, wgmma_desc(1024, 16, 1024));
    wgmma_commit();  // no wait
  });
  EXPECT_NE(e.find("wgmma in flight"), std::string::npos) << e;
}

// a K tile of 64 keys x 64 channels loaded by cp.async at shared address 1024, then one S = Q K^T step
void load_tile_then_wgmma(bool proxy_fence, bool wgmma_fence_first) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < 64 * 8; i += 128)
    cp_async_16(1024 + panel_swz<64, 64>(i / 8, i % 8), global_tile().data() + (i % 8) * 8, true);
  cp_async_commit();
  cp_async_wait<0>();
  if (proxy_fence) fence_proxy_async_smem();
  __syncthreads();
  float d[8][4] = {};
  const uint32_t a[4] = {0, 0, 0, 0};
  if (wgmma_fence_first) wgmma_fence();
  wgmma_m64n64k16<0>(d, a, key_desc<64, 64>(1024, 0));
  wgmma_commit();
  wgmma_wait<0>();
}

TEST(SimtChecks, FencesWgmmaNeedsAreChecked) {
  EXPECT_EQ(run_one_cta(128, 1024 + 8192, Schedule::kRoundRobin, [] { load_tile_then_wgmma(true, true); }), "");
  std::string e = run_one_cta(128, 1024 + 8192, Schedule::kRoundRobin, [] { load_tile_then_wgmma(false, true); });
  EXPECT_NE(e.find("fence.proxy.async"), std::string::npos) << e;
  e = run_one_cta(128, 1024 + 8192, Schedule::kRoundRobin, [] { load_tile_then_wgmma(true, false); });
  EXPECT_NE(e.find("without a wgmma.fence"), std::string::npos) << e;
}

// wgmma's scale-d: 0 writes D = A B whatever the accumulators held (the
// attention kernels start S so, without zeroing it), 1 adds to them. A is
// fp16 1.0 and the K tile all 1.0, so each score is the 16 products' sum.
TEST(SimtChecks, WgmmaScaleDZeroWritesTheProductOverTheAccumulators) {
  for (const bool accumulate : {false, true}) {
    std::vector<float> got(128 * 32, 0.0f);
    const std::string e = run_one_cta(128, 1024 + 8192, Schedule::kRoundRobin, [&] {
      const int tid = static_cast<int>(threadIdx.x);
      for (int i = tid; i < 64 * 8; i += 128)
        cp_async_16(1024 + panel_swz<64, 64>(i / 8, i % 8), global_tile().data() + (i % 8) * 8, true);
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async_smem();
      __syncthreads();
      float d[8][4];
      for (auto& row : d)
        for (float& x : row) x = accumulate ? 5.0f : std::numeric_limits<float>::quiet_NaN();
      const uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
      wgmma_fence();
      wgmma_m64n64k16<0>(d, a, key_desc<64, 64>(1024, 0), accumulate ? 1 : 0);
      wgmma_commit();
      wgmma_wait<0>();
      for (int j = 0; j < 8; ++j)
        for (int k = 0; k < 4; ++k) got[static_cast<size_t>(tid * 32 + j * 4 + k)] = d[j][k];
    });
    ASSERT_EQ(e, "");
    for (float x : got) ASSERT_EQ(x, accumulate ? 21.0f : 16.0f) << "accumulate " << accumulate;
  }
}

// ---- tensor copies (TMA) and mbarriers ----

// 64 rows of 128 channels, element (r, c) = r * 128 + c
std::vector<uint16_t>& patterned_rows() {
  static std::vector<uint16_t> g = [] {
    std::vector<uint16_t> v(64 * 128);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i);
    return v;
  }();
  return g;
}

// the rows as a 3-d tensor [2 "pages"][32 rows][128 channels], boxes of 64 channels x `box_rows` rows
CUtensorMap& patterned_map(uint32_t box_rows) {
  static CUtensorMap map;
  const CUresult e = encode_fp16_pool_map(simt::tensor_map_encode_tiled, &map, patterned_rows().data(), 2,
                                          32 * 128 * 2, 128, 16, static_cast<int32_t>(box_rows));
  EXPECT_EQ(e, CUDA_SUCCESS);
  return map;
}

std::string run_tma_cta(unsigned threads, size_t smem, Schedule schedule, const std::function<void()>& body) {
  return run_one_cta(threads, smem, schedule, body, patterned_rows());
}

constexpr uint32_t kBar = 16384;  // the mbarrier, after a 16 KiB tile at 0

// thread 0 copies channels 64 .. 127 of rows `row` .. `row` + 31 of page 1 (K rows 0 .. 15 and V rows 16 ..
// 31 of a 16-token page; rows outside 0 .. 31 are zeros) into shared address 0; every thread checks each
// chunk against panel_swz
TEST(SimtTma, ATensorCopyLandsAsTheWgmmaPanelLayoutAndZeroFillsOutside) {
  for (const int32_t row : {0, 16, -8}) {
    std::vector<int> bad(64, 0);
    const std::string e = run_tma_cta(64, kBar + 8, Schedule::kWarpsReversed, [&] {
      const int tid = static_cast<int>(threadIdx.x);
      if (tid == 0) mbarrier_init(kBar, 1);
      __syncthreads();
      if (tid == 0) {
        mbarrier_arrive_expect_tx(kBar, 32 * 128);
        tma_load_3d(0, &patterned_map(32), 64, row, 1, kBar);
      }
      mbarrier_wait(kBar, 0);
      for (int i = tid; i < 32 * 8; i += 64) {
        const int r = i / 8, c = i % 8;
        const uint4 got = ld_shared_16(panel_swz<64, 32>(r, c));
        uint16_t h[8];
        std::memcpy(h, &got, 16);
        const int32_t src = row + r;  // row of page 1
        for (int e = 0; e < 8; ++e) {
          const uint16_t want =
              src >= 0 && src < 32 ? static_cast<uint16_t>((32 + src) * 128 + 64 + 8 * c + e) : uint16_t{0};
          if (h[e] != want) ++bad[static_cast<size_t>(tid)];
        }
      }
    });
    EXPECT_EQ(e, "") << "row " << row;
    int total = 0;
    for (int b : bad) total += b;
    EXPECT_EQ(total, 0) << "row " << row << ": elements not where panel_swz<64, 32> puts them";
  }
}

TEST(SimtTma, ReadBeforeThePhaseCompletesFails) {
  const std::string e = run_tma_cta(32, kBar + 8, Schedule::kRoundRobin, [] {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid == 0) mbarrier_init(kBar, 32);
    __syncthreads();
    if (tid == 0) {
      tma_load_3d(0, &patterned_map(16), 0, 0, 0, kBar);
      ld_shared_16(0);  // no wait: and the phase still waits for the arrivals
    }
    if (tid == 0) mbarrier_arrive_expect_tx(kBar, 16 * 128);
    else mbarrier_arrive(kBar);
    mbarrier_wait(kBar, 0);
  });
  EXPECT_NE(e.find("has not landed"), std::string::npos) << e;
}

TEST(SimtTma, BarrierRulesAreChecked) {
  // used by another thread before a __syncthreads orders the init
  std::string e = run_tma_cta(32, kBar + 8, Schedule::kWarpsReversed, [] {
    if (threadIdx.x == 0) mbarrier_init(kBar, 1);
    if (threadIdx.x == 31) mbarrier_arrive(kBar);
    __syncthreads();
  });
  EXPECT_NE(e.find("no __syncthreads since"), std::string::npos) << e;
  // more bytes than announced
  e = run_tma_cta(32, kBar + 8, Schedule::kRoundRobin, [] {
    if (threadIdx.x == 0) mbarrier_init(kBar, 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(kBar, 8 * 128);
      tma_load_3d(0, &patterned_map(16), 0, 0, 0, kBar);
    }
    mbarrier_wait(kBar, 0);
  });
  EXPECT_NE(e.find("bytes more than expect_tx announced"), std::string::npos) << e;
  // a copy onto the barrier itself
  e = run_tma_cta(32, kBar + 8, Schedule::kRoundRobin, [] {
    if (threadIdx.x == 0) mbarrier_init(kBar - 2048 + 8, 1);
    __syncthreads();
    if (threadIdx.x == 0) tma_load_3d(kBar - 2048, &patterned_map(16), 0, 0, 0, kBar - 2048 + 8);
  });
  EXPECT_NE(e.find("over the mbarrier"), std::string::npos) << e;
  // waiting for a phase nobody completes, and a phase left unfinished at exit
  e = run_tma_cta(64, kBar + 8, Schedule::kRoundRobin, [] {
    if (threadIdx.x == 0) mbarrier_init(kBar, 64);
    __syncthreads();
    if (threadIdx.x < 32) mbarrier_arrive(kBar);
    if (threadIdx.x >= 32) mbarrier_wait(kBar, 0);
  });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("mbarrier at"), std::string::npos) << e;
  e = run_tma_cta(32, kBar + 8, Schedule::kRoundRobin, [] {
    if (threadIdx.x == 0) mbarrier_init(kBar, 64);
    __syncthreads();
    mbarrier_arrive(kBar);
  });
  EXPECT_NE(e.find("unfinished phase"), std::string::npos) << e;
  // parity: the phase before the first has "completed"; the second phase waits for its own arrivals
  e = run_tma_cta(32, kBar + 8, Schedule::kRoundRobin, [] {
    if (threadIdx.x == 0) mbarrier_init(kBar, 32);
    __syncthreads();
    mbarrier_wait(kBar, 1);
    mbarrier_arrive(kBar);
    mbarrier_wait(kBar, 0);
    mbarrier_arrive(kBar);
    mbarrier_wait(kBar, 1);
  });
  EXPECT_EQ(e, "");
}

TEST(SimtTma, TheEncoderRefusesWhatTheDriverRefuses) {
  CUtensorMap map;
  const std::vector<uint16_t>& g = patterned_rows();
  // the pool helper: a page too small for its tokens, head_dim not whole boxes of 64
  EXPECT_EQ(encode_fp16_pool_map(simt::tensor_map_encode_tiled, &map, g.data(), 2, 32 * 128, 128, 16, 16),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(encode_fp16_pool_map(simt::tensor_map_encode_tiled, &map, g.data(), 2, 32 * 128 * 2, 96, 16, 16),
            CUDA_ERROR_INVALID_VALUE);
  const cuuint64_t dims[2] = {128, 64};
  const cuuint64_t strides[1] = {256};
  const cuuint32_t box[2] = {64, 64}, wide[2] = {128, 64}, tall[2] = {64, 512}, ones[2] = {1, 1};
  auto encode = [&](const void* at, const cuuint32_t* b, const cuuint64_t* s) {
    return simt::tensor_map_encode_tiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(at), dims, s, b,
                                         ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  EXPECT_EQ(encode(g.data(), box, strides), CUDA_SUCCESS);
  EXPECT_EQ(encode(g.data() + 1, box, strides), CUDA_ERROR_INVALID_VALUE);  // not 16-byte aligned
  EXPECT_EQ(encode(g.data(), wide, strides), CUDA_ERROR_INVALID_VALUE);     // 256 bytes across a 128-byte swizzle
  EXPECT_EQ(encode(g.data(), tall, strides), CUDA_ERROR_INVALID_VALUE);     // more than 256 rows
  const cuuint64_t odd[1] = {264};
  EXPECT_EQ(encode(g.data(), box, odd), CUDA_ERROR_INVALID_VALUE);  // a stride not a multiple of 16
}

}  // namespace
}  // namespace wm::cuda
