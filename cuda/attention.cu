#include <cmath>

#include "cuda/attention.cuh"
#include "cuda/kv_format_fp16.cuh"
#include "cuda/mma.cuh"
#include "cuda/tile_load.cuh"

namespace wm::cuda {
namespace {

// Fmt: the cache format type (kv_format_fp16.cuh); HD: head_dim; WARPS: 4 or
// 8, 16 query rows each. Shared memory: Q [BQ][HD], then two stages of
// K [BK][HD] and V [BK][HD], all fp16 and swizzled (mma_layout.h: swz; the
// lane maps there are tested on the CPU by cuda_host_test.cc).
template <class Fmt, int HD, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, WARPS == 8 ? 1 : 2)
    attention_kernel(const AttentionArgs a, const typename Fmt::View kv) {
  constexpr int BQ = WARPS * 16, BK = kTileKeys, NT = WARPS * 32;
  constexpr uint32_t kTileBytes = BK * HD * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_addr(smem);
  const uint32_t stages = sq + BQ * HD * 2;  // stage s: K at stages + 2 s kTileBytes, V right after

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int t4 = lane & 3;
  const WorkItem w = a.items[blockIdx.x];
  const int head = blockIdx.y;
  const PlanSession s = a.sessions[w.session];
  const int32_t cached = a.cached[w.session];
  const int32_t q0 = w.q_tile * BQ;
  const int32_t nq = min(BQ, s.rows - q0);
  const int64_t head_rows = static_cast<int64_t>(head) * a.rows_total;
  const int32_t* pt_row = kv.page_table + page_row_offset(s, a.layer, a.heads, head);

  auto issue = [&](int tile, int stage) {
    const uint32_t sk = stages + stage * 2 * kTileBytes, sv = sk + kTileBytes;
    const TileRef t = tile_ref(s, cached, tile);
    if (t.from_cache) {
      Fmt::template load_tile<HD, NT>(kv, pt_row, t.first, t.valid, sk, sv, tid);
    } else {
      const int64_t off = t.valid > 0 ? (head_rows + s.row0 + t.first) * HD : 0;
      load_rows_async<HD, BK, NT>(sk, a.k16 + off, t.valid, a.k16, tid);
      load_rows_async<HD, BK, NT>(sv, a.v16 + off, t.valid, a.v16, tid);
    }
  };

  // prologue: the query tile and the first key tile in one group
  load_rows_async<HD, BQ, NT>(sq, a.q16 + (head_rows + s.row0 + q0) * HD, nq, a.q16, tid);
  const int n_tiles = w.tile_end - w.tile_begin;
  if (n_tiles > 0) issue(w.tile_begin, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    ldmatrix_x4(qf[kk], sq + swz<HD>(warp * 16 + a_row(lane), a_chunk(lane, kk)));

  float o[HD / 8][4];
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of scaled logits, log2 units
  float l[2] = {0.0f, 0.0f};            // this thread's part of the running sum

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_tiles) issue(w.tile_begin + it + 1, stage ^ 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning tile `it`
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t sk = stages + stage * 2 * kTileBytes, sv = sk + kTileBytes;
    const int valid = tile_ref(s, cached, w.tile_begin + it).valid;

    // S = Q K^T for this warp's 16 rows and the tile's 64 keys
    float sc[BK / 8][4];
#pragma unroll
    for (int j = 0; j < BK / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int jj = 0; jj < BK / 16; ++jj) {
        uint32_t b[4];
        ldmatrix_x4(b, sk + swz<HD>(kb_row(lane, jj), kb_chunk(lane, kk)));
        mma_16816(sc[2 * jj], qf[kk], b[0], b[1]);
        mma_16816(sc[2 * jj + 1], qf[kk], b[2], b[3]);
      }
    if (valid < BK) {
#pragma unroll
      for (int j = 0; j < BK / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (8 * j + c_col(lane, e) >= valid) sc[j][e] = -INFINITY;
    }

    // online softmax; rows g (r = 0) and g + 8 (r = 1), a row's 4 threads are one quad
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < BK / 8; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * r], sc[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx * a.scale_log2);
      // no key seen yet: subtract 0 so that exp2(-inf) gives 0, not nan
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = exp2f(m[r] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < BK / 8; ++j) {
        const float p0 = exp2f(fmaf(sc[j][2 * r], a.scale_log2, -m_use));
        const float p1 = exp2f(fmaf(sc[j][2 * r + 1], a.scale_log2, -m_use));
        sc[j][2 * r] = p0;
        sc[j][2 * r + 1] = p1;
        sum += p0 + p1;
      }
      l[r] = l[r] * corr + sum;
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        o[j][2 * r] *= corr;
        o[j][2 * r + 1] *= corr;
      }
      m[r] = m_new;
    }

