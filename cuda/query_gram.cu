#include <cfloat>

#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/query_gram.cuh"
#include "quant/qsac_ops.h"

namespace wm::cuda {
namespace {

// the running sum `e` of a job's (layer, head) in the session's pages
__device__ inline double* gram_sum(const QueryGramArgs& a, const QueryGramJob& J, int64_t e) {
  const int64_t i = J.sums + static_cast<int64_t>(a.layer) * a.layer_doubles + e;
  const int64_t per_page = a.page_bytes / 8;
  return reinterpret_cast<double*>(a.pool + static_cast<int64_t>(J.pages[i / per_page]) * a.page_bytes) +
         i % per_page;
}

// which rows enter (every value finite), and their count: one CTA per job
__global__ void query_gram_rows_kernel(const QueryGramArgs a) {
  const QueryGramJob& J = a.jobs[blockIdx.x];
  uint8_t* flags = a.flags + J.flags;
  const float* q = a.q + J.q;
  for (int32_t i = threadIdx.x; i < J.rows; i += blockDim.x) {
    const float* r = q + static_cast<int64_t>(i) * J.row_stride;
    bool finite = true;
    for (int32_t c = 0; c < a.head_dim; ++c) finite = finite && fabsf(r[c]) <= FLT_MAX;
    flags[i] = finite ? 1 : 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t n = 0;
    for (int32_t i = 0; i < J.rows; ++i) n += flags[i];
    *gram_sum(a, J, static_cast<int64_t>(a.head_dim) * (a.head_dim + 1) / 2) += static_cast<double>(n);  // after the triangle
  }
}

// one thread per lower-triangle entry (x, y), y <= x: this call's sum over
// its rows in order, from zero, then added to the running sum
__global__ void query_gram_kernel(const QueryGramArgs a) {
  const QueryGramJob& J = a.jobs[blockIdx.y];
  const int32_t D = a.head_dim;
  const int64_t entries = static_cast<int64_t>(D) * (D + 1) / 2;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= entries) return;
  // e = x (x + 1) / 2 + y
  int32_t x = static_cast<int32_t>((sqrt(8.0 * static_cast<double>(e) + 1.0) - 1.0) / 2.0);
  while (static_cast<int64_t>(x) * (x + 1) / 2 > e) --x;
  while (static_cast<int64_t>(x + 1) * (x + 2) / 2 <= e) ++x;
  const int32_t y = static_cast<int32_t>(e - static_cast<int64_t>(x) * (x + 1) / 2);
  const uint8_t* flags = a.flags + J.flags;
  const float* q = a.q + J.q;
  double s = 0;
  for (int32_t i = 0; i < J.rows; ++i) {
    if (flags[i] == 0) continue;
    const float* r = q + static_cast<int64_t>(i) * J.row_stride;
    s += static_cast<double>(r[x]) * static_cast<double>(r[y]);
  }
  *gram_sum(a, J, e) += s;
}

// the span coder's widest head (device_span_support)
constexpr int32_t kQsacMaxHeadDim = 128;

// one thread per job: its diagonal from the pages, then the host's arithmetic (quant/qsac_ops.h)
__global__ void qsac_weights_kernel(const QsacWeightsArgs a) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.n_jobs) return;
  const QsacWeightsJob& J = a.jobs[j];
  const int32_t D = a.head_dim;
  const int64_t per_page = a.page_bytes / 8;
  const auto sum = [&](int64_t e) {
    const int64_t i = J.sums + e;
    return reinterpret_cast<const double*>(a.pool + static_cast<int64_t>(a.pages[J.pages + i / per_page]) *
                                                        a.page_bytes)[i % per_page];
  };
  float* w = a.out + J.out;
  double diag[kQsacMaxHeadDim];
  for (int32_t c = 0; c < D; ++c) diag[c] = sum(static_cast<int64_t>(c) * (c + 1) / 2 + c);
  w[D] = qsac_ops::channel_weights(diag, sum(static_cast<int64_t>(D) * (D + 1) / 2), D, J.floor, w) ? 1.0f : 0.0f;
}

}  // namespace

cudaError_t launch_qsac_weights(const QsacWeightsArgs& a, cudaStream_t stream) {
  if (a.n_jobs <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > kQsacMaxHeadDim || a.page_bytes < 8 || a.page_bytes % 8 != 0)
    return cudaErrorInvalidValue;
  return launch_kernel(qsac_weights_kernel, dim3(static_cast<unsigned>((a.n_jobs + kThreads - 1) / kThreads)), kThreads,
                       0, stream, a);
}

cudaError_t launch_query_gram(const QueryGramArgs& a, cudaStream_t stream) {
  if (a.n_jobs <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > 1024 || a.n_jobs > 65535 || a.layer < 0 || a.page_bytes < 8 ||
      a.page_bytes % 8 != 0)
    return cudaErrorInvalidValue;
  if (const cudaError_t e = launch_kernel(query_gram_rows_kernel, dim3(static_cast<unsigned>(a.n_jobs)), kThreads, 0,
                                          stream, a);
      e != cudaSuccess)
    return e;
  const int64_t entries = static_cast<int64_t>(a.head_dim) * (a.head_dim + 1) / 2;
  return launch_kernel(query_gram_kernel,
                       dim3(static_cast<unsigned>((entries + kThreads - 1) / kThreads), static_cast<unsigned>(a.n_jobs)),
                       kThreads, 0, stream, a);
}

}  // namespace wm::cuda
