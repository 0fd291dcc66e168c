#include "cuda/device_util.cuh"
#include "cuda/kv_append.cuh"
#include "cuda/launch.cuh"
#include "quant/q2_ops.h"

namespace wm::cuda {
namespace {

// 8 floats as 8 fp16; SANITIZE: as a quantized format stores its fp16 part
template <bool SANITIZE = false>
__device__ __forceinline__ uint4 to_half8(const float* src) {
  float4 a = reinterpret_cast<const float4*>(src)[0];
  float4 b = reinterpret_cast<const float4*>(src)[1];
  if constexpr (SANITIZE) {
    a = make_float4(kv_sanitize(a.x), kv_sanitize(a.y), kv_sanitize(a.z), kv_sanitize(a.w));
    b = make_float4(kv_sanitize(b.x), kv_sanitize(b.y), kv_sanitize(b.z), kv_sanitize(b.w));
  }
  uint4 o;
  o.x = f16_bits(a.x) | (static_cast<uint32_t>(f16_bits(a.y)) << 16);
  o.y = f16_bits(a.z) | (static_cast<uint32_t>(f16_bits(a.w)) << 16);
  o.z = f16_bits(b.x) | (static_cast<uint32_t>(f16_bits(b.y)) << 16);
  o.w = f16_bits(b.z) | (static_cast<uint32_t>(f16_bits(b.w)) << 16);
  return o;
}

// element e of a write pass that gives each thread 8 channels of one
// (write, token, head): which, in 32-bit index math (the launchers check
// total < 2^31; 64-bit division is slow on the GPU)
struct TokenPiece {
  uint32_t w;  // the write
  int32_t t, h, c;  // token in its frame, head, 8-channel piece
  __device__ __forceinline__ TokenPiece(uint32_t e, int32_t head_dim, int32_t heads, int32_t tokens_per_frame) {
    const uint32_t pieces = static_cast<uint32_t>(head_dim / 8);
    const uint32_t rest = e / pieces;
    c = static_cast<int32_t>(e - rest * pieces);
    const uint32_t r2 = rest / static_cast<uint32_t>(heads);
    h = static_cast<int32_t>(rest - r2 * static_cast<uint32_t>(heads));
    w = r2 / static_cast<uint32_t>(tokens_per_frame);
    t = static_cast<int32_t>(r2 - w * static_cast<uint32_t>(tokens_per_frame));
  }
  // where its 8 channels start in the batch's k, v [frames * tokens_per_frame, heads, head_dim]
  __device__ __forceinline__ int64_t src(const KvFrameWrite& fw, int32_t head_dim, int32_t heads,
                                         int32_t tokens_per_frame) const {
    return ((static_cast<int64_t>(fw.src_frame) * tokens_per_frame + t) * heads + h) * head_dim + c * 8;
  }
};

// one thread per 8 channels of one (write, token, head)
__global__ void kv_append_kernel(const KvAppendArgs a, int64_t total) {
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < static_cast<uint32_t>(total);
       e += gridDim.x * blockDim.x) {
    const TokenPiece p(e, a.head_dim, a.heads, a.tokens_per_frame);
    const int32_t t = p.t, h = p.h, c = p.c;
    const KvFrameWrite fw = a.writes[p.w];
    const int64_t src = p.src(fw, a.head_dim, a.heads, a.tokens_per_frame);
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

// KIVI-2's input: sanitized, then fp16 as the CPU's buffer holds it
__device__ __forceinline__ float kivi_input(float x) { return __half2float(__float2half_rn(kv_sanitize(x))); }

// one BlockQ2Asym<G> (quant/kv_layouts.h: q2asym_quantize_ref) of the G
// values src[i * stride] at dst (4-byte aligned)
__device__ __forceinline__ void kivi_block(const float* src, int64_t stride, int G, uint8_t* dst) {
  float lo = kivi_input(src[0]), hi = lo;
  for (int i = 1; i < G; ++i) {
    const float x = kivi_input(src[i * stride]);
    lo = x < lo ? x : lo;  // std::min / std::max, -0 and all
    hi = hi < x ? x : hi;
  }
  const uint16_t zero = f16_bits(lo), scale = f16_bits((hi - lo) / 3.0f);
  const float z = __half2float(__ushort_as_half(zero)), s = __half2float(__ushort_as_half(scale));
  auto* out = reinterpret_cast<uint32_t*>(dst);
  out[0] = static_cast<uint32_t>(scale) | (static_cast<uint32_t>(zero) << 16);
  for (int w = 0; w < G / 16; ++w) {
    uint32_t codes = 0;
    for (int i = 0; i < 16; ++i) {
      const float x = kivi_input(src[(w * 16 + i) * stride]);
      int c = s > 0.0f ? static_cast<int>(roundf((x - z) / s)) : 0;
      c = c < 0 ? 0 : (c > 3 ? 3 : c);
      codes |= static_cast<uint32_t>(c) << (2 * i);
    }
    out[1 + w] = codes;
  }
}

// the first byte of logical token `logical`'s unit in its page
__device__ __forceinline__ uint8_t* kivi_unit(const KvKiviAppendArgs& a, const KvFrameWrite& fw, int32_t h,
                                              int64_t logical) {
  int32_t entry = 0, offset = 0;
  a.row.unit_at(static_cast<int32_t>(logical / a.row.unit_tokens), &entry, &offset);
  const int32_t page = a.page_tables[fw.table + static_cast<int64_t>(h) * fw.pages_per_head + entry];
  return a.pool + static_cast<int64_t>(page) * a.page_bytes + offset;
}

// window frames: one thread per block of one (write, head, chunk), the
// chunk's head_dim key blocks then its head_dim value blocks
__global__ void kv_append_kivi_kernel(const KvKiviAppendArgs a, int64_t total) {
  const uint32_t D = static_cast<uint32_t>(a.row.head_dim), G = static_cast<uint32_t>(a.row.group);
  const uint32_t per_chunk = 2 * D, chunks = static_cast<uint32_t>(a.tokens_per_frame) / G;
  const int32_t bb = a.row.block_bytes();
  const int64_t row_stride = static_cast<int64_t>(a.heads) * D;  // between tokens
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < static_cast<uint32_t>(total);
       e += gridDim.x * blockDim.x) {
    const uint32_t rest = e / per_chunk, b = e - rest * per_chunk;
    const uint32_t r2 = rest / chunks, ch = rest - r2 * chunks;
    const uint32_t w = r2 / static_cast<uint32_t>(a.heads);
    const int32_t h = static_cast<int32_t>(r2 - w * static_cast<uint32_t>(a.heads));
    const KvFrameWrite fw = a.writes[w];
    const int64_t logical = static_cast<int64_t>(fw.slot) * a.tokens_per_frame + ch * G;
    uint8_t* chunk = kivi_unit(a, fw, h, logical) + (logical % a.row.unit_tokens) / G * a.row.chunk_bytes();
    const int64_t tok0 = static_cast<int64_t>(fw.src_frame) * a.tokens_per_frame + ch * G;
    if (b < D) {  // key channel b over the chunk's G tokens
      kivi_block(a.k + tok0 * row_stride + static_cast<int64_t>(h) * D + b, row_stride, a.row.group,
                 chunk + static_cast<int64_t>(b) * bb);
    } else {  // value block (token t, channels g*G..)
      const uint32_t i = b - D, t = i / (D / G), g = i - t * (D / G);
      kivi_block(a.v + (tok0 + t) * row_stride + static_cast<int64_t>(h) * D + g * G, 1, a.row.group,
                 chunk + static_cast<int64_t>(b) * bb);
    }
  }
}

// sink frames: one thread per 8 channels of one (write, token, head), into
// the fp16 unit (K [U][head_dim] then V)
__global__ void kv_append_kivi_sinks_kernel(const KvKiviAppendArgs a, int64_t total) {
  const int32_t D = a.row.head_dim, U = a.row.unit_tokens;
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < static_cast<uint32_t>(total);
       e += gridDim.x * blockDim.x) {
    const TokenPiece p(e, D, a.heads, a.tokens_per_frame);
    const KvFrameWrite fw = a.writes[p.w];
    const int64_t src = p.src(fw, D, a.heads, a.tokens_per_frame);
    const int64_t logical = static_cast<int64_t>(fw.slot) * a.tokens_per_frame + p.t;
    auto* unit = reinterpret_cast<uint16_t*>(kivi_unit(a, fw, p.h, logical));
    const int64_t row = (logical % U) * D + p.c * 8;
    reinterpret_cast<uint4*>(unit + row)[0] = to_half8<true>(a.k + src);
    reinterpret_cast<uint4*>(unit + static_cast<int64_t>(U) * D + row)[0] = to_half8<true>(a.v + src);
  }
}

// the address of (page-table entry, offset) in head h's row of a write's cache
__device__ __forceinline__ uint8_t* span_at(const KvSpanAppendArgs& a, const KvSpanWrite& sw, int32_t h,
                                            int32_t entry, int32_t offset) {
  const int32_t page = a.page_tables[sw.table + static_cast<int64_t>(h) * sw.pages_per_head + entry];
  return a.pool + static_cast<int64_t>(page) * a.page_bytes + offset;
}

__device__ __forceinline__ void copy_bytes(uint8_t* dst, const uint8_t* src, int32_t n) {
  for (int32_t i = 0; i < n; ++i) dst[i] = src[i];
}

// one thread per (write, head, token) and per (write, head, 16 bytes of a table)
__global__ void kv_append_span_kernel(const KvSpanAppendArgs a, int64_t total) {
  const SpanRowLayout& L = a.row;
  const int32_t T = L.tokens_per_frame, D = L.head_dim, tw = L.table_bytes() / 16;
  const uint32_t per_head = static_cast<uint32_t>(T + tw), per_write = per_head * static_cast<uint32_t>(a.heads);
  const int32_t tb = span_token_bytes(L);
  for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < static_cast<uint32_t>(total);
       e += gridDim.x * blockDim.x) {
    const uint32_t w = e / per_write, r1 = e - w * per_write;
    const int32_t h = static_cast<int32_t>(r1 / per_head), i = static_cast<int32_t>(r1 % per_head);
    const KvSpanWrite sw = a.writes[w];
    const uint8_t* image = a.staging + sw.staging;
    int32_t entry = 0, offset = 0;
    if (i >= T) {  // 16 bytes of this slot's tables
      if (sw.sink || !sw.tables) continue;
      const int32_t j = i - T;
      L.tables.at(sw.table_index, &entry, &offset);
      const uint8_t* src = image + span_tables_at(L, a.heads) + static_cast<int64_t>(h) * L.table_bytes() + j * 16;
      *reinterpret_cast<uint4*>(span_at(a, sw, h, entry, offset + j * 16)) = *reinterpret_cast<const uint4*>(src);
      continue;
    }
    const int32_t logical = sw.slot * T + i;
    if (sw.sink) {  // fp16 rows into the front's unit: K [kTileKeys][D], then V
      const int64_t src = (static_cast<int64_t>(sw.src_frame) * T + i) * a.heads * D + static_cast<int64_t>(h) * D;
      L.front.at(logical / kTileKeys, &entry, &offset);
      uint8_t* unit = span_at(a, sw, h, entry, offset);
      auto* kd = reinterpret_cast<uint4*>(unit + (logical % kTileKeys) * 2 * D);
      auto* vd = reinterpret_cast<uint4*>(unit + (kTileKeys + logical % kTileKeys) * 2 * D);
      for (int32_t c = 0; c < D / 8; ++c) {
        kd[c] = to_half8<true>(a.k + src + c * 8);
        vd[c] = to_half8<true>(a.v + src + c * 8);
      }
      continue;
    }
    if (i == 0) {  // the slot's map entry: its span's table
      L.map.at(0, &entry, &offset);
      reinterpret_cast<int32_t*>(span_at(a, sw, h, entry, offset))[sw.slot - L.front_tokens / T] = sw.table_index;
    }
    const int32_t wl = logical - L.front_tokens, r = wl % kTileKeys;
    L.units.at(wl / kTileKeys, &entry, &offset);
    uint8_t* unit = span_at(a, sw, h, entry, offset);
    const uint8_t* src = image + (static_cast<int64_t>(h) * T + i) * tb;
    copy_bytes(unit + r * L.rec_bytes, src, L.rec_bytes);
    copy_bytes(unit + L.v_recs() + r * L.rec_bytes, src + L.rec_bytes, L.rec_bytes);
    unit[L.k_ids() + r] = src[2 * L.rec_bytes];
    unit[L.v_ids() + r] = src[2 * L.rec_bytes + 1];
    copy_bytes(unit + L.k_coeffs() + r * L.coeff_bytes, src + 2 * L.rec_bytes + 2, L.coeff_bytes);
  }
}

}  // namespace

