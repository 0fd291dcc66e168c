// CPU models of the PTX instructions the attention kernels are built on,
// written from the PTX ISA's fragment tables and canonical layouts, not from
// the kernels' lane maps (g = lane / 4, t = lane % 4). Used by
// cuda_host_test.cc (lane maps, wgmma operands) and by the host emulator that
// runs the kernels themselves (simt/).
//
//   ldmatrix.m8n8.x4: lanes 8i..8i+7 give the row addresses of matrix i; each
//     lane gets, in register i, row g columns 2t, 2t+1 of matrix i (with
//     .trans: rows 2t, 2t+1 of column g)
//   mma.m16n8k16.row.col f16 -> f32: A a0 (g, 2t..), a1 (g+8, 2t..),
//     a2 (g, 2t+8..), a3 (g+8, 2t+8..); B b0 (k 2t.., n g), b1 (k 2t+8.., n g);
//     C c0,c1 (g, 2t..), c2,c3 (g+8, 2t..)
//   wgmma.m64nNk16 f16 -> f32, A from registers: warp w of the warpgroup holds
//     rows 16w..16w+15 of A in the m16n8k16 A layout; accumulator i of a
//     thread is row 16w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2t + i % 2;
//     B (16 x N) read from shared memory through a matrix descriptor
#pragma once

#include <array>
#include <cstdint>

#include "common/half.h"

namespace wm::ptx_model {

using Lanes4 = std::array<std::array<uint32_t, 4>, 32>;  // 4 registers of each lane
using Lanes2 = std::array<std::array<uint32_t, 2>, 32>;  // the B operand of mma.m16n8k16
using Acc = std::array<std::array<float, 4>, 32>;        // a 16x8 fp32 accumulator

inline uint16_t half_at(const uint8_t* smem, uint32_t byte) {
  return static_cast<uint16_t>(smem[byte] | (smem[byte + 1] << 8));
}
inline float lo_half(uint32_t r) { return f16_to_f32(static_cast<uint16_t>(r & 0xffff)); }
inline float hi_half(uint32_t r) { return f16_to_f32(static_cast<uint16_t>(r >> 16)); }
inline uint32_t pack(float lo, float hi) {
  return f32_to_f16(lo) | (static_cast<uint32_t>(f32_to_f16(hi)) << 16);
}

inline Lanes4 ldmatrix_x4(const uint8_t* smem, const std::array<uint32_t, 32>& addr, bool trans) {
  Lanes4 r{};
  for (int i = 0; i < 4; ++i)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      uint16_t lo, hi;
      if (!trans) {
        lo = half_at(smem, addr[8 * i + g] + 2 * (2 * t));
        hi = half_at(smem, addr[8 * i + g] + 2 * (2 * t + 1));
      } else {
        lo = half_at(smem, addr[8 * i + 2 * t] + 2 * g);
        hi = half_at(smem, addr[8 * i + 2 * t + 1] + 2 * g);
      }
      r[static_cast<size_t>(lane)][static_cast<size_t>(i)] = lo | (static_cast<uint32_t>(hi) << 16);
    }
  return r;
}

// the 16 x 16 A operand of one warp from its lanes' m16n8k16 A fragments
inline void unpack_a(const Lanes4& a, float (&A)[16][16]) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const auto& ar = a[static_cast<size_t>(lane)];
    A[g][2 * t] = lo_half(ar[0]), A[g][2 * t + 1] = hi_half(ar[0]);
    A[g + 8][2 * t] = lo_half(ar[1]), A[g + 8][2 * t + 1] = hi_half(ar[1]);
    A[g][2 * t + 8] = lo_half(ar[2]), A[g][2 * t + 9] = hi_half(ar[2]);
    A[g + 8][2 * t + 8] = lo_half(ar[3]), A[g + 8][2 * t + 9] = hi_half(ar[3]);
  }
}

// c += a b for the whole warp
inline void mma_16816(Acc& c, const Lanes4& a, const Lanes2& b) {
  float A[16][16], B[16][8], C[16][8];
  unpack_a(a, A);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const auto& br = b[static_cast<size_t>(lane)];
    B[2 * t][g] = lo_half(br[0]), B[2 * t + 1][g] = hi_half(br[0]);
    B[2 * t + 8][g] = lo_half(br[1]), B[2 * t + 9][g] = hi_half(br[1]);
    const auto& cr = c[static_cast<size_t>(lane)];
    C[g][2 * t] = cr[0], C[g][2 * t + 1] = cr[1], C[g + 8][2 * t] = cr[2], C[g + 8][2 * t + 1] = cr[3];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double acc = C[m][n];
      for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[m][k]) * B[k][n];
      C[m][n] = static_cast<float>(acc);
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    c[static_cast<size_t>(lane)] = {C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]};
  }
}

