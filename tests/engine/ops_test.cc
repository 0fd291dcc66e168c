// The CPU backend's ops against plain reference code.
#include <gtest/gtest.h>

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "engine/backend.h"
#include "engine/blas.h"
#include "engine/noise.h"
#include "engine/rope.h"

namespace wm {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// the batch's noise, made in parallel chunks, is noise_fill_frame's bit for
// bit (the golden fixtures and the trainer reproduce it exactly)
TEST(CpuOps, NoiseFramesAreTheReferenceNoise) {
  auto be = make_cpu_backend(2);
  const std::vector<uint64_t> seeds = {7, 7, 0x8000000000000001ull};
  const std::vector<int64_t> frames = {0, 1, 99999};
  const int64_t vpf = 12289;  // not a multiple of the chunk
  std::vector<float> out(seeds.size() * vpf, -1.0f), want(vpf);
  be->noise_frames(seeds, frames, vpf, out.data());
  for (size_t i = 0; i < seeds.size(); ++i) {
    noise_fill_frame(seeds[i], frames[i], want.data(), vpf);
    EXPECT_EQ(std::vector<float>(out.begin() + i * vpf, out.begin() + (i + 1) * vpf), want) << "frame " << i;
  }
}

// backend.linear on `threads` threads against a double-precision loop
void expect_linear_matches_loop(int threads, int n, int in, int out, uint32_t seed, double tolerance) {
  auto be = make_cpu_backend(threads);
  auto x = randn(n * in, seed), w = randn(out * in, seed + 1), b = randn(out, seed + 2);
  LinearWeight lw{be->upload_weight(w.data(), out, in), b.data(), out, in};
  std::vector<float> y(n * out);
  be->linear(lw, x.data(), n, y.data());
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double acc = b[o];
      for (int k = 0; k < in; ++k) acc += static_cast<double>(x[i * in + k]) * w[o * in + k];
      ASSERT_NEAR(y[i * out + o], acc, tolerance) << threads << " thread(s), row " << i << ", column " << o;
    }
}

TEST(CpuOps, LinearMatchesLoop) { expect_linear_matches_loop(1, 5, 7, 3, 1, 1e-5); }

// the GEMMs on one thread and on two (a shape OpenBLAS splits between
// them) are the loop's. Not bit for bit each other's: OpenBLAS's rounding
// depends on how it splits the product (docs/ARCHITECTURE.md)
TEST(CpuOps, ThreadedLinearMatchesLoop) {
  const int before = omp_get_max_threads();
  for (int threads : {1, 2}) expect_linear_matches_loop(threads, 192, 256, 320, 4, 1e-3);
  make_cpu_backend(before);  // the tests after this one get the threads they had
}

// more threads than cores run as many as there are cores (OpenBLAS's
// 128 MiB a thread would otherwise be reserved for each of them)
TEST(CpuOps, ThreadsBeyondTheCoresRunOnTheCores) {
  const int before = omp_get_max_threads(), cores = omp_get_num_procs();
  EXPECT_EQ(cpu_threads_used(1), 1);
  EXPECT_EQ(cpu_threads_used(1024), cores);
  make_cpu_backend(1024);
  EXPECT_EQ(omp_get_max_threads(), cores);
  // 0 is OpenMP's default on this thread, within the cores as well
  omp_set_num_threads(1024);
  EXPECT_EQ(cpu_threads_used(0), cores);
  make_cpu_backend(0);
  EXPECT_EQ(omp_get_max_threads(), cores);
  omp_set_num_threads(1);
  EXPECT_EQ(cpu_threads_used(0), 1);
  make_cpu_backend(before);
}

// where Debian's OpenMP build of OpenBLAS is installed (tools/install-deps.sh)
// the engine runs its GEMMs on it, not on the pthreads build (engine/blas.cc)
TEST(Blas, TheOpenMpBuildIsTheOneLoadedWhereInstalled) {
  ASSERT_TRUE(blas::load().ok()) << blas::load().message();
  const std::string what = blas::describe();
  EXPECT_NE(what.find("OpenBLAS "), std::string::npos) << what;
#ifdef WM_MULTIARCH
  const std::string openmp = std::string("/usr/lib/") + WM_MULTIARCH + "/openblas-openmp/libopenblas.so.0";
  const char* env = std::getenv("WM_OPENBLAS");
  if ((env != nullptr && *env != '\0') || access(openmp.c_str(), R_OK) != 0)
    GTEST_SKIP() << "no OpenMP build at " << openmp << " (or WM_OPENBLAS is set): " << what;
  EXPECT_EQ(what, "OpenBLAS " + openmp + " (OpenMP)");
#else
  GTEST_SKIP() << "no multiarch folder known: " << what;
#endif
}

