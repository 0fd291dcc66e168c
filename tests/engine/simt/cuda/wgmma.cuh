// The host emulator's cuda/wgmma.cuh (simt_runtime.h): the same functions as
// the project's wgmma wrappers, run by the emulator, which executes a
// warpgroup's MMAs when a wgmma.wait_group retires them, and checks the
// two fences' rules; the register fences have nothing to order on the host.
#pragma once

#include <cstdint>

#include "simt_runtime.h"

namespace wm::cuda {

inline void wgmma_fence() { simt::wgmma_fence(); }
inline void wgmma_commit() { simt::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  simt::wgmma_wait(N);
}
inline void fence_proxy_async_smem() { simt::fence_proxy_async(); }
inline void named_barrier_sync(int id, int threads) { simt::named_barrier(id, threads, true); }
inline void named_barrier_arrive(int id, int threads) { simt::named_barrier(id, threads, false); }
// the register budget is not modelled; the emulator checks that a whole warpgroup executes it
template <int N>
inline void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  simt::setmaxnreg(N, false);
}
template <int N>
inline void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  simt::setmaxnreg(N, true);
}
template <int R, int C>
inline void fence_regs(float (&)[R][C]) {}
template <int R, int C>
inline void fence_regs(uint32_t (&)[R][C]) {}

template <int TRANS_B>
inline void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc, int accumulate = 1) {
  simt::wgmma(64, &d[0][0], a, desc, TRANS_B != 0, accumulate != 0);
}
template <int TRANS_B>
inline void wgmma_m64n128k16(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc, int accumulate = 1) {
  simt::wgmma(128, &d[0][0], a, desc, TRANS_B != 0, accumulate != 0);
}
template <int TRANS_B>
inline void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate = 1) {
  simt::wgmma_ss(128, &d[0][0], desc_a, desc_b, TRANS_B != 0, accumulate != 0);
}

}  // namespace wm::cuda
