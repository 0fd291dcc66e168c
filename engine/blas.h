// OpenBLAS, loaded with dlopen on first use rather than linked.
//
// glibc carves a thread's static TLS out of the stack the thread asked for,
// and a linked OpenBLAS brings 60 KB of static TLS. civetweb, the HTTP
// server under the Prometheus endpoint, gives its workers 100 KB stacks, so
// the 40 KB left overflowed on any request answered with an HTTP error
// (a browser's /favicon.ico, a POST) and took the whole server down. A
// dlopen'ed library gets dynamic TLS, allocated apart from thread stacks
// (the same reason the CUDA code is a plugin: docs/CUDA.md).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace wm::blas {

// loads the library (once); FAILED_PRECONDITION saying what is missing
absl::Status load();

// row-major C[m, n] = alpha A[m, k] B[n, k]^T + beta C (cblas_sgemm, NoTrans, Trans);
// aborts with load()'s message when the library is missing
void sgemm_nt(int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
              float* c, int ldc);
// OpenBLAS's own threads
void set_threads(int n);
// which library was loaded and how it threads, for the start-up line:
// "OpenBLAS /usr/lib/.../libopenblas.so.0 (OpenMP)"; load()'s message when missing
std::string describe();

}  // namespace wm::blas