// The fields of a wgmma matrix descriptor (PTX ISA "Matrix Descriptor
// Format"): bits 0-13 start address >> 4, 16-29 leading-dimension byte
// offset >> 4, 32-45 stride-dimension byte offset >> 4, 49-51 base offset,
// 62-63 swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte).
struct Descriptor {
  uint32_t start = 0, lbo = 0, sbo = 0, base_offset = 0, swizzle = 0;
  explicit Descriptor(uint64_t d)
      : start(static_cast<uint32_t>(d & 0x3FFF) << 4),
        lbo(static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4),
        sbo(static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4),
        base_offset(static_cast<uint32_t>((d >> 49) & 7)),
        swizzle(static_cast<uint32_t>(d >> 62)) {}
};

// Where wgmma reads element (k, n) of its 16 x N B operand, for 16-bit types
// (T = 8 elements = 16 bytes) with the 128-byte swizzle and base offset 0
// (the only mode the kernels use; callers check the descriptor):
//   K-major:  ((8,m),(T,2k)) : ((8T,SBO),(1,T))      n is the row, k the column
//   MN-major: ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))  n is contiguous
// then Swizzle<3,4,3> on the byte address (bits 4-6 ^= bits 7-9).
inline uint32_t wgmma_b_address(uint64_t desc, bool mn_major, int k, int n) {
  const Descriptor d(desc);
  uint32_t off = 0;
  if (!mn_major) {
    off = (n % 8) * 128 + (n / 8) * d.sbo + (k % 8) * 2 + (k / 8) * 16;
  } else {
    off = (n % 8) * 2 + (n / 8 % 8) * 16 + (n / 64) * d.lbo + (k % 8) * 128 + (k / 8) * d.sbo;
  }
  const uint32_t addr = d.start + off;
  return addr ^ (((addr >> 7) & 7) << 4);
}

// d += A B for one warpgroup (d = A B without accumulate: scale-d 0, d's
// values before are not read), d[thread] pointing to its N / 2
// accumulators, B[k][n] = the fp16 at smem + b_addr(k, n), and
// a_rows(w, A) filling warp w's 16 x 16 part of A (rows 16w .. 16w + 15)
template <class ARows, class BAddr>
void wgmma_m64nNk16_with(int n_cols, bool accumulate, float* const (&d)[128], const uint8_t* smem, ARows a_rows,
                         BAddr b_addr) {
  float B[16][256];
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < n_cols; ++n) B[k][n] = f16_to_f32(half_at(smem, b_addr(k, n)));
  for (int w = 0; w < 4; ++w) {
    float A[16][16];
    a_rows(w, A);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < n_cols / 2; ++i) {
        const int row = g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
        double acc = accumulate ? d[32 * w + lane][i] : 0.0;
        for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
        d[32 * w + lane][i] = static_cast<float>(acc);
      }
    }
  }
}

// A from registers: a[thread] points to its 4 A registers (each warp's 16
// rows as an m16n8k16 A fragment)
template <class BAddr>
void wgmma_m64nNk16(int n_cols, bool accumulate, float* const (&d)[128], const uint32_t* const (&a)[128],
                    const uint8_t* smem, BAddr b_addr) {
  wgmma_m64nNk16_with(
      n_cols, accumulate, d, smem,
      [&](int w, float (&A)[16][16]) {
        Lanes4 lanes{};
        for (int lane = 0; lane < 32; ++lane)
          for (int r = 0; r < 4; ++r) lanes[static_cast<size_t>(lane)][static_cast<size_t>(r)] = a[32 * w + lane][r];
        unpack_a(lanes, A);
      },
      b_addr);
}

// A from shared memory as well: A[m][k] = the fp16 at smem + a_addr(k, m)
// (K-major, addressed as wgmma_b_address addresses a K-major B's (k, n))
template <class AAddr, class BAddr>
void wgmma_m64nNk16_ss(int n_cols, bool accumulate, float* const (&d)[128], const uint8_t* smem, AAddr a_addr,
                       BAddr b_addr) {
  wgmma_m64nNk16_with(
      n_cols, accumulate, d, smem,
      [&](int w, float (&A)[16][16]) {
        for (int r = 0; r < 16; ++r)
          for (int k = 0; k < 16; ++k) A[r][k] = f16_to_f32(half_at(smem, a_addr(k, 16 * w + r)));
      },
      b_addr);
}

}  // namespace wm::ptx_model
