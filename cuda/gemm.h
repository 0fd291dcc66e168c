// y[n, out] = x[n, in] W^T + b through cuBLASLt (bf16 operands, fp32
// accumulate, fp32 output with the bias added in the epilogue), falling back
// to linear_fallback.cu where cuBLASLt offers no algorithm. Row-major
// y = x W^T is column-major y^T = W x^T: a "TN" GEMM with M = out, N = n, K = in.
// Plugin host code; one instance per backend, used by one thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
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
  // y_bf16[n, ld_y] = bf16(GELU_tanh(x W^T + b)) with the GELU (and the
  // bias) in cuBLASLt's epilogue, for the feed-forward block's hidden layer;
  // false when cuBLASLt offers no such algorithm here (or the fallback is
  // forced): the caller runs the unfused ops instead
  absl::StatusOr<bool> run_gelu_bf16(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x,
                                     const float* bias, int32_t n, int32_t in, int32_t out, uint16_t* y,
                                     int32_t ld_y);
  void set_force_fallback(bool on) { force_fallback_ = on; }
  // on: a plan's first GEMM outside a recording times up to kCandidates of
  // the heuristic's algorithms on its own operands (kTimedRuns each, after
  // one that warms it up) and keeps the fastest; off: every plan back on the
  // heuristic's first. Off by default: the choice follows one moment's
  // timings, so two processes may round a GEMM differently.
  void set_autotune(bool on);
  static constexpr int kCandidates = 8, kTimedRuns = 3;
  // plans timed so far, and of those the ones that left the heuristic's first
  int64_t autotuned_plans() const { return autotuned_plans_; }
  int64_t autotune_changes() const { return autotune_changes_; }
  // GEMMs that ran on the fallback kernel so far (tests check the path they meant)
  int64_t fallback_calls() const { return fallback_calls_; }
  int64_t cublaslt_calls() const { return cublaslt_calls_; }
  // of those, GEMMs with the GELU epilogue and a bf16 output
  int64_t gelu_epilogue_calls() const { return gelu_epilogue_calls_; }
  // of those, GEMMs whose output was not on kOutputAlignment (computed in an
  // aligned buffer and copied)
  int64_t realigned_outputs() const { return realigned_outputs_; }
  // the output alignment cuBLASLt's heuristic assumes when not told (its
  // documented default for CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES)
  static constexpr uintptr_t kOutputAlignment = 256;
  // makes the aligned output buffer big enough for `rows` rows of the
  // widest output realigned so far (a recorded pass cannot grow it); true
  // if it grew (moved)
  absl::StatusOr<bool> reserve_realigned(int64_t rows);

 private:
  // what a GEMM writes: fp32 (+ bias), or bf16 GELU(+ bias)
  enum class Output : int32_t { kF32 = 0, kBf16Gelu = 1 };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};       // what runs
    cublasLtMatmulAlgo_t heuristic{};  // the heuristic's first (algo, until timed)
    bool tuned = false;                // the candidates were timed (set_autotune)
    bool usable = false;
    bool bias_in_epilogue = false;  // else a bias kernel runs after the GEMM
    bool bias_bf16 = false;         // the epilogue reads a bf16 copy of the bias
  };
  // n, in, out, ld_w, ld_x, ld_y, bias, output
  using Key = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, bool, Output>;
  struct Shape {
    int32_t n, in, out, ld_w, ld_x, ld_y;
  };
  Gemm(cudaStream_t stream) : stream_(stream) {}
  absl::StatusOr<Plan*> plan(const Key& key);
  // a descriptor and the heuristic's best algorithm for one epilogue
  absl::Status describe(Plan& p, const Shape& s, Output output, bool bias_epilogue, cudaDataType_t bias_type);
  // describe() that leaves nothing behind when it fails
  absl::Status try_describe(Plan& p, const Shape& s, Output output, bool bias_epilogue, cudaDataType_t bias_type);
  static void destroy(Plan& p);
  // out = x W^T by plan p with algorithm algo (C = D = out, beta 0)
  cublasStatus_t matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const uint16_t* w, const uint16_t* x,
                        void* out);
  // with autotune on and p not yet timed (and no recording): times the
  // heuristic's candidates on these operands (writing out, which the call
  // after overwrites) and keeps the fastest in p.algo
  absl::Status tune(Plan& p, const uint16_t* w, const uint16_t* x, void* out);
  // the preference every query uses: at most the workspace's bytes
  absl::StatusOr<cublasLtMatmulPreference_t> preference() const;

  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer bias_bf16_;    // the bias of a GELU GEMM whose epilogue wants it in bf16
  DeviceBuffer aligned_out_;  // run()'s output where y is not on kOutputAlignment
  int32_t realigned_widest_ = 0;  // the widest output (columns) computed there
  std::map<Key, Plan> plans_;
  bool force_fallback_ = false;
  bool autotune_ = false;
  cudaEvent_t tune_begin_ = nullptr, tune_end_ = nullptr;  // made at the first tuning
  int64_t autotuned_plans_ = 0;
  int64_t autotune_changes_ = 0;
  int64_t fallback_calls_ = 0;
  int64_t cublaslt_calls_ = 0;
  int64_t realigned_outputs_ = 0;
  int64_t gelu_epilogue_calls_ = 0;
};

}  // namespace wm::cuda
