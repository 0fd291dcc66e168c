// QuantWM-2's query statistics on the device: the Gram matrix of one
// attention call's query rows per (session, head), G = sum q q^T over its
// finite rows, in double, each entry summed over the rows in order from
// zero: what quant/query_stats.cc's QueryStats::add computes on the host,
// bit for bit (a product of two floats is exact in double, so fusing it
// with the add changes nothing). The backend downloads these (the lower
// triangle, 66 KB per head of 128 channels) instead of the query rows and
// adds them to the session's statistics (QueryStats::add_gram).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace wm::cuda {

struct QueryGramJob {
  const float* q = nullptr;  // device: the first row of this head; rows `row_stride` floats apart
  int32_t rows = 0;
  int32_t row_stride = 0;
  int64_t out = 0;           // offset in `out` (doubles): [head_dim * (head_dim + 1) / 2] lower triangle, then the count
  int64_t flags = 0;         // offset in `flags` (bytes): [rows] scratch
};

struct QueryGramArgs {
  const QueryGramJob* jobs = nullptr;  // device [n_jobs]
  int32_t n_jobs = 0;
  int32_t head_dim = 0;
  double* out = nullptr;               // device
  uint8_t* flags = nullptr;            // device
};

// the lower triangle's entries, then one for the count
inline int64_t query_gram_doubles(int32_t head_dim) { return static_cast<int64_t>(head_dim) * (head_dim + 1) / 2 + 1; }

cudaError_t launch_query_gram(const QueryGramArgs& a, cudaStream_t stream);

}  // namespace wm::cuda
