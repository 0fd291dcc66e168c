#include "engine/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace wm::blas {
namespace {

struct Library {
  absl::Status status;
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_threads = nullptr;
  std::string path;   // the name it was loaded by
  int parallel = -1;  // openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP
};

// Where to look, in order. OpenBLAS built on OpenMP comes first: the CPU
// backend's own loops are OpenMP, so the GEMMs then share its one pool of
// workers, which sleep between loops (OMP_WAIT_POLICY=passive). The
// pthreads build keeps a second pool whose workers spin on sched_yield
// after each GEMM and take the cores from the OpenMP loops that follow
// (docs/PERFORMANCE.md, "OpenBLAS's threads"). Debian installs the OpenMP
// build (libopenblas0-openmp) beside the default one, in its own folder;
// WM_OPENBLAS names a library to use instead of all of these.
const char* override_path() {
  const char* env = std::getenv("WM_OPENBLAS");
  return env != nullptr && *env != '\0' ? env : nullptr;
}

std::vector<std::string> candidates() {
  if (const char* path = override_path(); path != nullptr) return {path};
  std::vector<std::string> names;
#ifdef WM_MULTIARCH
  names.push_back(std::string("/usr/lib/") + WM_MULTIARCH + "/openblas-openmp/libopenblas.so.0");
#endif
  // the runtime package's name (Debian: libopenblas0), then the development link
  names.push_back("libopenblas.so.0");
  names.push_back("libopenblas.so");
  return names;
}

const Library& library() {
  static const Library* lib = [] {
    auto* l = new Library();
    std::string tried;
    for (const std::string& name : candidates()) {
      void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* why = dlerror();
        absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
        continue;
      }
      l->sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(h, "cblas_sgemm"));
      l->set_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(h, "openblas_set_num_threads"));
      if (l->sgemm != nullptr && l->set_threads != nullptr) {
        l->path = name;
        if (auto get = reinterpret_cast<int (*)()>(dlsym(h, "openblas_get_parallel")); get != nullptr)
          l->parallel = get();
        return l;
      }
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", name, " has no cblas_sgemm/openblas_set_num_threads");
    }
    l->status = absl::FailedPreconditionError(
        absl::StrCat("cannot load OpenBLAS (", tried, "): ",
                     override_path() != nullptr
                         ? "WM_OPENBLAS names no usable OpenBLAS; unset it to search the usual places"
                         : "install it with tools/install-deps.sh"));
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

std::string describe() {
  const Library& l = library();
  if (!l.status.ok()) return std::string(l.status.message());
  const char* threads = l.parallel == 0   ? "sequential"
                        : l.parallel == 1 ? "pthreads"
                        : l.parallel == 2 ? "OpenMP"
                                          : "threads unknown";
  return absl::StrCat("OpenBLAS ", l.path, " (", threads, ")");
}

}  // namespace wm::blas
