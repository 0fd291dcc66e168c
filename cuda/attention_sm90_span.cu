// The Hopper attention kernels (attention_sm90.cu) over QVG-2 / QuantWM-2
// pages (kv_format_span.cuh): the plain kernel (head_dim 128) and the
// overlapped one (64, 128), compiled for sm_90a only.
#include "cuda/attention_launch.cuh"
#include "cuda/attention_sm90.cuh"
#include "cuda/kv_format_span.cuh"

namespace wm::cuda {
namespace {

using SpanKernels = AttentionKernels<PlainAttention<WgMma, SpanPageFormat>, 128>;
template <int S>
using SpanOverlapKernels = AttentionKernels<OverlapAttention<S, SpanPageFormat>, 64, 128>;

template <class F>
auto with_span_stages(int32_t stages, F&& f) {
  switch (stages) {
    case 4:
      return f(SpanOverlapKernels<4>{});
    case 5:
      return f(SpanOverlapKernels<5>{});
    default:
      return f(SpanOverlapKernels<3>{});
  }
}

}  // namespace

cudaError_t attention_sm90_span_prepare() {
  cudaError_t e = SpanKernels::prepare();
  for (int32_t s = 3; s <= 5 && e == cudaSuccess; ++s) e = with_span_stages(s, [](auto k) { return k.prepare(); });
  return e;
}

cudaError_t launch_attention_sm90_span(const AttentionArgs& a, const PagedKvSpanView& kv, int32_t head_dim,
                                       int32_t items, int32_t stages, cudaStream_t stream) {
  if (!attention_sm90_supports(head_dim, stages) || !attention_sm90_overlap_launch_valid(stages))
    return cudaErrorInvalidValue;
  if (stages == 0) return SpanKernels::launch(a, kv, head_dim, items, stream);
  return with_span_stages(stages, [&](auto k) { return k.launch(a, kv, head_dim, items, stream); });
}

}  // namespace wm::cuda
