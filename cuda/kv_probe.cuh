// Audit mode's drift probes on the device (docs/QUANT.md, "Audit mode";
// docs/CUDA.md): for the few (head, query) pairs an audited attention call
// samples, the logits of each query against every cached token of the
// layer in a cache, decoded as the attention kernel decodes them (the
// format's load_tile), and its attention output over the cache and the
// block's own keys (launch_kv_probe, once per cache); then, for a
// reference cache and a candidate, each sample's top-k tokens in both, the
// sum of squared logit differences and whether the reference's logits are
// finite (launch_probe_rank). Only those per-sample results leave the
// device, where the probes used to download both caches' layer and decode
// it on the host.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "cuda/kv_layout.h"

namespace wm::cuda {

// the most tokens a probe ranks per sample
inline constexpr int kProbeMaxTopK = 16;

struct ProbeArgs {
  const float* q = nullptr;      // [n][heads][head_dim], the call's queries (fp32)
  const float* k_cur = nullptr;  // [n][heads][head_dim], the block's own keys and values
  const float* v_cur = nullptr;
  int32_t n = 0, heads = 0;
  const int32_t* samples = nullptr;  // [n_samples][2]: head, query
  int32_t n_samples = 0;
  const int32_t* page_rows = nullptr;  // [heads][pages_per_head]: the layer's page-table rows
  int32_t pages_per_head = 0;
  const int32_t* slot_rank = nullptr;  // [cached / tokens_per_frame]: each slot's frame among the cached, ascending
  int32_t tokens_per_frame = 0;
  int32_t cached = 0;  // the layer's cached tokens (logical order: slot x tokens_per_frame + token)
  float scale = 0.0f;  // 1 / sqrt(head_dim)
  float* logits = nullptr;   // [n_samples][cached], in frame order
  float* partial = nullptr;  // [n_samples][probe_tiles][head_dim + 2]: max, sum, unnormalised output
  float* out = nullptr;      // [n_samples][head_dim]
};

// tiles of kTileKeys keys a probe covers: the cache's, then the block's
WM_HD_INLINE int32_t probe_tiles(int32_t cached, int32_t n) { return block_tiles(cached) + block_tiles(n); }

// both kernels: the tiles (grid tiles x heads), then one CTA per sample
// combining its tiles' partials into out. head_dim 32, 64 or 128
cudaError_t launch_kv_probe(const ProbeArgs& a, const PagedKvFp16View& kv, int32_t head_dim, cudaStream_t stream);
cudaError_t launch_kv_probe(const ProbeArgs& a, const PagedKvKiviView& kv, int32_t head_dim, cudaStream_t stream);
cudaError_t launch_kv_probe(const ProbeArgs& a, const PagedKvSpanView& kv, int32_t head_dim, cudaStream_t stream);

// per sample (one CTA each), of two caches' logits [n_samples][tokens] in
// frame order: the k largest of each (descending, the earlier token first
// on ties, NaN below everything), sum over tokens of (cand - ref)^2 (terms
// that are not finite left out) and the number of reference logits that
// are not finite
struct RankArgs {
  const float* ref = nullptr;
  const float* cand = nullptr;
  int32_t n_samples = 0, tokens = 0, k = 0;  // 1 <= k <= min(tokens, kProbeMaxTopK)
  int32_t* ref_top = nullptr;   // [n_samples][k]
  int32_t* cand_top = nullptr;  // [n_samples][k]
  double* sq_err = nullptr;     // [n_samples]
  int32_t* ref_nonfinite = nullptr;  // [n_samples]
};
cudaError_t launch_probe_rank(const RankArgs& a, cudaStream_t stream);

}  // namespace wm::cuda
