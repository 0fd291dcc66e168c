// The cuBLASLt subset the plugin's Gemm (cuda/gemm.cc) calls, for the
// emulated device (device_runtime.h), written from cuBLASLt's documented
// semantics rather than from how gemm.cc uses it:
//
//   D = alpha op(A) op(B) + beta C  (+ bias[i] on row i with the BIAS epilogue)
//   D = GELU(alpha op(A) op(B) + beta C (+ bias[i]))  with GELU / GELU_BIAS
//
// every matrix column-major with its layout's rows, cols and leading
// dimension; op(X) = X or X^T per TRANSA/TRANSB; A, B bf16; C and D of one
// type, fp32 or bf16 (rounded to nearest even from the fp32 result); the
// bias fp32 or bf16 (by default the type of D, as documented); GELU is the
// tanh form; compute and scale fp32. Anything else (other types, orders,
// epilogues, attributes) is CUBLAS_STATUS_NOT_SUPPORTED, shapes that do not chain are
// CUBLAS_STATUS_INVALID_VALUE, and descriptors are tracked: using or
// destroying one that is not alive aborts with a message (on a GPU it is
// undefined behaviour).
#include <cblas.h>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "device_runtime.h"

struct cublasLtContext {
  int unused = 0;
};

namespace {

struct Desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool bias_type_set = false;  // else the bias has D's type
  cudaDataType_t bias_type = CUDA_R_32F;
  const void* bias = nullptr;
};

