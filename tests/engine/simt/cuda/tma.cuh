// The host emulator's cuda/tma.cuh (simt_runtime.h): the same functions as
// the project's TMA and mbarrier wrappers, run by the emulator, which lands
// a tensor copy when its barrier's phase has every arrival and checks the
// barrier rules (simt_runtime.h lists them).
#pragma once

#include <cstdint>

#include "simt_runtime.h"

namespace wm::cuda {

inline void mbarrier_init(uint32_t bar, int count) { simt::mbarrier_init(bar, count); }
inline void fence_mbarrier_init() {}
inline void mbarrier_arrive(uint32_t bar) { simt::mbarrier_arrive(bar); }
inline void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) { simt::mbarrier_arrive_expect_tx(bar, bytes); }
inline void mbarrier_wait(uint32_t bar, uint32_t parity) { simt::mbarrier_wait(bar, parity); }
inline void tensormap_acquire(const void*) {}  // the emulator reads a map when a copy is issued
inline void tma_load_3d(uint32_t dst, const void* map, int32_t c0, int32_t c1, int32_t c2, uint32_t bar) {
  const int32_t coords[3] = {c0, c1, c2};
  simt::tma_load(dst, map, coords, 3, bar);
}

}  // namespace wm::cuda
