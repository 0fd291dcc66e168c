#include "cuda/gemm.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/bias_add.cuh"
#include "cuda/convert.cuh"
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
  if (tune_begin_ != nullptr) cudaEventDestroy(tune_begin_);
  if (tune_end_ != nullptr) cudaEventDestroy(tune_end_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

absl::StatusOr<cublasLtMatmulPreference_t> Gemm::preference() const {
  cublasLtMatmulPreference_t pref = nullptr;
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.size();
  const cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreferenceDestroy(pref);
    return absl::InternalError(absl::StrCat("cuBLASLt preference: status ", static_cast<int>(st)));
  }
  return pref;
}

void Gemm::set_autotune(bool on) {
  autotune_ = on;
  if (on) return;
  for (auto& [key, p] : plans_) {
    p.algo = p.heuristic;
    p.tuned = false;
  }
}

cublasStatus_t Gemm::matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const uint16_t* w, const uint16_t* x,
                            void* out) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(lt_, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &algo, workspace_.get(),
                        workspace_.size(), stream_);
}

absl::Status Gemm::tune(Plan& p, const uint16_t* w, const uint16_t* x, void* out) {
  if (!autotune_ || p.tuned || t_recording_graph) return absl::OkStatus();
  p.tuned = true;  // once per plan, whatever comes of it
  auto gemm = [&](const cublasLtMatmulAlgo_t& algo) { return matmul(p, algo, w, x, out); };
  absl::StatusOr<cublasLtMatmulPreference_t> pref = preference();
  if (!pref.ok()) return absl::OkStatus();  // no candidates to time: the heuristic's choice runs
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, *pref, kCandidates,
                                                           results, &found);
  cublasLtMatmulPreferenceDestroy(*pref);
  if (st != CUBLAS_STATUS_SUCCESS || found < 2) return absl::OkStatus();  // nothing to choose from
  if (tune_begin_ == nullptr) WM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&tune_begin_));
  if (tune_end_ == nullptr) WM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&tune_end_));
  int best = -1;
  float best_ms = 0.0f;
  for (int i = 0; i < found; ++i) {
    // an algorithm the call refuses is passed over (the output is written by the real call after)
    if (results[i].state != CUBLAS_STATUS_SUCCESS || gemm(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
    WM_CUDA_RETURN_IF_ERROR(cudaEventRecord(tune_begin_, stream_));
    bool ran = true;
    for (int r = 0; r < kTimedRuns && ran; ++r) ran = gemm(results[i].algo) == CUBLAS_STATUS_SUCCESS;
    WM_CUDA_RETURN_IF_ERROR(cudaEventRecord(tune_end_, stream_));
    WM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(tune_end_));
    float ms = 0.0f;
    WM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, tune_begin_, tune_end_));
    if (ran && (best < 0 || ms < best_ms)) {
      best = i;
      best_ms = ms;
    }
  }
  if (best < 0) return absl::OkStatus();
  p.algo = results[best].algo;
  ++autotuned_plans_;
  if (best != 0) ++autotune_changes_;
  return absl::OkStatus();
}

void Gemm::destroy(Plan& p) {
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

absl::Status Gemm::describe(Plan& p, const Shape& s, Output output, bool bias_epilogue, cudaDataType_t bias_type) {
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const bool gelu = output == Output::kBf16Gelu;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu) epi = bias_epilogue ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  else if (bias_epilogue) epi = CUBLASLT_EPILOGUE_BIAS;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (bias_epilogue)
    WM_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  // A = W stored column-major [in x out] (ld_w), used transposed: out x in
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, s.in, s.out, s.ld_w));
  // B = x stored column-major [in x n] (ld_x)
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, s.in, s.n, s.ld_x));
  // C = D = y stored column-major [out x n] (ld_y)
  WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, gelu ? CUDA_R_16BF : CUDA_R_32F, s.out, s.n, s.ld_y));
  absl::StatusOr<cublasLtMatmulPreference_t> pref = preference();
  if (!pref.ok()) return absl::OkStatus();  // no preference, no algorithm: usable stays false
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, *pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(*pref);
  // no algorithm is not an error: the caller tries the next way
  p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  p.bias_in_epilogue = bias_epilogue;
  p.bias_bf16 = bias_epilogue && bias_type == CUDA_R_16BF;
  if (p.usable) p.algo = p.heuristic = result.algo;
  return absl::OkStatus();
}

absl::Status Gemm::try_describe(Plan& p, const Shape& s, Output output, bool bias_epilogue,
                                cudaDataType_t bias_type) {
  destroy(p);
  absl::Status st = describe(p, s, output, bias_epilogue, bias_type);
  if (!st.ok() || !p.usable) destroy(p);  // whatever descriptors it made; usable stays false
  return st;
}

