#include "cuda/gemm.h"

#include <cstdio>

#include "cuda/bias_add.cuh"
#include "cuda/cuda_check.h"
#include "cuda/linear_fallback.cuh"

namespace wm::cuda {

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::create(cudaStream_t stream, size_t workspace_bytes) {
  std::unique_ptr<Gemm> g(new Gemm(stream));
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&g->lt_));
  if (workspace_bytes > 0) {
    absl::Status s = g->workspace_.reserve(workspace_bytes);
    if (!s.ok()) return s;
  }
  return g;
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) destroy(p);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

void Gemm::destroy(Plan& p) {
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

absl::Status Gemm::describe(Plan& p, int32_t n, int32_t in, int32_t out, int32_t ld_w, int32_t ld_x,
                           bool bias_epilogue) {
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias_epilogue) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_32F;
    WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    WM_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // A = W stored column-major [in x out] (ld_w), used transposed: out x in
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, in, out, ld_w));
  // B = x stored column-major [in x n] (ld_x)
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, in, n, ld_x));
  // C = D = y stored column-major [out x n] (ld out)
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, out, n, out));
  cublasLtMatmulPreference_t pref = nullptr;
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.size();
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // no algorithm is not an error: the caller tries the next way
  p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  p.bias_in_epilogue = bias_epilogue;
  if (p.usable) p.algo = result.algo;
  return absl::OkStatus();
}

absl::StatusOr<Gemm::Plan*> Gemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  const auto [n, in, out, ld_w, ld_x, has_bias] = key;
  // best: bias in the epilogue; else a plain GEMM and a bias kernel; else the CUDA-core kernel
  Plan p;
  absl::Status s = describe(p, n, in, out, ld_w, ld_x, has_bias);
  if (!s.ok()) {
    destroy(p);  // whatever descriptors it made before failing
    return s;
  }
  if (!p.usable && has_bias) {
    destroy(p);
    s = describe(p, n, in, out, ld_w, ld_x, false);
    if (!s.ok()) {
      destroy(p);
      return s;
    }
    if (p.usable)
      std::fprintf(stderr, "wm_cuda: cuBLASLt has no bias epilogue for n=%d in=%d out=%d: GEMM + bias kernel\n", n,
                   in, out);
  }
  if (!p.usable)
    std::fprintf(stderr, "wm_cuda: cuBLASLt has no algorithm for n=%d in=%d out=%d: CUDA-core fallback GEMM\n", n,
                 in, out);
  return &plans_.emplace(key, p).first->second;
}

absl::Status Gemm::run(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x, const float* bias,
                       int32_t n, int32_t in, int32_t out, float* y) {
  if (n <= 0 || out <= 0) return absl::OkStatus();
  if (!force_fallback_) {
    absl::StatusOr<Plan*> p = plan(Key{n, in, out, ld_w, ld_x, bias != nullptr});
    if (!p.ok()) return p.status();
    Plan& pl = **p;
    if (pl.usable) {
      if (pl.bias_in_epilogue)
        WM_CUBLAS_RETURN_IF_ERROR(
            cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      const float alpha = 1.0f, beta = 0.0f;
      const cublasStatus_t st = cublasLtMatmul(lt_, pl.op, &alpha, w, pl.a, x, pl.b, &beta, y, pl.c, y, pl.c,
                                               &pl.algo, workspace_.get(), workspace_.size(), stream_);
      if (st == CUBLAS_STATUS_SUCCESS) {
        ++cublaslt_calls_;
        if (bias != nullptr && !pl.bias_in_epilogue)
          WM_CUDA_RETURN_IF_ERROR(launch_bias_add(y, bias, n, out, stream_));
        return absl::OkStatus();
      }
      // a launch-time refusal retires the plan; the fallback below takes over
      std::fprintf(stderr, "wm_cuda: cublasLtMatmul refused n=%d in=%d out=%d (status %d): CUDA-core fallback GEMM\n",
                   n, in, out, static_cast<int>(st));
      pl.usable = false;
    }
  }
  ++fallback_calls_;
  WM_CUDA_RETURN_IF_ERROR(launch_linear_fallback(w, ld_w, x, ld_x, bias, n, in, out, y, stream_));
  return absl::OkStatus();
}

}  // namespace wm::cuda
