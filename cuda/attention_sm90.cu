// The Hopper attention kernels (attention_sm90.cuh), compiled for sm_90a
// only: their instantiations and host entry points (attention.cuh).
#include "cuda/attention_launch.cuh"
#include "cuda/attention_sm90.cuh"
#include "cuda/attention_ws.cuh"
#include "cuda/kv_format_kivi.cuh"

namespace wm::cuda {
namespace {

using Kernels = AttentionKernels<PlainAttention<WgMma>, 128>;
template <int S>
using OverlapKernels = AttentionKernels<OverlapAttention<S>, 64, 128>;
template <int S, int TPS = 1, bool TMA = false>
using WsKernels = AttentionKernels<WsAttention<S, TPS, TMA>, 64, 128>;
// KIVI-2 caches: the plain and the overlapped kernel decoding their tiles
using KiviKernels = AttentionKernels<PlainAttention<WgMma, KiviPageFormat>, 128>;
template <int S>
using KiviOverlapKernels = AttentionKernels<OverlapAttention<S, KiviPageFormat>, 64, 128>;

// f(WsKernels<...>) for a stage count and keys per step (attention_sm90_ws_stages):
// 64 keys with 3 or 4 stages by cp.async (its named barriers; 5 and 6 run 4) and
// 3 to 6 by TMA, 128 keys with 3 (the shared memory of 4 steps of 128 keys does
// not fit at head_dim 128)
template <class F>
auto with_ws(int32_t stages, int32_t keys, bool tma, F&& f) {
  const int32_t s = attention_sm90_ws_stages(stages, keys, tma);
  if (tma) {
    if (keys == 128) return f(WsKernels<3, 2, true>{});
    switch (s) {
      case 3:
        return f(WsKernels<3, 1, true>{});
      case 5:
        return f(WsKernels<5, 1, true>{});
      case 6:
        return f(WsKernels<6, 1, true>{});
      default:
        return f(WsKernels<4, 1, true>{});
    }
  }
  if (keys == 128) return f(WsKernels<3, 2>{});
  return s == 3 ? f(WsKernels<3>{}) : f(WsKernels<4>{});
}

// f(Family<S>) for the S of `stages` (3..5): OverlapKernels or KiviOverlapKernels
template <template <int> class Family = OverlapKernels, class F>
auto with_stages(int32_t stages, F&& f) {
  switch (stages) {
    case 4:
      return f(Family<4>{});
    case 5:
      return f(Family<5>{});
    default:
      return f(Family<3>{});
  }
}

}  // namespace

// the plain kernel computes wrong results at head_dim 64 on the H200 (it
// passes the emulator; docs/CUDA.md): it is built for head_dim 128 only
bool attention_sm90_supports(int32_t head_dim, int32_t stages) {
  return head_dim == 128 || (head_dim == 64 && stages != 0);
}

bool attention_sm90_stages_valid(int32_t stages) { return stages == 0 || (stages >= 3 && stages <= 6); }

int32_t attention_sm90_overlap_stages(int32_t stages) { return stages < 5 ? stages : 5; }

bool attention_sm90_overlap_launch_valid(int32_t stages) { return stages == 0 || (stages >= 3 && stages <= 5); }

bool attention_sm90_ws_keys_valid(int32_t keys) { return keys == 64 || keys == 128; }

int32_t attention_sm90_ws_stages(int32_t stages, int32_t keys, bool tma) {
  if (keys == 128 || stages <= 3) return 3;
  return tma ? (stages < 6 ? stages : 6) : 4;
}

cudaError_t attention_sm90_prepare() {
  cudaError_t e = Kernels::prepare();
  for (int32_t s = 3; s <= 5 && e == cudaSuccess; ++s) e = with_stages(s, [](auto k) { return k.prepare(); });
  if (e == cudaSuccess) e = KiviKernels::prepare();
  for (int32_t s = 3; s <= 5 && e == cudaSuccess; ++s)
    e = with_stages<KiviOverlapKernels>(s, [](auto k) { return k.prepare(); });
  if (e == cudaSuccess) e = WsKernels<3>::prepare();
  if (e == cudaSuccess) e = WsKernels<4>::prepare();
  if (e == cudaSuccess) e = WsKernels<3, 2>::prepare();
  if (e == cudaSuccess) e = WsKernels<3, 1, true>::prepare();
  if (e == cudaSuccess) e = WsKernels<4, 1, true>::prepare();
  // the TMA build's deeper rings are optional: where one does not fit, its occupancy is 0 and the
  // backend runs the deepest that does (6 stages of 64 keys take 224 KiB at head_dim 128)
  if (e == cudaSuccess && WsKernels<5, 1, true>::prepare() != cudaSuccess) cudaGetLastError();
  if (e == cudaSuccess && WsKernels<6, 1, true>::prepare() != cudaSuccess) cudaGetLastError();
  if (e == cudaSuccess) e = WsKernels<3, 2, true>::prepare();
  return e;
}

int32_t attention_sm90_ws_ctas_per_sm(int32_t head_dim, int32_t block_q, int32_t stages, int32_t keys, bool tma) {
  return with_ws(stages, keys, tma, [&](auto k) { return k.ctas_per_sm(head_dim, block_q); });
}

cudaError_t launch_attention_sm90_ws(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim,
                                     int32_t items, int32_t stages, int32_t keys, bool tma, cudaStream_t stream) {
  if ((head_dim != 64 && head_dim != 128) || !attention_sm90_ws_keys_valid(keys)) return cudaErrorInvalidValue;
  const bool by_tma = tma && kv.tensor_map != nullptr;
  return with_ws(stages, keys, by_tma, [&](auto k) { return k.launch(a, kv, head_dim, items, stream); });
}

int32_t attention_sm90_ctas_per_sm(int32_t head_dim, int32_t block_q, int32_t stages) {
  if (stages == 0) return Kernels::ctas_per_sm(head_dim, block_q);
  return with_stages(stages, [&](auto k) { return k.ctas_per_sm(head_dim, block_q); });
}

cudaError_t launch_attention_sm90(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                                  int32_t stages, cudaStream_t stream) {
  if (!attention_sm90_supports(head_dim, stages) || !attention_sm90_overlap_launch_valid(stages))
    return cudaErrorInvalidValue;
  if (stages == 0) return Kernels::launch(a, kv, head_dim, items, stream);
  return with_stages(stages, [&](auto k) { return k.launch(a, kv, head_dim, items, stream); });
}

cudaError_t launch_attention_sm90_kivi(const AttentionArgs& a, const PagedKvKiviView& kv, int32_t head_dim,
                                       int32_t items, int32_t stages, cudaStream_t stream) {
  if (!attention_sm90_supports(head_dim, stages) || !attention_sm90_overlap_launch_valid(stages))
    return cudaErrorInvalidValue;
  if (stages == 0) return KiviKernels::launch(a, kv, head_dim, items, stream);
  return with_stages<KiviOverlapKernels>(stages, [&](auto k) { return k.launch(a, kv, head_dim, items, stream); });
}

}  // namespace wm::cuda
