// QuantWM-2's query statistics on the device: per (session, layer, head)
// the running Gram matrix of the queries attended, G = sum q q^T over the
// finite rows of every call so far, and their count, in double, in the
// session's own pool pages. Each call adds its rows' Gram matrix, each entry
// summed over the rows in order from zero, to the running sums: what
// quant/query_stats.cc's QueryStats::add computes on the host, bit for bit
// (a product of two floats is exact in double, so fusing it with the add
// changes nothing, and the calls of one stream add in call order). The
// coder's QSAC weights are made from them on the device (below); the host
// reads a layer's sums only where its bookkeeping needs them: until the
// layer has seen a query, and for a new PSAC basis (QueryStats::set_gram).
//
// Nothing here is uploaded per call: the jobs depend on the batch only (the
// query rows are offsets from the launch's q, the layer is an argument),
// so the denoising passes of a step can be recorded in a CUDA graph and
// replayed, each replay adding its queries.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wm::cuda {

struct QueryGramJob {
  int64_t q = 0;               // floats from QueryGramArgs::q to this head's first row; rows `row_stride` apart
  int32_t rows = 0;
  int32_t row_stride = 0;
  const int32_t* pages = nullptr;  // device: the session's statistics pages (pool page indices)
  int64_t sums = 0;            // the session's doubles before layer 0's sums of this head (query_gram_doubles each)
  int64_t flags = 0;           // offset in `flags` (bytes): [rows] scratch
};

struct QueryGramArgs {
  const QueryGramJob* jobs = nullptr;  // device [n_jobs]
  int32_t n_jobs = 0;
  int32_t head_dim = 0;
  int32_t layer = 0;
  int64_t layer_doubles = 0;           // doubles from one layer's sums to the next's (heads x query_gram_doubles)
  const float* q = nullptr;            // device
  uint8_t* pool = nullptr;             // device: the page pool
  int64_t page_bytes = 0;
  uint8_t* flags = nullptr;            // device
};

// QSAC's channel weights of a (session, layer, head) from its running
// sums, where an append codes its keys: quant/qsac_ops.h, QueryStats::channel_weights'
// arithmetic in double (w_c = max(floor, G_cc / count / mean_c(G_cc /
// count))), so the weights are the host's bit for bit, but made on the
// device in stream order, after the write pass's own queries were added,
// and the host need not wait for them. [head_dim] weights, then a flag:
// 1 if they hold, 0 if no finite query was seen (the coder then weighs
// every channel alike, as the CPU's does)
struct QsacWeightsJob {
  int64_t out = 0;    // floats from QsacWeightsArgs::out to the job's head_dim + 1
  int64_t pages = 0;  // int32s from QsacWeightsArgs::pages to the session's statistics pages
  int64_t sums = 0;   // the session's doubles before this (layer, head)'s sums
  float floor = 0.0f; // the session's KvFormatOptions::qsac_weight_floor
};

struct QsacWeightsArgs {
  const QsacWeightsJob* jobs = nullptr;  // device [n_jobs]
  int32_t n_jobs = 0;
  int32_t head_dim = 0;
  const int32_t* pages = nullptr;       // device
  const uint8_t* pool = nullptr;        // device: the page pool
  int64_t page_bytes = 0;
  float* out = nullptr;                 // device
};

// one (layer, head)'s sums: the lower triangle's entries, entry (x, y) at
// x (x + 1) / 2 + y, then one for the count of rows
inline int64_t query_gram_doubles(int32_t head_dim) { return static_cast<int64_t>(head_dim) * (head_dim + 1) / 2 + 1; }

// the pool pages a session's sums take: every layer and head
inline int64_t query_gram_pages(int32_t layers, int32_t heads, int32_t head_dim, int64_t page_bytes) {
  const int64_t bytes = static_cast<int64_t>(layers) * heads * query_gram_doubles(head_dim) * 8;
  return (bytes + page_bytes - 1) / page_bytes;
}

cudaError_t launch_query_gram(const QueryGramArgs& a, cudaStream_t stream);
cudaError_t launch_qsac_weights(const QsacWeightsArgs& a, cudaStream_t stream);

}  // namespace wm::cuda
