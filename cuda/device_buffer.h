// An owned device allocation that grows on demand (plugin host code). Growth
// frees the old block first (cudaFree waits for the device), so it happens
// only when a batch larger than any before arrives, never in steady state.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "cuda/cuda_check.h"

namespace wm::cuda {

// set while this thread's backend records a graph (cuda_backend.cc): a
// buffer cannot grow then (the old block's cudaFree would wait for the
// device, which a recording cannot hold), so reserve() refuses instead
inline thread_local bool t_recording_graph = false;

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

  // at least `bytes` (contents are not kept when it grows)
  absl::Status reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (t_recording_graph)
      return absl::FailedPreconditionError("a device buffer would grow while a graph is recorded");
    release();
    if (const cudaError_t e = cudaMalloc(&p_, bytes); e != cudaSuccess) {
      p_ = nullptr;
      cudaGetLastError();  // not sticky: the next launch must not report it as its own
      return cuda_status(e, "cudaMalloc", __FILE__, __LINE__);
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void release() {
    // work still queued may read the old block: let it finish first
    if (p_ != nullptr) {
      cudaDeviceSynchronize();
      cudaFree(p_);
    }
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace wm::cuda
