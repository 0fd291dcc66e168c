// A host emulator for the CUDA kernels' device code, so that the attention
// kernels themselves (not a model of them) run and are checked on a machine
// without a GPU.
//
// The kernel source is compiled by the host compiler with this directory
// first on the include path: its cuda/mma.cuh and cuda/wgmma.cuh replace the
// PTX wrappers with calls into this runtime, and this header supplies the
// CUDA built-ins the kernels use (threadIdx, blockIdx, blockDim,
// __syncthreads, __shfl_xor_sync, __shfl_sync, min). What the instructions compute comes
// from the CPU models in ../ptx_model.h (the PTX ISA's fragment tables).
//
// How it runs: the CTAs of a grid one after another; the threads of a CTA
// as fibers on one OS thread, switched only where a thread waits for others
// (a warp-wide instruction, a warpgroup MMA, __syncthreads). A schedule picks
// which runnable thread goes next: round robin, or one warp as far as it can
// go before the next (in order or reversed), which exposes a missing
// barrier.
//
// What it checks, failing the launch with a message instead of computing a
// wrong answer:
//   - shared memory: every access inside the launch's dynamic shared memory;
//     16-byte alignment of cp.async and ldmatrix rows; no read of bytes a
//     cp.async has not landed in yet (the copy lands at the cp.async.wait
//     that covers it), no second copy to bytes with one in flight, no read
//     of bytes no copy has landed in since the CTA started (memory starts
//     as 0xff bytes, fp16 NaN, in any case);
//   - global memory: a cp.async source inside a buffer the test registered;
//   - warp and warpgroup instructions: all lanes arrive at the same one (a
//     divergent lane is an error, as is a barrier some thread never reaches);
//     none in the partial warp a CTA of other than whole warps ends in;
//   - wgmma: every thread of the warpgroup passes the same descriptor; the
//     descriptor uses the 128-byte swizzle with base offset 0; the MMA runs
//     when a wgmma.wait_group retires its group, reading the A registers and
//     accumulators then, so code that touches them before the wait computes
//     a wrong answer; no wgmma or cp.async is left in flight at exit.
//   - mbarriers and TMA (cp.async.bulk.tensor): a barrier used before its
//     mbarrier.init is ordered by a __syncthreads (by another thread), more
//     arrivals than its count in a phase, a phase whose copies bring more
//     bytes than expect_tx announced, and at exit a phase left unfinished
//     or a copy in flight; a tensor copy lands, as the 128-byte (or 64, 32)
//     swizzle of its tensor map puts it on the shared address bits, only
//     once every arrival of its barrier's phase is in (the latest it may),
//     so that a read of it before the phase completes fails as a read of a
//     cp.async not landed does; it reads only registered global memory and
//     fills what lies outside the tensor with zeros;
//   - fences: a wgmma that reads shared memory a cp.async wrote before the
//     writing thread's fence.proxy.async (wgmma reads through the async
//     proxy); a wgmma.mma_async with no wgmma.fence since the warpgroup's
//     last wgmma.wait_group (stricter than the PTX ISA, which asks for one
//     only where the registers were touched in between).
// Not modelled: timing, bank conflicts, register limits.
#pragma once

// the CUDA headers the kernels use, before the built-ins below are defined
// (the runtime API names parameters gridDim and blockDim)
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

