// One batch of paged attention set up on the host the way the CUDA backend
// lays it out (kv_layout.h): a page pool filled like kv_append.cu does, the
// attention plan, the fp16 [heads][rows][head_dim] inputs, and the CPU fp16
// cache's attention of the same batch as the reference. Used by
// cuda_host_test.cc (the plan run in scalar code) and simt_attention_test.cc
// (the kernels themselves on the host emulator).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/attention_plan.h"
#include "cuda/kv_layout.h"
#include "cuda/kv_pages.h"

namespace wm::cuda {

struct CaseSession {
  int frames_before;  // cached frames when attention runs
  int rows;           // queries (= own block keys)
};

struct PagedAttentionCase {
  PagedGeometry geometry;
  AttentionPlan plan;
  int64_t page_elems = 0;
  std::vector<uint16_t> pool;           // NaN bits wherever nothing was appended
  std::vector<uint16_t> q16, k16, v16;  // [heads][rows_total][head_dim]
  std::vector<std::vector<float>> cpu;  // per layer: the CPU fp16 cache's output [rows_total][heads][head_dim]
};

// random K/V for `frames_before` frames per session, random q, k, v of the
// block (q scaled by q_scale: larger is a sharper softmax)
PagedAttentionCase make_paged_attention_case(const PagedGeometry& g, const std::vector<CaseSession>& sessions,
                                             const PlanTuning& tuning, float q_scale, uint32_t seed = 11);

// what attention.cu + attention_combine.cu compute, in scalar code with the
// same tile walk and online softmax; p_fp16 rounds probabilities like the
// tensor-core path does before P V. Output [rows_total][heads][head_dim].
std::vector<float> host_attention(const PagedAttentionCase& c, int32_t layer, bool p_fp16);

}  // namespace wm::cuda
