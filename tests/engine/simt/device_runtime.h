// The emulated device behind the host emulator's plugin build
// (libwm_cuda_simt.so): the CUDA runtime API subset the plugin calls,
// implemented over host memory (device_runtime.cc), and kernel launches run
// by simt_runtime.h. One device, "simt emulator (sm_90)", with an
// H100/H200's launch limits; streams run every operation at once, in order;
// successive launches take turns at the emulator's three schedules.
//
// Device memory is host memory from cudaMalloc; every live allocation is a
// buffer the emulator lets cp.async read. A kernel fault (the emulator's
// checks) is printed with its message and becomes a sticky
// cudaErrorLaunchFailure, as an illegal address is on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace wm::simt {

// a launch as the runtime does it: the configuration against the device's
// limits and the kernel's shared-memory attribute, then the kernel
cudaError_t launch_on_device(const void* kernel, dim3 grid, dim3 block, size_t smem,
                             std::function<void()> thread_body);
// stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture): while a
// stream records, its work is kept for a graph instead of run; calls a
// recording cannot hold (synchronization, a synchronous copy) fail with
// cudaErrorStreamCaptureUnsupported and invalidate the recording, as on a GPU
bool recording();
// recording, and a call has broken the recording: every later one fails
bool recording_invalidated();
void record(std::function<cudaError_t()> op);
// cudaFuncAttributeMaxDynamicSharedMemorySize
cudaError_t set_kernel_smem_limit(const void* kernel, size_t bytes);
// CTAs of a kernel one SM holds at once, from threads and shared memory
// (registers are not modelled)
int resident_blocks(const void* kernel, int threads, size_t smem);

}  // namespace wm::simt