TEST(CpuOps, LayerNormModulatePerFrame) {
  auto be = make_cpu_backend(1);
  const int T = 3, frames = 2, n = T * frames, d = 8, stride = 20;
  auto x = randn(n * d, 4), mod = randn(frames * stride, 5);
  std::vector<float> y(n * d);
  be->layer_norm_modulate(x.data(), n, d, mod.data(), mod.data() + d, stride, T, 1e-6f, y.data());
  for (int i = 0; i < n; ++i) {
    double mean = 0, var = 0;
    for (int j = 0; j < d; ++j) mean += x[i * d + j];
    mean /= d;
    for (int j = 0; j < d; ++j) var += (x[i * d + j] - mean) * (x[i * d + j] - mean);
    var /= d;
    const float* sh = mod.data() + (i / T) * stride;
    for (int j = 0; j < d; ++j) {
      const double ln = (x[i * d + j] - mean) / std::sqrt(var + 1e-6);
      EXPECT_NEAR(y[i * d + j], ln * (1 + sh[d + j]) + sh[j], 1e-5);
    }
  }
}

TEST(Rope, PreservesNormAndIsRelative) {
  const RopeParams p{10000.0f, 4, 2, 2};
  const int hd = 16;
  RopeTable table(p, hd);
  auto q = randn(hd, 6), k = randn(hd, 7);
  auto dot_at = [&](std::array<int32_t, 3> pq, std::array<int32_t, 3> pk) {
    std::vector<float> a = q, b = k;
    table.rotate(a.data(), pq.data());
    table.rotate(b.data(), pk.data());
    double s = 0;
    for (int i = 0; i < hd; ++i) s += a[i] * b[i];
    return s;
  };
  // same offsets in time, row and column give the same logit
  EXPECT_NEAR(dot_at({5, 1, 2}, {3, 0, 0}), dot_at({105, 4, 7}, {103, 3, 5}), 1e-3);
  EXPECT_GT(std::fabs(dot_at({5, 1, 2}, {3, 0, 0}) - dot_at({5, 1, 2}, {4, 0, 0})), 1e-4);
  std::vector<float> a = q;
  const int32_t pos[3] = {17, 3, 9};
  table.rotate(a.data(), pos);
  double n0 = 0, n1 = 0;
  for (int i = 0; i < hd; ++i) {
    n0 += q[i] * q[i];
    n1 += a[i] * a[i];
  }
  EXPECT_NEAR(n0, n1, 1e-4);
  // pair 0 (time, frequency 1) at t=1 turns by exactly 1 radian
  std::vector<float> e(hd, 0.0f);
  e[0] = 1.0f;
  const int32_t t1[3] = {1, 0, 0};
  table.rotate(e.data(), t1);
  EXPECT_NEAR(e[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(e[1], std::sin(1.0), 1e-6);
}

TEST(CpuOps, RmsNormRopeNormalisesEachHead) {
  auto be = make_cpu_backend(1);
  const int n = 2, heads = 2, hd = 8;
  auto x = randn(n * heads * hd, 8);
  std::vector<float> w(hd, 2.0f);
  std::vector<int32_t> pos(n * 3, 0);  // position 0: rope is the identity
  be->rms_norm_rope(x.data(), n, heads, hd, heads * hd, w.data(), pos.data(), RopeParams{10000.0f, 2, 1, 1}, 1e-6f);
  for (int i = 0; i < n * heads; ++i) {
    double ss = 0;
    for (int d = 0; d < hd; ++d) ss += x[i * hd + d] * x[i * hd + d];
    EXPECT_NEAR(ss / hd, 4.0, 1e-3);
  }
}

TEST(CpuOps, PatchifyRoundTripsAndLaysOutPatches) {
  auto be = make_cpu_backend(1);
  const FrameShape s{8, 12, 3, 4};
  auto frames = randn(2 * 8 * 12 * 3, 9);
  std::vector<float> tok(frames.size()), back(frames.size());
  be->patchify(frames.data(), 2, s, tok.data());
  // token 1 of frame 0 is the patch at row 0, column 1; its element (py=2, px=3, ch=1)
  EXPECT_EQ(tok[1 * 48 + (2 * 4 + 3) * 3 + 1], frames[(2 * 12 + 4 + 3) * 3 + 1]);
  be->unpatchify(tok.data(), 2, s, back.data());
  EXPECT_EQ(frames, back);
}

TEST(CpuOps, GeluGatedResidualAndEuler) {
  auto be = make_cpu_backend(1);
  std::vector<float> g = {-1.0f, 0.0f, 2.0f};
  be->gelu(g.data(), 3);
  EXPECT_NEAR(g[0], -0.158808f, 1e-5);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_NEAR(g[2], 1.954597f, 1e-5);
  std::vector<float> h = {1, 1, 1, 1}, y = {1, 2, 3, 4}, gate = {0.5f, 0.5f, 9, 2, 2, 9};
  be->gated_residual(h.data(), y.data(), gate.data(), 3, 2, 2, 1);
  EXPECT_EQ(h, (std::vector<float>{1.5f, 2.0f, 7.0f, 9.0f}));
  std::vector<float> x = {0.5f, 0.9f, 0.0f, 0.0f}, v = {1, 1, 1, -1}, dt = {-0.5f, 2.0f};
  be->euler_step(x.data(), v.data(), dt.data(), 2, 2, /*clamp=*/true);
  const float want[] = {0.0f, 0.4f, 1.0f, -1.0f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], want[i], 1e-6f);
}

}  // namespace
}  // namespace wm
