// Fidelity probes (docs/QUANT.md): for sampled (head, query) pairs of one
// attention call, full-precision vs quantized attention over the same
// history -- top-1 token selection mismatch ("drift"), top-k overlap, logit
// RMSE and attention-output relative error -- accumulated into DriftStats.
// Used by the tests, by wmquant, and by the audited cache (kv_audit.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "quant/kv_cache.h"

namespace wm {

// up to `per_head` distinct queries of every head, a pure function of the arguments
std::vector<ProbeQuery> probe_sample(int n, int heads, int per_head, uint64_t seed);

// q, k_cur, v_cur: [n, heads, head_dim], the current block (the same for both);
// ref_k, ref_v: [m, heads, head_dim], the cached history at full precision;
// quant_k, quant_v: [m, heads, head_dim], the quantized cache's reconstruction.
// Logits are q.k / sqrt(head_dim), computed in double; top-1 and top-k are
// over the m cached tokens (smallest index on ties); the output is attention
// over history plus the current block. A sample whose reference logits are
// not finite is skipped; with m == 0 nothing is counted.
void probe_attention(const float* q, const float* k_cur, const float* v_cur, int n, int heads, int head_dim,
                     const float* ref_k, const float* ref_v, const float* quant_k, const float* quant_v, int m,
                     std::span<const ProbeQuery> samples, int topk, DriftStats* stats);

// the same with the history read from two caches' reconstruct(layer); false
// (nothing counted) when the caches do not hold the same frames
bool probe_caches(const KvCache& reference, const KvCache& candidate, int layer, const float* q, const float* k_cur,
                  const float* v_cur, int n, std::span<const ProbeQuery> samples, int topk, DriftStats* stats);

// the same statistics from a device pair's ranks (KvCache::probe_against)
// for `samples` samples; false (nothing counted) when the arrays are not of
// that many. A sample whose reference logits or output are not finite is
// skipped
bool probe_ranks_stats(const ProbeRanks& ranks, size_t samples, int head_dim, DriftStats* stats);

}  // namespace wm