// device code sees the math library without including it (nvcc provides it)
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace wm::simt {

enum class Schedule {
  kRoundRobin,     // every runnable thread in turn
  kWarpsInOrder,   // the lowest runnable warp runs until it waits for the others
  kWarpsReversed,  // the highest runnable warp first, and the CTAs last to first
};

struct LaunchConfig {
  dim3 grid;
  dim3 block;                       // threads per CTA, linearised x fastest; warps of 32 consecutive
  size_t dynamic_smem = 0;          // bytes
  uint32_t smem_base = 0;           // shared address where dynamic shared memory starts (16-byte aligned)
  Schedule schedule = Schedule::kRoundRobin;
};

// runs `thread_body` for every thread of every CTA; "" or the first error
std::string launch(const LaunchConfig& config, const std::function<void()>& thread_body);

// the launch limits of the emulated device (those of an H100/H200)
inline constexpr unsigned kMaxThreadsPerBlock = 1024;
inline constexpr size_t kMaxSharedPerBlock = 227 * 1024;    // with the opt-in attribute
// what a CTA may hold with the opt-in attribute here: kMaxSharedPerBlock, or
// less where WM_SIMT_MAX_SHARED_PER_BLOCK (bytes, read once) says so, to
// emulate a device with less shared memory
size_t max_shared_per_block();
inline constexpr size_t kDefaultSharedPerBlock = 48 * 1024;  // without it
inline constexpr size_t kSharedPerSm = 228 * 1024;
inline constexpr unsigned kMaxThreadsPerSm = 2048;
inline constexpr int kMultiprocessors = 132;

// global memory a cp.async may read (a test's device buffers)
void register_global(const void* data, size_t bytes);
void unregister_global(const void* data);
void clear_globals();

// ---- what the emulated built-ins and PTX wrappers call ----
uint3 thread_idx();
uint3 block_idx();
uint3 block_dim();
uint3 grid_dim();
void sync_threads();
void named_barrier(int id, int count, bool wait);
float shfl_xor(unsigned mask, float value, int lane_mask);
float shfl_idx(unsigned mask, float value, int src_lane);

uint32_t shared_address(const void* p);
uint32_t dynamic_smem_base();
void cp_async_16(uint32_t dst, const void* src, bool valid);
// st.shared.v4: 16 bytes at a 16-byte aligned address, visible at once to this thread (others: after a barrier)
void st_shared_16(uint32_t dst, const void* src);
// ld.shared.v4: 16 bytes at a 16-byte aligned address that a copy or store has landed in
void ld_shared_16(uint32_t src, void* dst);
void cp_async_commit();
void cp_async_wait(int newest_left);
void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans);
void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// n_cols 64 or 128: d holds the thread's n_cols / 2 accumulators;
// accumulate false (scale-d 0): d = A B, d's values before are not read
void wgmma(int n_cols, float* d, const uint32_t (&a)[4], uint64_t desc, bool trans_b, bool accumulate);
// the same with A in shared memory too (desc_a: K-major, 128-byte swizzle),
// read when the group is waited for, as B is
void wgmma_ss(int n_cols, float* d, uint64_t desc_a, uint64_t desc_b, bool trans_b, bool accumulate);
void wgmma_fence();
// setmaxnreg.{inc,dec}: the whole warpgroup, one value
void setmaxnreg(int regs, bool inc);
void wgmma_commit();
void wgmma_wait(int newest_left);
void fence_proxy_async();

// mbarrier at shared address `bar` (8 bytes, 8-byte aligned): init with the
// arrivals of a phase; arrive; arrive.expect_tx (bytes the phase's tensor
// copies will bring, then an arrival); wait: mbarrier.try_wait.parity until
// the phase of that parity has completed
void mbarrier_init(uint32_t bar, int count);
void mbarrier_arrive(uint32_t bar);
void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes);
void mbarrier_wait(uint32_t bar, uint32_t parity);
// cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes:
// the box of `tensor_map` (one tensor_map_encode_tiled made) at `coords` into dst
void tma_load(uint32_t dst, const void* tensor_map, const int32_t* coords, int rank, uint32_t bar);
// cuTensorMapEncodeTiled for the emulator's TMA: the driver's checks, the
// emulator's own encoding in the 128 opaque bytes. Not modelled (an error):
// interleaved layouts, element strides other than 1
CUresult tensor_map_encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                 const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                 const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob);

// fails the launch from kernel code; does not return
[[noreturn]] void fail(const std::string& message);

}  // namespace wm::simt

// ---- the CUDA built-ins, for kernel code compiled on the host ----
#define threadIdx (::wm::simt::thread_idx())
#define blockIdx (::wm::simt::block_idx())
#define blockDim (::wm::simt::block_dim())
#define gridDim (::wm::simt::grid_dim())
// cuda_runtime_api.h defines it as an attribute the host compiler does not know
#undef __maxnreg__
#define __maxnreg__(...)
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
// a kernel's static shared arrays: one instance for the CTA that runs (CTAs
// run one at a time), like shared memory, uninitialised between CTAs
#undef __shared__
#define __shared__ static

inline void __syncthreads() { ::wm::simt::sync_threads(); }
inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask) {
  return ::wm::simt::shfl_xor(mask, value, lane_mask);
}
inline float __shfl_sync(unsigned mask, float value, int src_lane) {
  return ::wm::simt::shfl_idx(mask, value, src_lane);
}
inline int min(int a, int b) { return a < b ? a : b; }
