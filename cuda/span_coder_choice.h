// Where the span formats' coder runs when nothing pins it (docs/CUDA.md,
// "Span pages"): the device's coder first, with its first appends also
// coded on the host by the CPU's coder and the two images compared byte for
// byte. A difference moves the choice one rung down: the host's k-means
// with the device's token codes (checked again), then the host alone,
// whose codes are the CPU's by construction. So a device that computes the
// codes differently from the CPU (as the H200 of 2026-12-04 did) serves the
// CPU's codes after the first checked append, and which part of the coder
// differs shows in the rung it settles on.
//
// Pure bookkeeping, unit-tested without a GPU (tests/engine/cuda_host_test.cc);
// cuda_backend.cc codes, compares and reports.
#pragma once

#include <cstdint>

namespace wm::cuda {

class SpanCoderChoice {
 public:
  // the rungs, as tuning "span.coder" names them
  static constexpr int32_t kDevice = 1, kHostKmeans = 2, kHost = 3;

  // checks: appends to check on each rung before it is trusted (0: none)
  explicit SpanCoderChoice(int32_t checks = 0) { restart(checks); }

  // the device again, `checks` appends of each rung to check
  void restart(int32_t checks) {
    checks_ = checks > 0 ? checks : 0;
    coder_ = kDevice;
    left_ = checks_;
    pinned_ = false;
  }
  // always this coder, nothing checked
  void pin(int32_t coder) {
    coder_ = coder;
    left_ = 0;
    pinned_ = true;
  }

  int32_t coder() const { return coder_; }
  bool pinned() const { return pinned_; }
  // the next append is coded on the host too and compared
  bool checking() const { return !pinned_ && coder_ != kHost && left_ > 0; }

  // a checked append's outcome: the images were the same, or not
  void record(bool same) {
    if (!checking()) return;
    if (same) {
      ++passed_;
      --left_;
      return;
    }
    ++mismatches_;
    ++coder_;
    left_ = checks_;
  }

  int64_t passed() const { return passed_; }
  int64_t mismatches() const { return mismatches_; }

 private:
  int32_t checks_ = 0, coder_ = kDevice, left_ = 0;
  bool pinned_ = false;
  int64_t passed_ = 0, mismatches_ = 0;
};

}  // namespace wm::cuda
