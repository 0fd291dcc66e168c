#include "engine/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace wm::blas {
namespace {

struct Library {
  absl::Status status;
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_threads = nullptr;
};

const Library& library() {
  static const Library* lib = [] {
    auto* l = new Library();
    std::string tried;
    // the runtime package's name (Debian: libopenblas0), then the development link
    for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
      void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* why = dlerror();
        absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
        continue;
      }
      l->sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(h, "cblas_sgemm"));
      l->set_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(h, "openblas_set_num_threads"));
      if (l->sgemm != nullptr && l->set_threads != nullptr) return l;
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", name, " has no cblas_sgemm/openblas_set_num_threads");
    }
    l->status = absl::FailedPreconditionError(
        absl::StrCat("cannot load OpenBLAS (", tried, "): install it with tools/install-deps.sh"));
    return l;
  }();
  return *lib;
}

const Library& loaded() {
  const Library& l = library();
  if (!l.status.ok()) {
    std::fprintf(stderr, "wmserve: fatal: %s\n", std::string(l.status.message()).c_str());
    std::abort();
  }
  return l;
}

}  // namespace

absl::Status load() { return library().status; }

void sgemm_nt(int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
              float* c, int ldc) {
  loaded().sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_threads(int n) { loaded().set_threads(n); }

}  // namespace wm::blas
