// The mma.sync attention kernel (attention.cu) over QVG-2 / QuantWM-2 pages
// (kv_format_span.cuh), for head_dim 32, 64 and 128: a unit of its own so
// that the format's instantiations compile beside the others.
#include "cuda/attention_kernel.cuh"
#include "cuda/attention_launch.cuh"
#include "cuda/kv_format_span.cuh"
#include "cuda/sync_mma.cuh"

namespace wm::cuda {
namespace {

using SpanKernels = AttentionKernels<PlainAttention<SyncMma, SpanPageFormat>, 32, 64, 128>;

}  // namespace

cudaError_t attention_span_prepare() { return SpanKernels::prepare(); }

cudaError_t launch_attention_span(const AttentionArgs& a, const PagedKvSpanView& kv, int32_t head_dim, int32_t items,
                                  cudaStream_t stream) {
  return SpanKernels::launch(a, kv, head_dim, items, stream);
}

}  // namespace wm::cuda
