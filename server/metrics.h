// The server's Prometheus metrics (DESIGN.md §6, docs/API.md "Metrics"):
// prefix wm_, base units, no session ids in labels. Every reason label that
// the code can produce is created at startup so dashboards see zeros.
//
// Threading: prometheus-cpp metrics are thread-safe; any thread may update
// them. Labelled children are looked up once here, never per event.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "quant/kv_cache.h"
#include "server/served_model.h"

namespace wm::server {

// why a session ended (wm_sessions_ended_total{reason})
enum class EndReason { kClientClosed, kCancelled, kIdleTtl, kShutdown, kError, kProtocol, kParkExpired, kRevoked };
absl::string_view end_reason_label(EndReason r);

class Metrics {
 public:
  Metrics(const ServedModel& model, const std::string& version);
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // gauges
  prometheus::Gauge* sessions_active;
  prometheus::Gauge* sessions_queued;       // sessions with work waiting for an engine step
  prometheus::Gauge* kv_bytes_used;
  prometheus::Gauge* kv_bytes_reserved;
  prometheus::Gauge* kv_bytes_capacity;
  prometheus::Gauge* kv_usage_ratio;        // used / capacity
  prometheus::Gauge* admitting;             // 1 while a new default-format session would be admitted
  prometheus::Gauge* sessions_parked;       // sessions whose stream broke, waiting for a resume
  prometheus::Gauge* connections_open;      // gRPC connections open (as of the listener's last sweep)
  // what the audited sessions of a format measured so far: token-selection
  // drift, and (once frames were made against the shadow) their PSNR
  void set_drift(const std::string& format, const DriftStats& drift);
  // the accelerator's memory (no series on the CPU, which reports none)
  void set_gpu_memory(int64_t total, int64_t free);
  // the device's graph totals so far (EngineOptions::device_graphs): the
  // counters move by what they grew since the last call
  void set_device_graphs(int64_t recorded, int64_t recording_failed, int64_t launched);
  // where the device codes the span formats now (1 the device, 2 the host's
  // k-means, 3 the host; docs/CUDA.md, "Span pages") and its checks' totals so far
  void set_span_coder(int64_t coder, int64_t checks_same, int64_t checks_different);

  // counters
  prometheus::Counter* sessions_started;
  prometheus::Counter& sessions_ended(EndReason r) { return *ended_.at(r); }
  prometheus::Counter& sessions_rejected(absl::string_view reason);
  prometheus::Counter* connections_shut_down;  // for their calls (--max_calls_per_connection)
  // connections closed at accept: "total_cap", "client_cap", "client_rate", "client_blocked", "no_fds" (other: "other")
  prometheus::Counter& connections_refused(absl::string_view reason);
  prometheus::Counter* sessions_evicted_idle;
  prometheus::Counter* sessions_parked_total;   // streams that broke and left their session parked
  prometheus::Counter* sessions_resumed;
  prometheus::Counter* frames_sent;
  prometheus::Counter* frames_dropped_slow_client;
  prometheus::Counter* frames_dropped_session_end;
  prometheus::Counter* actions_received;
  prometheus::Counter& actions_invalid(absl::string_view reason);
  prometheus::Counter* actions_dropped_queue_full;
  prometheus::Counter* actions_superseded;
  prometheus::Counter* deadlines_missed;
  prometheus::Counter* engine_errors;

  // histograms
  prometheus::Histogram* action_to_frame;
  prometheus::Histogram* time_to_first_frame;
  prometheus::Histogram* step_duration;
  prometheus::Histogram* step_wait;
  prometheus::Histogram* batch_size;
  prometheus::Histogram* jpeg_encode;
  prometheus::Histogram* inter_frame_interval;
  prometheus::Histogram* session_duration;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::map<EndReason, prometheus::Counter*> ended_;
  std::map<std::string, prometheus::Counter*, std::less<>> rejected_;
  std::map<std::string, prometheus::Counter*, std::less<>> invalid_;
  std::map<std::string, prometheus::Counter*, std::less<>> refused_connections_;
  prometheus::Family<prometheus::Gauge>* drift_family_;
  prometheus::Family<prometheus::Gauge>* drift_queries_family_;
  prometheus::Family<prometheus::Gauge>* shadow_psnr_family_;
  prometheus::Family<prometheus::Gauge>* shadow_psnr_min_family_;
  prometheus::Family<prometheus::Gauge>* shadow_frames_family_;
  prometheus::Family<prometheus::Gauge>* gpu_memory_family_;
  prometheus::Family<prometheus::Counter>* graph_family_;
  std::array<int64_t, 3> graph_seen_{};  // recorded, recording_failed, launched at the last call
  prometheus::Family<prometheus::Gauge>* span_coder_family_;
  prometheus::Family<prometheus::Counter>* span_checks_family_;
  std::array<int64_t, 2> span_checks_seen_{};  // same, different at the last call
  prometheus::Counter* rejected_other_;
  prometheus::Counter* invalid_other_;
};

}  // namespace wm::server
