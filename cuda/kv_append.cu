#include "cuda/device_util.cuh"
#include "cuda/kv_append.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

__device__ __forceinline__ uint4 to_half8(const float* src) {
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  uint4 o;
  o.x = f16_bits(a.x) | (static_cast<uint32_t>(f16_bits(a.y)) << 16);
  o.y = f16_bits(a.z) | (static_cast<uint32_t>(f16_bits(a.w)) << 16);
  o.z = f16_bits(b.x) | (static_cast<uint32_t>(f16_bits(b.y)) << 16);
  o.w = f16_bits(b.z) | (static_cast<uint32_t>(f16_bits(b.w)) << 16);
  return o;
}

// one thread per 8 channels of one (write, token, head)
__global__ void kv_append_kernel(const KvAppendArgs a, int64_t total) {
  // 32-bit index math (the launcher checks total < 2^31): 64-bit division is slow on the GPU
  const uint32_t chunks = static_cast<uint32_t>(a.head_dim / 8);
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < static_cast<uint32_t>(total);
       e += gridDim.x * blockDim.x) {
    uint32_t rest = e / chunks;
    const int32_t c = static_cast<int32_t>(e - rest * chunks);
    const uint32_t r2 = rest / static_cast<uint32_t>(a.heads);
    const int32_t h = static_cast<int32_t>(rest - r2 * static_cast<uint32_t>(a.heads));
    const uint32_t w = r2 / static_cast<uint32_t>(a.tokens_per_frame);
    const int32_t t = static_cast<int32_t>(r2 - w * static_cast<uint32_t>(a.tokens_per_frame));
    const KvFrameWrite fw = a.writes[w];
    const int64_t src =
        ((static_cast<int64_t>(fw.src_frame) * a.tokens_per_frame + t) * a.heads + h) * a.head_dim + c * 8;
    const int64_t logical = static_cast<int64_t>(fw.slot) * a.tokens_per_frame + t;
    const int32_t page =
        a.page_tables[fw.table + static_cast<int64_t>(h) * fw.pages_per_head + logical / a.page_tokens];
    const int32_t row = static_cast<int32_t>(logical % a.page_tokens);
    const int64_t dk = static_cast<int64_t>(page) * a.page_elems + static_cast<int64_t>(row) * a.head_dim + c * 8;
    const int64_t dv = dk + static_cast<int64_t>(a.page_tokens) * a.head_dim;
    reinterpret_cast<uint4*>(a.pool + dk)[0] = to_half8(a.k + src);
    reinterpret_cast<uint4*>(a.pool + dv)[0] = to_half8(a.v + src);
  }
}

}  // namespace

cudaError_t launch_kv_append(const KvAppendArgs& a, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(a.n_writes) * a.tokens_per_frame * a.heads * (a.head_dim / 8);
  if (total <= 0) return cudaSuccess;
  if (total >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  if (a.head_dim % 8 != 0 || (reinterpret_cast<uintptr_t>(a.k) & 15u) != 0 ||
      (reinterpret_cast<uintptr_t>(a.v) & 15u) != 0)
    return cudaErrorMisalignedAddress;
  return launch_kernel(kv_append_kernel, grid_for(total), kThreads, 0, stream, a, total);
}

}  // namespace wm::cuda
