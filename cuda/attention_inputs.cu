#include "cuda/attention_inputs.cuh"
#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

struct Tensors {
  const float* src[3];
  uint16_t* dst[3];
};

// grid.y picks the tensor (q, k or v; v alone where q and k are made
// already); one thread per 8 channels of one (row, head) of rows
// [first_row, rows); total counts those
__global__ void attention_inputs_kernel(Tensors t, int32_t first_row, int32_t rows, int32_t heads, int32_t head_dim,
                                        int64_t total) {
  const float* src = t.src[blockIdx.y] + static_cast<int64_t>(first_row) * heads * head_dim;
  uint16_t* dst = t.dst[blockIdx.y];
  const int32_t chunks = head_dim / 8;
  // 32-bit index math (the launcher checks total < 2^31): 64-bit division is slow on the GPU
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < static_cast<uint32_t>(total);
       e += gridDim.x * blockDim.x) {
    const uint32_t rh = e / static_cast<uint32_t>(chunks);
    const int32_t c = static_cast<int32_t>(e - rh * static_cast<uint32_t>(chunks));
    const uint32_t rr = rh / static_cast<uint32_t>(heads);  // row - first_row
    const int32_t h = static_cast<int32_t>(rh - rr * static_cast<uint32_t>(heads));
    const int64_t r = static_cast<int64_t>(first_row) + rr;
    const float* s = src + static_cast<int64_t>(e) * 8;  // [rows, heads, head_dim] is row-major in (r, h, c)
    const float4 a = reinterpret_cast<const float4*>(s)[0];
    const float4 b = reinterpret_cast<const float4*>(s)[1];
    uint4 o;
    o.x = f16_bits(a.x) | (static_cast<uint32_t>(f16_bits(a.y)) << 16);
    o.y = f16_bits(a.z) | (static_cast<uint32_t>(f16_bits(a.w)) << 16);
    o.z = f16_bits(b.x) | (static_cast<uint32_t>(f16_bits(b.y)) << 16);
    o.w = f16_bits(b.z) | (static_cast<uint32_t>(f16_bits(b.w)) << 16);
    reinterpret_cast<uint4*>(dst + ((static_cast<int64_t>(h) * rows + r) * head_dim + c * 8))[0] = o;
  }
}

}  // namespace

cudaError_t launch_attention_inputs(const float* q, const float* k, const float* v, int32_t first_row, int32_t rows,
                                    int32_t heads, int32_t head_dim, uint16_t* q16, uint16_t* k16, uint16_t* v16,
                                    cudaStream_t stream, bool v_only) {
  if (first_row < 0 || first_row > rows) return cudaErrorInvalidValue;
  const int64_t total = static_cast<int64_t>(rows - first_row) * heads * (head_dim / 8);
  if (total <= 0) return cudaSuccess;
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
                        static_cast<const void*>(q16), static_cast<const void*>(k16), static_cast<const void*>(v16)})
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return cudaErrorMisalignedAddress;
  if (head_dim % 8 != 0 || total >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  const Tensors t = v_only ? Tensors{{v}, {v16}} : Tensors{{q, k, v}, {q16, k16, v16}};
  return launch_kernel(attention_inputs_kernel, dim3(grid_for(total), v_only ? 1 : 3), kThreads, 0, stream, t,
                       first_row, rows, heads, head_dim, total);
}

}  // namespace wm::cuda
