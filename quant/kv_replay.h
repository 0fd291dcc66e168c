// Capture and teacher-forced replay (wmquant): an observed cache reports
// every call the engine makes on a session's cache (queries, attention
// inputs and output, appended K/V); KvEventLog keeps them (wmquant dump),
// KvEvaluator replays them into candidate formats and compares each
// candidate's attention with the full-precision reference on the same
// queries and the same history (wmquant eval).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "quant/kv_cache.h"

namespace wm {

class KvObserver {
 public:
  virtual ~KvObserver() = default;
  virtual void on_observe(int layer, const float* q, int n) = 0;
  // out: the output the engine used (the observed cache's own result), [n, heads, head_dim]
  virtual void on_attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, const float* out) = 0;
  virtual void on_append(int layer, const float* k, const float* v, int64_t first_frame, int frames) = 0;
};

// forwards every call to `inner` and reports it to `observer` (not owned)
std::unique_ptr<KvCache> make_observed_cache(std::unique_ptr<KvCache> inner, KvObserver* observer);

struct KvEvent {
  enum class Kind : int32_t { observe = 0, attend = 1, append = 2 };
  Kind kind = Kind::observe;
  int layer = 0;
  int rows = 0;                // queries (observe, attend) or tokens (append)
  int64_t first_frame = 0;     // append
  int frames = 0;              // append
  bool q_from_previous = false;  // attend: q is the previous event's (an observe of the same queries)
  std::vector<float> q, k, v;  // observe: q; attend: q, k = k_cur, v = v_cur; append: k, v. [rows, heads, head_dim]
};

class KvEventLog final : public KvObserver {
 public:
  explicit KvEventLog(const KvGeometry& g) : g_(g) {}
  void on_observe(int layer, const float* q, int n) override;
  void on_attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, const float* out) override;
  void on_append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override;
  const KvGeometry& geometry() const { return g_; }
  std::vector<KvEvent>& events() { return events_; }

 private:
  KvGeometry g_;
  std::vector<KvEvent> events_;
};

// replays events in order (an attend's reference output is not stored:
// observers that need it compute it)
void kv_replay(std::span<const KvEvent> events, KvObserver* observer);

// what a KvEvaluator of these candidate formats holds over geometry g once
// the window is full, counted before anything is allocated so that a tool can
// refuse a geometry no machine holds: the fp32 reference and the fp16 byte
// baseline, each candidate's reservation and query statistics, and the
// reference's and one candidate's reconstruction of a layer, which every
// attention call compares (an underestimate: the transients of an append and
// the other candidates' reconstructions are left out). Saturates at INT64_MAX.
int64_t kv_evaluation_bytes(const KvGeometry& g, std::span<const std::string> formats, const KvFormatOptions& options);

class KvEvaluator final : public KvObserver {
 public:
  struct Options {
    int queries_per_head = 16;  // probed queries per head and attention call
    int topk = 8;
    uint64_t seed = 1;
    bool fused = false;         // also run each candidate's fused attention and compare outputs on every row
  };
  struct Candidate {
    std::string format;
    std::unique_ptr<KvCache> cache;
    std::vector<DriftStats> per_layer;
    KvBytes peak;                  // at the most bytes held after an append
    int64_t reserved = 0;          // kv_format_max_bytes
    double fused_rel_err_sum = 0;  // with Options::fused: sum over (row, head) of ||o - o_ref|| / ||o_ref||
    int64_t fused_rows = 0;
    std::string error;             // first failure (the candidate stops)
    DriftStats overall() const;
  };

  KvEvaluator(const KvGeometry& g, const Options& options);
  absl::Status add(const std::string& format, const KvFormatOptions& options);

  void on_observe(int layer, const float* q, int n) override;
  void on_attend(int layer, const float* q, const float* k_cur, const float* v_cur, int n, const float* out) override;
  void on_append(int layer, const float* k, const float* v, int64_t first_frame, int frames) override;

  const std::vector<Candidate>& candidates() const { return candidates_; }
  const KvBytes& reference_fp16_peak() const { return fp16_peak_; }
  int64_t attend_calls() const { return calls_; }

 private:
  KvGeometry g_;
  Options options_;
  std::unique_ptr<KvCache> reference_;  // fp32
  std::unique_ptr<KvCache> fp16_;       // for the fp16 byte baseline
  KvBytes fp16_peak_;
  std::vector<Candidate> candidates_;
  int64_t calls_ = 0;
};

}  // namespace wm
