// PTX wrappers for Hopper's tensor memory accelerator (TMA) and the
// mbarriers it completes (sm_90 device code). A tensor copy
// (cp.async.bulk.tensor) moves one box of a tensor map (a CUtensorMap the
// host encoded, cuda/tensor_map.h) from global to shared memory, laid out by
// the map's swizzle, with one instruction from one thread; it reports the
// bytes it wrote to an mbarrier in shared memory. An mbarrier phase completes
// when its count of arrivals is in and the bytes its arrivals announced
// (arrive.expect_tx) have landed; threads wait for a phase by its parity.
// Tensor copies write through the async proxy, so wgmma reads them with no
// fence.proxy.async. The host emulator has its own copy of this file.
#pragma once

#include <cstdint>

namespace wm::cuda {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// makes the initialised barriers visible to the async proxy (the tensor copies); a __syncthreads then
// makes them visible to the CTA's threads
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// announces `bytes` more for the current phase, then arrives
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// returns once the phase of that parity has completed (try_wait suspends the thread a while each time)
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// orders this thread's tensor copies after the host's write of the tensor map at `map` (global memory,
// 128 bytes): a map the backend rewrote between launches is not read from a stale copy
__device__ __forceinline__ void tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(map))
               : "memory");
}

// the box of the 3-d tensor map at `map` (global memory) whose first element is (c0, c1, c2), into shared
// memory at dst (128-byte aligned; 1024 for the 128-byte swizzle to match mma_layout.h's panel_swz); elements
// outside the tensor are zeros; the bytes complete on the mbarrier `bar`
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int32_t c0, int32_t c1, int32_t c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

}  // namespace wm::cuda
