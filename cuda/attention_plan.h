// Planning one step's attention (STYLE.md 6): which sessions, which pages,
// how each session's KV range is split across CTAs, and where partial
// results go. Made once on the host when the batch or a cache changes, then
// every layer's launch runs from it. Pure host code: the kernels read the
// records of kv_layout.h, and tests run the same plan on the CPU.
//
// Split-KV: a 64-token query block is only one query tile per head, 12 CTAs
// for 12 heads, far fewer than the 132 SMs; the planner then cuts each
// session's key tiles into ranges of similar work so that about one wave of
// CTAs runs, and a combine pass merges the partial softmax results.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda/kv_layout.h"
#include "cuda/kv_pages.h"

namespace wm::cuda {

struct PlanInput {
  const KvPages* kv = nullptr;  // the session's cache
  int32_t row0 = 0;             // its rows in q, k, v, out
  int32_t rows = 0;
};

struct PlanTuning {
  int32_t num_sms = 132;
  int32_t block_q = 0;              // 0: auto; 64 (4 warps) or 128 (8 warps)
  int32_t split = -1;               // -1: auto; 1: never; n >= 2: n ranges (at most one per tile)
  int32_t min_tiles_per_split = 4;  // auto splits keep at least this many key tiles per CTA
  // CTAs of a 64- and a 128-query kernel that one SM holds at once: the
  // backend measures them per head_dim (attention_ctas_per_sm); these
  // defaults are head_dim 128's
  int32_t ctas_per_sm_64 = 2, ctas_per_sm_128 = 1;
};

struct AttentionPlan {
  int32_t block_q = 64;
  int32_t layers = 0, heads = 0, head_dim = 0, page_tokens = 0;
  int32_t rows_total = 0;             // rows of q, k, v, out the plan touches
  std::vector<PlanSession> sessions;
  std::vector<int32_t> cached;        // [layers][sessions] cached tokens at plan time
  std::vector<WorkItem> items;
  std::vector<CombineGroup> groups;
  std::vector<int32_t> page_tables;   // per session [layers][heads][pages_per_head], -1 padded
  int32_t partials = 0;

  // byte offsets of the sections in blob()
  struct Layout {
    size_t sessions = 0, cached = 0, items = 0, groups = 0, page_tables = 0, bytes = 0;
  };
  Layout layout() const;
  // everything above as one buffer for one upload
  std::vector<uint8_t> blob() const;
};

// INVALID_ARGUMENT when the sessions' caches differ in geometry or rows are out of range
absl::StatusOr<AttentionPlan> make_attention_plan(const std::vector<PlanInput>& sessions, const PlanTuning& tuning);

}  // namespace wm::cuda