cudaError_t launch_kv_append_span(const KvSpanAppendArgs& a, cudaStream_t stream) {
  const SpanRowLayout& L = a.row;
  if (L.block <= 0 || L.tokens_per_frame <= 0 || L.head_dim % 8 != 0 || L.table_bytes() % 16 != 0)
    return cudaErrorInvalidValue;
  if (((reinterpret_cast<uintptr_t>(a.staging) | reinterpret_cast<uintptr_t>(a.k) |
        reinterpret_cast<uintptr_t>(a.v)) & 15u) != 0)
    return cudaErrorMisalignedAddress;
  const int64_t total =
      static_cast<int64_t>(a.n_writes) * a.heads * (L.tokens_per_frame + L.table_bytes() / 16);
  if (total <= 0) return cudaSuccess;
  if (total >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  return launch_kernel(kv_append_span_kernel, grid_for(total), kThreads, 0, stream, a, total);
}

cudaError_t launch_kv_append_kivi(const KvKiviAppendArgs& a, cudaStream_t stream) {
  const int32_t G = a.row.group, D = a.row.head_dim;
  if (G != 32 && G != 64 && G != 128) return cudaErrorInvalidValue;
  if (D % G != 0 || D % 8 != 0 || a.tokens_per_frame % G != 0) return cudaErrorInvalidValue;
  const int64_t total = a.sinks ? static_cast<int64_t>(a.n_writes) * a.tokens_per_frame * a.heads * (D / 8)
                                : static_cast<int64_t>(a.n_writes) * a.heads * (a.tokens_per_frame / G) * 2 * D;
  if (total <= 0) return cudaSuccess;
  if (total >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  if (a.sinks) return launch_kernel(kv_append_kivi_sinks_kernel, grid_for(total), kThreads, 0, stream, a, total);
  return launch_kernel(kv_append_kivi_kernel, grid_for(total), kThreads, 0, stream, a, total);
}

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
