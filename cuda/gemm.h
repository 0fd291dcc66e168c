// y[n, out] = x[n, in] W^T + b through cuBLASLt (bf16 operands, fp32
// accumulate, fp32 output with the bias added in the epilogue), falling back
// to linear_fallback.cu where cuBLASLt offers no algorithm. Row-major
// y = x W^T is column-major y^T = W x^T: a "TN" GEMM with M = out, N = n, K = in.
// Plugin host code; one instance per backend, used by one thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "cuda/device_buffer.h"

namespace wm::cuda {

class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> create(cudaStream_t stream, size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // w: [out, ld_w] bf16, x: [n, ld_x] bf16 (first `in` columns used),
  // bias: [out] fp32 or null, y: [n, out] fp32; every pointer device memory
  absl::Status run(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x, const float* bias, int32_t n,
                   int32_t in, int32_t out, float* y);
  void set_force_fallback(bool on) { force_fallback_ = on; }
  // GEMMs that ran on the fallback kernel so far (tests check the path they meant)
  int64_t fallback_calls() const { return fallback_calls_; }
  int64_t cublaslt_calls() const { return cublaslt_calls_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
    bool bias_in_epilogue = false;  // else a bias kernel runs after the GEMM
  };
  using Key = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, bool>;  // n, in, out, ld_w, ld_x, bias
  Gemm(cudaStream_t stream) : stream_(stream) {}
  absl::StatusOr<Plan*> plan(const Key& key);
  // a descriptor and the heuristic's best algorithm, with or without the bias epilogue
  absl::Status describe(Plan& p, int32_t n, int32_t in, int32_t out, int32_t ld_w, int32_t ld_x, bool bias_epilogue);
  static void destroy(Plan& p);

  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer workspace_;
  std::map<Key, Plan> plans_;
  bool force_fallback_ = false;
  int64_t fallback_calls_ = 0;
  int64_t cublaslt_calls_ = 0;
};

}  // namespace wm::cuda
