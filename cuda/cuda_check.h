// Status plumbing for CUDA runtime and cuBLASLt calls in the plugin's host
// code: every call is checked and a failure becomes an absl::Status naming
// the call, the file and the line (STYLE.md 12).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wm::cuda {

inline absl::Status cuda_status(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

inline absl::Status cublas_status(cublasStatus_t e, const char* what, const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", what, ": cuBLAS status ", static_cast<int>(e)));
}

}  // namespace wm::cuda

// the call's status, for code that must clean up before it returns
#define WM_CUDA_STATUS(expr) ::wm::cuda::cuda_status((expr), #expr, __FILE__, __LINE__)

#define WM_CUDA_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                    \
    ::absl::Status wm_cuda_status_ = ::wm::cuda::cuda_status((expr), #expr, __FILE__, __LINE__); \
    if (!wm_cuda_status_.ok()) return wm_cuda_status_;                                    \
  } while (0)

#define WM_CUBLAS_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                       \
    ::absl::Status wm_cuda_status_ = ::wm::cuda::cublas_status((expr), #expr, __FILE__, __LINE__); \
    if (!wm_cuda_status_.ok()) return wm_cuda_status_;                                       \
  } while (0)