absl::StatusOr<Gemm::Plan*> Gemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  const auto [n, in, out, ld_w, ld_x, ld_y, has_bias, output] = key;
  const Shape shape{n, in, out, ld_w, ld_x, ld_y};
  Plan p;
  absl::Status s;
  if (output == Output::kF32) {
    // best: bias in the epilogue; else a plain GEMM and a bias kernel; else the CUDA-core kernel
    s = try_describe(p, shape, output, has_bias, CUDA_R_32F);
    if (s.ok() && !p.usable && has_bias) {
      s = try_describe(p, shape, output, false, CUDA_R_32F);
      if (s.ok() && p.usable)
        std::fprintf(stderr, "wm_cuda: cuBLASLt has no bias epilogue for n=%d in=%d out=%d: GEMM + bias kernel\n", n,
                     in, out);
    }
    if (s.ok() && !p.usable)
      std::fprintf(stderr, "wm_cuda: cuBLASLt has no algorithm for n=%d in=%d out=%d: CUDA-core fallback GEMM\n", n,
                   in, out);
  } else {
    // the bias as fp32 (what the other GEMMs add), else as bf16 (cuBLASLt's
    // documented default: the output's type); else the caller runs unfused ops
    // (a refused descriptor attribute counts as no algorithm: the unfused ops always work)
    s = try_describe(p, shape, output, has_bias, CUDA_R_32F);
    if (!p.usable && has_bias) s = try_describe(p, shape, output, true, CUDA_R_16BF);
    if (!p.usable)
      std::fprintf(stderr, "wm_cuda: cuBLASLt has no GELU epilogue with a bf16 output for n=%d in=%d out=%d%s%s: "
                   "GEMM, GELU kernel\n", n, in, out, s.ok() ? "" : " ", s.ok() ? "" : std::string(s.message()).c_str());
    s = absl::OkStatus();
  }
  if (!s.ok()) return s;
  return &plans_.emplace(key, p).first->second;
}

absl::Status Gemm::run(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x, const float* bias,
                       int32_t n, int32_t in, int32_t out, float* y) {
  if (n <= 0 || out <= 0) return absl::OkStatus();
  if (!force_fallback_) {
    absl::StatusOr<Plan*> p = plan(Key{n, in, out, ld_w, ld_x, out, bias != nullptr, Output::kF32});
    if (!p.ok()) return p.status();
    Plan& pl = **p;
    if (pl.usable) {
      if (pl.bias_in_epilogue)
        WM_CUBLAS_RETURN_IF_ERROR(
            cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      // the heuristic chose for outputs on kOutputAlignment: a less aligned y
      // (the rows of one session inside a batch) gets the result through an
      // aligned buffer, so the same algorithm computes it (the same values)
      const size_t y_bytes = static_cast<size_t>(n) * out * sizeof(float);
      float* d = y;
      if (reinterpret_cast<uintptr_t>(y) % kOutputAlignment != 0) {
        realigned_widest_ = std::max(realigned_widest_, out);
        if (absl::Status r = aligned_out_.reserve(y_bytes); !r.ok()) return r;
        d = aligned_out_.as<float>();
      }
      if (absl::Status s = tune(pl, w, x, d); !s.ok()) return s;
      const cublasStatus_t st = matmul(pl, pl.algo, w, x, d);
      if (st == CUBLAS_STATUS_SUCCESS) {
        ++cublaslt_calls_;
        if (d != y) {
          WM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, d, y_bytes, cudaMemcpyDeviceToDevice, stream_));
          ++realigned_outputs_;
        }
        if (bias != nullptr && !pl.bias_in_epilogue)
          WM_CUDA_RETURN_IF_ERROR(launch_bias_add(y, bias, n, out, stream_));
        return absl::OkStatus();
      }
      // while a graph is recorded a failure may be the recording's (a call that
      // broke the capture fails every later launch): the plan stays, the
      // recording fails, and the pass runs again without one
      if (t_recording_graph)
        return absl::FailedPreconditionError(absl::StrCat("cublasLtMatmul failed while recording (status ",
                                                          static_cast<int>(st), ")"));
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

absl::StatusOr<bool> Gemm::reserve_realigned(int64_t rows) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(rows, 0)) * realigned_widest_ * sizeof(float);
  if (bytes <= aligned_out_.size()) return false;
  if (absl::Status s = aligned_out_.reserve(bytes); !s.ok()) return s;
  return true;
}

absl::StatusOr<bool> Gemm::run_gelu_bf16(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x,
                                         const float* bias, int32_t n, int32_t in, int32_t out, uint16_t* y,
                                         int32_t ld_y) {
  if (n <= 0 || out <= 0) return true;
  if (force_fallback_) return false;
  absl::StatusOr<Plan*> p = plan(Key{n, in, out, ld_w, ld_x, ld_y, bias != nullptr, Output::kBf16Gelu});
  if (!p.ok()) return p.status();
  Plan& pl = **p;
  if (!pl.usable) return false;
  const void* epilogue_bias = bias;
  if (pl.bias_bf16) {
    absl::Status s = bias_bf16_.reserve(static_cast<size_t>(out) * sizeof(uint16_t));
    if (!s.ok()) return s;
    WM_CUDA_RETURN_IF_ERROR(launch_f32_to_bf16(bias, 1, out, out, bias_bf16_.as<uint16_t>(), stream_));
    epilogue_bias = bias_bf16_.get();
  }
  if (pl.bias_in_epilogue)
    WM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                             &epilogue_bias, sizeof(epilogue_bias)));
  if (absl::Status s = tune(pl, w, x, y); !s.ok()) return s;
  const cublasStatus_t st = matmul(pl, pl.algo, w, x, y);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (t_recording_graph)  // perhaps the recording's failure, not the plan's (see run)
      return absl::FailedPreconditionError(absl::StrCat("cublasLtMatmul failed while recording (status ",
                                                        static_cast<int>(st), ")"));
    // nothing was written: retire the plan, the caller runs the unfused ops
    std::fprintf(stderr, "wm_cuda: cublasLtMatmul refused the GELU epilogue for n=%d in=%d out=%d (status %d)\n", n,
                 in, out, static_cast<int>(st));
    pl.usable = false;
    return false;
  }
  ++cublaslt_calls_;
  ++gelu_epilogue_calls_;
  return true;
}

}  // namespace wm::cuda
