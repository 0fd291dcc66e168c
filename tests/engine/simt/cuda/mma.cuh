// The host emulator's cuda/mma.cuh (simt_runtime.h): the same functions as
// the kernels' PTX wrappers in the project's cuda/mma.cuh, run by the
// emulator. Found first on the include path of the emulated kernels only.
#pragma once

#include <cstdint>

#include "cuda/mma_layout.h"
#include "ptx_model.h"
#include "simt_runtime.h"

namespace wm::cuda {

inline uint32_t smem_addr(const void* p) { return simt::shared_address(p); }
inline uint32_t dynamic_smem_addr() { return simt::dynamic_smem_base(); }
inline void cp_async_16(uint32_t dst, const void* src, bool valid) { simt::cp_async_16(dst, src, valid); }
inline void st_shared_16(uint32_t dst, const uint4& v) { simt::st_shared_16(dst, &v); }
inline uint4 ld_shared_16(uint32_t src) {
  uint4 v;
  simt::ld_shared_16(src, &v);
  return v;
}
inline void cp_async_commit() { simt::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  simt::cp_async_wait(N);
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { simt::ldmatrix_x4(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { simt::ldmatrix_x4(r, addr, true); }
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  simt::mma_16816(c, a, b0, b1);
}
// __floats2half2_rn: round to nearest even, lo = first
inline uint32_t pack_half2(float lo, float hi) { return ptx_model::pack(lo, hi); }

}  // namespace wm::cuda
