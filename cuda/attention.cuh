// Fused attention over a paged KV cache plus each session's own block
// (docs/CUDA.md, "Attention kernel"): one CTA per (work item, head) of an
// AttentionPlan, 16 query rows per warp on fp16 tensor cores (mma.sync
// m16n8k16, fp32 accumulate), key tiles of 64 double-buffered with cp.async,
// online softmax in registers. Block-causal: every query of a block sees the
// whole cache and its whole own block, nothing else.
#pragma once

#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>

#include "cuda/kv_layout.h"

namespace wm::cuda {

struct AttentionArgs {
  const uint16_t* q16 = nullptr;      // [heads][rows_total][head_dim] fp16 (attention_inputs.cuh)
  const uint16_t* k16 = nullptr;      // own-block keys, same layout
  const uint16_t* v16 = nullptr;
  float* out = nullptr;               // [rows_total][heads][head_dim] fp32
  // out rounded to bf16 in the same layout, the operand of the linear that
  // reads out next (the output projection), or null
  uint16_t* out16 = nullptr;
  float* partial_o = nullptr;         // [partials][heads][block_q][head_dim], unnormalised
  float* partial_ml = nullptr;        // [partials][heads][block_q][2]: running max (log2 units), sum
  const PlanSession* sessions = nullptr;
  const int32_t* cached = nullptr;    // [sessions]: this layer's row of AttentionPlan::cached
  const WorkItem* items = nullptr;
  const CombineGroup* groups = nullptr;
  int32_t rows_total = 0, heads = 0, layer = 0, block_q = 64;
  float scale_log2 = 0;               // log2(e) / sqrt(head_dim)
  // the overlapped kernel with two warpgroups: warpgroup 1 issues each
  // tile's MMAs after warpgroup 0 has issued its own ("attention.pingpong")
  int32_t pingpong = 0;
  // the warp-specialised kernel's TMA build (attention_ws.cuh): the buffer
  // that holds k16 and v16 as a tensor of head_dim-wide rows
  // (tensor_map.h: encode_rows_map, device memory), or null; k16[0] and
  // v16[0] are its rows k_map_row and v_map_row
  const void* block_map = nullptr;
  int64_t k_map_row = 0, v_map_row = 0;
  // the warp-specialised kernel with half of its work taken out, for
  // benchmarks only ("attention.ws_ablate"; the outputs are then wrong):
  // kWsLoadsOnly, kWsComputeOnly (attention_ws.cuh)
  int32_t ws_ablate = 0;
};

// AttentionArgs::ws_ablate: the loads alone (the consumers release each step
// as soon as it has landed, computing nothing), or the consumers alone (the
// producer fills each stage once, so every step past the ring's first
// computes on the tiles already there)
inline constexpr int32_t kWsLoadsOnly = 1, kWsComputeOnly = 2;

// raises the kernels' shared-memory limits; once per device before the first launch
cudaError_t attention_prepare();
// CTAs of the fp16 kernel for (head_dim, block_q) that one SM holds at once,
// from the runtime's occupancy calculator (after attention_prepare); 0 if unknown
int32_t attention_ctas_per_sm(int32_t head_dim, int32_t block_q);
// grid (items, heads); head_dim 32, 64 or 128, block_q 64 or 128
cudaError_t launch_attention(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                             cudaStream_t stream);
// the same kernel over KIVI-2 pages (kv_format_kivi.cuh): decodes the
// window's chunks into its fp16 tiles
cudaError_t launch_attention_kivi(const AttentionArgs& a, const PagedKvKiviView& kv, int32_t head_dim, int32_t items,
                                  cudaStream_t stream);
// and over QVG-2 / QuantWM-2 pages (kv_format_span.cuh, attention_span.cu):
// decodes the window's per-token codes into its fp16 tiles
cudaError_t attention_span_prepare();
cudaError_t launch_attention_span(const AttentionArgs& a, const PagedKvSpanView& kv, int32_t head_dim, int32_t items,
                                  cudaStream_t stream);


// The Hopper kernels (attention_sm90.cu, built for sm_90a only, so they run
// on compute capability 9.0 and nothing else): same arguments, plan and
// results, wgmma instead of mma.sync. stages 0: the plain kernel
// (head_dim 128); 3..5: the variant that overlaps each tile's softmax with
// the tensor cores, with that many K/V stages in shared memory (head_dim 64
// or 128).
bool attention_sm90_supports(int32_t head_dim, int32_t stages);
// "attention.stages": 0 (the default) or 3..6; the overlapped kernels run
// 3..5 (6 runs 5), the warp-specialised one attention_sm90_ws_stages
bool attention_sm90_stages_valid(int32_t stages);
int32_t attention_sm90_overlap_stages(int32_t stages);
// what the overlapped kernels' launches take: 0 (the plain kernel) or 3..5
bool attention_sm90_overlap_launch_valid(int32_t stages);
cudaError_t attention_sm90_prepare();
int32_t attention_sm90_ctas_per_sm(int32_t head_dim, int32_t block_q, int32_t stages);
cudaError_t launch_attention_sm90(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                                  int32_t stages, cudaStream_t stream);
// the same kernels over KIVI-2 pages (kv_format_kivi.cuh)
cudaError_t launch_attention_sm90_kivi(const AttentionArgs& a, const PagedKvKiviView& kv, int32_t head_dim,
                                       int32_t items, int32_t stages, cudaStream_t stream);
// and over span pages (kv_format_span.cuh, attention_sm90_span.cu)
cudaError_t attention_sm90_span_prepare();
cudaError_t launch_attention_sm90_span(const AttentionArgs& a, const PagedKvSpanView& kv, int32_t head_dim,
                                       int32_t items, int32_t stages, cudaStream_t stream);
// the warp-specialised variant (attention_ws.cuh): a producer loads, the
// warpgroups synchronise through named barriers; head_dim 64 or 128; 64 keys
// a step with 3 or 4 stages (5 and 6 run 4) or, with tma, 3 to 6, or 128 keys a
// step with 3. tma: whole key tiles by tensor copies, where kv.tensor_map is
// set (without one the cp.async build runs)
bool attention_sm90_ws_keys_valid(int32_t keys);  // 64 or 128
int32_t attention_sm90_ws_stages(int32_t stages, int32_t keys, bool tma);  // the stages that run
int32_t attention_sm90_ws_ctas_per_sm(int32_t head_dim, int32_t block_q, int32_t stages, int32_t keys,
                                      bool tma = false);
cudaError_t launch_attention_sm90_ws(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim,
                                     int32_t items, int32_t stages, int32_t keys, bool tma, cudaStream_t stream);

}  // namespace wm::cuda