struct Layout {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

struct Pref {
  size_t max_workspace = 0;
};

struct Live {
  std::mutex mu;
  std::set<const void*> objects;
};

Live& live() {
  static Live* l = new Live();
  return *l;
}

template <class T>
T* make() {
  T* p = new T();
  std::lock_guard<std::mutex> lock(live().mu);
  live().objects.insert(p);
  return p;
}

void check_alive(const void* p, const char* call) {
  std::lock_guard<std::mutex> lock(live().mu);
  if (live().objects.count(p) == 0) {
    std::fprintf(stderr, "simt cuBLASLt: %s on an object that is not alive (never created, or destroyed)\n", call);
    std::abort();
  }
}

template <class T>
cublasStatus_t destroy(T* p, const char* call) {
  if (p == nullptr) return CUBLAS_STATUS_SUCCESS;
  check_alive(p, call);
  {
    std::lock_guard<std::mutex> lock(live().mu);
    live().objects.erase(p);
  }
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

template <class T>
bool get(const void* buf, size_t size, T* out) {
  if (size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

float bf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// round to nearest even (what the GPU's cvt.rn.bf16.f32 does; NaN stays NaN)
uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float gelu_tanh(float v) { return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v))); }

// op(X) as a dense row-major [r][k] float matrix, X a bf16 column-major layout
std::vector<float> op_rows(const uint16_t* x, const Layout& l, bool trans, uint64_t* r, uint64_t* k) {
  *r = trans ? l.cols : l.rows;
  *k = trans ? l.rows : l.cols;
  std::vector<float> m(*r * *k);
  for (uint64_t i = 0; i < *r; ++i)
    for (uint64_t j = 0; j < *k; ++j) {
      const uint64_t row = trans ? j : i, col = trans ? i : j;  // in X's storage
      m[i * *k + j] = bf16(x[row + col * static_cast<uint64_t>(l.ld)]);
    }
  return m;
}

// the product itself (below cublasLtMatmul, which runs it now or records it)
void matmul(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, float al, float be,
            const void* A, const void* B, const void* C, void* D);

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = make<cublasLtContext>();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return destroy(h, "cublasLtDestroy"); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  Desc* p = make<Desc>();
  p->compute = compute;
  p->scale = scale;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  return destroy(reinterpret_cast<Desc*>(d), "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  check_alive(d, "cublasLtMatmulDescSetAttribute");
  Desc* p = reinterpret_cast<Desc*>(d);
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      ok = get(buf, size, &p->transa);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      ok = get(buf, size, &p->transb);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      ok = get(buf, size, &p->epilogue) &&
           (p->epilogue == CUBLASLT_EPILOGUE_DEFAULT || p->epilogue == CUBLASLT_EPILOGUE_BIAS ||
            p->epilogue == CUBLASLT_EPILOGUE_GELU || p->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      int32_t t = -1;
      ok = get(buf, size, &t) && (t == -1 || t == CUDA_R_32F || t == CUDA_R_16BF);
      if (ok) {
        p->bias_type_set = t != -1;
        if (t != -1) p->bias_type = static_cast<cudaDataType_t>(t);
      }
      break;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      ok = get(buf, size, &p->bias);
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!ok) return CUBLAS_STATUS_INVALID_VALUE;
  if ((p->transa != CUBLAS_OP_N && p->transa != CUBLAS_OP_T) ||
      (p->transb != CUBLAS_OP_N && p->transb != CUBLAS_OP_T))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* m, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (type != CUDA_R_16BF && type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < static_cast<int64_t>(rows) || ld <= 0) return CUBLAS_STATUS_INVALID_VALUE;
  Layout* p = make<Layout>();
  p->type = type;
  p->rows = rows;
  p->cols = cols;
  p->ld = ld;
  *m = reinterpret_cast<cublasLtMatrixLayout_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t m) {
  return destroy(reinterpret_cast<Layout*>(m), "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(make<Pref>());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  return destroy(reinterpret_cast<Pref*>(p), "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  check_alive(p, "cublasLtMatmulPreferenceSetAttribute");
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_NOT_SUPPORTED;
  uint64_t v = 0;
  if (!get(buf, size, &v)) return CUBLAS_STATUS_INVALID_VALUE;
  reinterpret_cast<Pref*>(p)->max_workspace = v;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// the shapes chain: op(A) m x k, op(B) k x n, C and D m x n; the types are the supported ones
cublasStatus_t check_problem(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl) {
  if (a.type != CUDA_R_16BF || b.type != CUDA_R_16BF || c.type != dl.type ||
      (dl.type != CUDA_R_32F && dl.type != CUDA_R_16BF))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t m = d.transa == CUBLAS_OP_T ? a.cols : a.rows, ka = d.transa == CUBLAS_OP_T ? a.rows : a.cols;
  const uint64_t kb = d.transb == CUBLAS_OP_T ? b.cols : b.rows, n = d.transb == CUBLAS_OP_T ? b.rows : b.cols;
  if (ka != kb || c.rows != m || c.cols != n || dl.rows != m || dl.cols != n) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// what a real cuBLASLt may not offer, refused on request so that tests reach
// the plugin's other paths: WM_SIMT_CUBLASLT_REFUSE=gelu (every GELU
// epilogue) or gelu_f32_bias (a GELU epilogue with an fp32 bias and a bf16
// output, which cuBLASLt documents the bias type of as the output's)
bool refused(const Desc& d, const Layout& dl) {
  const char* what = std::getenv("WM_SIMT_CUBLASLT_REFUSE");
  if (what == nullptr) return false;
  const bool gelu = d.epilogue == CUBLASLT_EPILOGUE_GELU || d.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (std::strcmp(what, "gelu") == 0) return gelu;
  if (std::strcmp(what, "gelu_f32_bias") == 0)
    return d.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS && dl.type == CUDA_R_16BF &&
           (d.bias_type_set ? d.bias_type : dl.type) == CUDA_R_32F;
  return false;
}

}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  for (const void* p : {static_cast<const void*>(h), static_cast<const void*>(op), static_cast<const void*>(a),
                        static_cast<const void*>(b), static_cast<const void*>(c), static_cast<const void*>(d),
                        static_cast<const void*>(pref)})
    check_alive(p, "cublasLtMatmulAlgoGetHeuristic");
  *returned = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st =
      check_problem(*reinterpret_cast<Desc*>(op), *reinterpret_cast<Layout*>(a), *reinterpret_cast<Layout*>(b),
                    *reinterpret_cast<Layout*>(c), *reinterpret_cast<Layout*>(d));
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (refused(*reinterpret_cast<Desc*>(op), *reinterpret_cast<Layout*>(d))) return CUBLAS_STATUS_NOT_SUPPORTED;
  // kAlgorithms candidates, told apart by their first word; every one computes the same
  // (the emulator has one way to multiply), so a choice among them changes no value
  constexpr int kAlgorithms = 3;
  *returned = std::min(requested, kAlgorithms);
  for (int i = 0; i < *returned; ++i) {
    results[i] = cublasLtMatmulHeuristicResult_t{};
    results[i].algo.data[0] = static_cast<uint64_t>(i);
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].workspaceSize = 0;
    results[i].wavesCount = 1.0f;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t adesc, const void* B, cublasLtMatrixLayout_t bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t cdesc, void* D,
                              cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t*, void*, size_t,
                              cudaStream_t) {
  for (const void* p : {static_cast<const void*>(h), static_cast<const void*>(op), static_cast<const void*>(adesc),
                        static_cast<const void*>(bdesc), static_cast<const void*>(cdesc),
                        static_cast<const void*>(ddesc)})
    check_alive(p, "cublasLtMatmul");
  // the descriptors and scalars as they are now: a recorded matmul runs later with these
  const Desc d = *reinterpret_cast<Desc*>(op);
  const Layout a = *reinterpret_cast<Layout*>(adesc), b = *reinterpret_cast<Layout*>(bdesc),
               c = *reinterpret_cast<Layout*>(cdesc), dl = *reinterpret_cast<Layout*>(ddesc);
  const cublasStatus_t st = check_problem(d, a, b, c, dl);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const bool has_bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (has_bias && d.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  auto run = [=] {
    matmul(d, a, b, c, dl, al, be, A, B, C, D);
    return cudaSuccess;
  };
  if (wm::simt::recording_invalidated()) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (wm::simt::recording()) {
    wm::simt::record(run);
    return CUBLAS_STATUS_SUCCESS;
  }
  run();
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

void matmul(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl, float al, float be,
            const void* A, const void* B, const void* C, void* D) {
  const bool has_bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool gelu = d.epilogue == CUBLASLT_EPILOGUE_GELU || d.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  const cudaDataType_t bias_type = d.bias_type_set ? d.bias_type : dl.type;
  uint64_t m = 0, ka = 0, n = 0, kb = 0;
  // op(A) as rows of k; op(B)^T as rows of k, so every dot product reads both contiguously
  const std::vector<float> opa = op_rows(static_cast<const uint16_t*>(A), a, d.transa == CUBLAS_OP_T, &m, &ka);
  const std::vector<float> opbt = op_rows(static_cast<const uint16_t*>(B), b, d.transb != CUBLAS_OP_T, &n, &kb);
  // R = op(A) op(B), row-major m x n, in fp32 as the GPU accumulates
  std::vector<float> r(m * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(ka),
              1.0f, opa.data(), static_cast<int>(ka), opbt.data(), static_cast<int>(ka), 0.0f, r.data(),
              static_cast<int>(n));
  const bool half = dl.type == CUDA_R_16BF;
  auto bias_at = [&](uint64_t i) {
    return bias_type == CUDA_R_16BF ? bf16(static_cast<const uint16_t*>(d.bias)[i])
                                    : static_cast<const float*>(d.bias)[i];
  };
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      float v = al * r[i * n + j];
      const uint64_t ci = i + j * static_cast<uint64_t>(c.ld), di = i + j * static_cast<uint64_t>(dl.ld);
      if (be != 0.0f) v += be * (half ? bf16(static_cast<const uint16_t*>(C)[ci]) : static_cast<const float*>(C)[ci]);
      if (has_bias) v += bias_at(i);
      if (gelu) v = gelu_tanh(v);
      if (half)
        static_cast<uint16_t*>(D)[di] = to_bf16(v);
      else
        static_cast<float*>(D)[di] = v;
    }
}

}  // namespace