    // O += P V: the S accumulators of key tiles 2kk, 2kk+1 are the A fragment of step kk
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t pa[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[i] = pack_half2(sc[p_tile(kk, i)][p_elem(i)], sc[p_tile(kk, i)][p_elem(i) + 1]);
#pragma unroll
      for (int jj = 0; jj < HD / 16; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sv + swz<HD>(vb_row(lane, kk), vb_chunk(lane, jj)));
        mma_16816(o[2 * jj], pa, b[0], b[1]);
        mma_16816(o[2 * jj + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + c_row(lane, 2 * r);
    if (row >= nq) continue;
    if (w.partial < 0) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      float* dst = a.out + ((static_cast<int64_t>(s.row0) + q0 + row) * a.heads + head) * HD;
#pragma unroll
      for (int j = 0; j < HD / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + c_col(lane, 2 * r)) =
            make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    } else {
      const int64_t prow = (static_cast<int64_t>(w.partial) * a.heads + head) * BQ + row;
      float* dst = a.partial_o + prow * HD;
#pragma unroll
      for (int j = 0; j < HD / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + c_col(lane, 2 * r)) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
      if (t4 == 0) *reinterpret_cast<float2*>(a.partial_ml + 2 * prow) = make_float2(m[r], l[r]);
    }
  }
}

template <int HD, int WARPS>
cudaError_t set_smem_limit() {
  return cudaFuncSetAttribute(attention_kernel<Fp16PageFormat, HD, WARPS>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(attention_smem_bytes(HD, WARPS * 16)));
}

template <int HD, int WARPS>
cudaError_t launch(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t items, cudaStream_t stream) {
  attention_kernel<Fp16PageFormat, HD, WARPS>
      <<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(a.heads)), WARPS * 32,
         attention_smem_bytes(HD, WARPS * 16), stream>>>(a, kv);
  return cudaGetLastError();
}

template <int HD, int WARPS>
int32_t occupancy() {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_kernel<Fp16PageFormat, HD, WARPS>, WARPS * 32,
                                                    attention_smem_bytes(HD, WARPS * 16)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

int32_t attention_ctas_per_sm(int32_t head_dim, int32_t block_q) {
  const bool big = block_q == 128;
  switch (head_dim) {
    case 32: return big ? occupancy<32, 8>() : occupancy<32, 4>();
    case 64: return big ? occupancy<64, 8>() : occupancy<64, 4>();
    case 128: return big ? occupancy<128, 8>() : occupancy<128, 4>();
    default: return 0;
  }
}

size_t attention_smem_bytes(int32_t head_dim, int32_t block_q) {
  return static_cast<size_t>(block_q + 4 * kTileKeys) * head_dim * 2;
}

cudaError_t attention_prepare() {
  cudaError_t e = cudaSuccess;
  for (cudaError_t r : {set_smem_limit<32, 4>(), set_smem_limit<32, 8>(), set_smem_limit<64, 4>(),
                        set_smem_limit<64, 8>(), set_smem_limit<128, 4>(), set_smem_limit<128, 8>()})
    if (r != cudaSuccess && e == cudaSuccess) e = r;
  return e;
}

cudaError_t launch_attention(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                             cudaStream_t stream) {
  if (items <= 0 || a.heads <= 0) return cudaSuccess;
  if (a.heads > 65535) return cudaErrorInvalidConfiguration;
  const bool big = a.block_q == 128;
  if (a.block_q != 64 && a.block_q != 128) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 32: return big ? launch<32, 8>(a, kv, items, stream) : launch<32, 4>(a, kv, items, stream);
    case 64: return big ? launch<64, 8>(a, kv, items, stream) : launch<64, 4>(a, kv, items, stream);
    case 128: return big ? launch<128, 8>(a, kv, items, stream) : launch<128, 4>(a, kv, items, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace wm::cuda
