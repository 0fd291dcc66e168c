#include "server/metrics.h"

#include <algorithm>

namespace wm::server {

namespace pm = prometheus;

absl::string_view end_reason_label(EndReason r) {
  switch (r) {
    case EndReason::kClientClosed: return "client_closed";
    case EndReason::kCancelled: return "cancelled";
    case EndReason::kIdleTtl: return "idle_ttl";
    case EndReason::kShutdown: return "shutdown";
    case EndReason::kError: return "error";
    case EndReason::kProtocol: return "protocol_error";
    case EndReason::kParkExpired: return "park_expired";
    case EndReason::kRevoked: return "revoked";
  }
  return "unknown";
}

namespace {

pm::Gauge* gauge(pm::Registry& r, const std::string& name, const std::string& help) {
  return &pm::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
pm::Counter* counter(pm::Registry& r, const std::string& name, const std::string& help) {
  return &pm::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
pm::Histogram* histogram(pm::Registry& r, const std::string& name, const std::string& help,
                         const pm::Histogram::BucketBoundaries& buckets) {
  return &pm::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

// counters that follow totals kept elsewhere (the device plugin's): each
// label's series moves by what its total grew since the last call
template <size_t N>
void follow_totals(pm::Family<pm::Counter>& family, const char* label, const std::array<const char*, N>& values,
                   const std::array<int64_t, N>& now, std::array<int64_t, N>& seen) {
  for (size_t i = 0; i < N; ++i) {
    if (now[i] > seen[i]) family.Add({{label, values[i]}}).Increment(static_cast<double>(now[i] - seen[i]));
    seen[i] = std::max(seen[i], now[i]);
  }
}

}  // namespace

Metrics::Metrics(const ServedModel& model, const std::string& version)
    : registry_(std::make_shared<pm::Registry>()) {
  pm::Registry& r = *registry_;
  pm::BuildGauge().Name("wm_build_info").Help("the server's version (value 1)").Register(r)
      .Add({{"version", version}}).Set(1);
  pm::BuildGauge().Name("wm_model_info").Help("the model served (value 1)").Register(r)
      .Add({{"model", model.config.name}, {"device", model.device}, {"default_cache_format", model.default_format}})
      .Set(1);
  auto& compression = pm::BuildGauge()
                          .Name("wm_kv_cache_compression_ratio")
                          .Help("fp16 reservation / this format's reservation per session (the worst case admission sets aside, all metadata counted)")
                          .Register(r);
  auto& session_bytes = pm::BuildGauge()
                            .Name("wm_kv_cache_session_reserved_bytes")
                            .Help("KV bytes admission reserves for one session of this cache format")
                            .Register(r);
  for (const auto& [format, ratio] : model.compression_ratio) {
    compression.Add({{"format", format}}).Set(ratio);
    session_bytes.Add({{"format", format}}).Set(static_cast<double>(model.reservation_bytes.at(format)));
  }

  sessions_active = gauge(r, "wm_sessions_active", "sessions open (admitted and not ended)");
  sessions_queued = gauge(r, "wm_sessions_queued", "sessions with work waiting for an engine step");
  kv_bytes_used = gauge(r, "wm_kv_cache_bytes_used", "KV-cache bytes held by all sessions now");
  kv_bytes_reserved = gauge(r, "wm_kv_cache_bytes_reserved", "KV-cache bytes reserved by admitted sessions");
  kv_bytes_capacity = gauge(r, "wm_kv_cache_bytes_capacity", "the KV-cache byte budget (--kv_budget_bytes)");
  kv_usage_ratio = gauge(r, "wm_kv_cache_usage_ratio", "wm_kv_cache_bytes_used / wm_kv_cache_bytes_capacity (0..1)");
  admitting = gauge(r, "wm_admitting", "1 while a new session of the default cache format would be admitted");
  sessions_parked = gauge(r, "wm_sessions_parked",
                          "sessions whose stream broke, kept for a resume (--park_ttl_s); counted in wm_sessions_active");
  kv_bytes_capacity->Set(static_cast<double>(model.kv_capacity_bytes));
  drift_family_ = &pm::BuildGauge()
                       .Name("wm_token_selection_drift_ratio")
                       .Help("top-1 token-selection mismatch rate of audited sessions against their full-precision "
                             "shadow, by cache format (0..1)")
                       .Register(r);
  drift_queries_family_ = &pm::BuildGauge()
                               .Name("wm_token_selection_drift_queries")
                               .Help("sampled queries behind wm_token_selection_drift_ratio, by cache format")
                               .Register(r);
  shadow_psnr_family_ = &pm::BuildGauge()
                            .Name("wm_shadow_frame_psnr_db")
                            .Help("PSNR of audited sessions' served frames against the same blocks made with their "
                                  "full-precision shadow as the history, pooled over the frames compared, by cache "
                                  "format (dB; identical frames count as 60)")
                            .Register(r);
  shadow_psnr_min_family_ = &pm::BuildGauge()
                                .Name("wm_shadow_frame_psnr_min_db")
                                .Help("the lowest PSNR of one frame behind wm_shadow_frame_psnr_db, by cache format")
                                .Register(r);
  shadow_frames_family_ = &pm::BuildGauge()
                              .Name("wm_shadow_frames")
                              .Help("frames behind wm_shadow_frame_psnr_db, by cache format")
                              .Register(r);

  gpu_memory_family_ = &pm::BuildGauge()
                            .Name("wm_gpu_memory_bytes")
                            .Help("the accelerator's memory: total, and used by everything on it (absent on the CPU)")
                            .Register(r);

  graph_family_ = &pm::BuildCounter()
                       .Name("wm_device_graph_events_total")
                       .Help("denoising passes recorded as a device graph, recordings that failed (the pass ran as "
                             "usual), and passes run from a graph (--device_graphs)")
                       .Register(r);

  span_coder_family_ = &pm::BuildGauge()
                            .Name("wm_device_span_coder")
                            .Help("1 for where the device codes the span formats' appends now (device, host_kmeans: "
                                  "the host's k-means with the device's token codes, host), 0 for the others")
                            .Register(r);
  span_checks_family_ = &pm::BuildCounter()
                             .Name("wm_device_span_coder_checks_total")
                             .Help("span appends coded on the host as well and compared byte for byte with the "
                                   "device's coding, by result (same, different: the host's codes were kept)")
                             .Register(r);

  sessions_started = counter(r, "wm_sessions_started_total", "sessions admitted and opened");
  auto& ended = pm::BuildCounter().Name("wm_sessions_ended_total").Help("sessions ended, by reason").Register(r);
  for (EndReason e : {EndReason::kClientClosed, EndReason::kCancelled, EndReason::kIdleTtl, EndReason::kShutdown,
                      EndReason::kError, EndReason::kProtocol, EndReason::kParkExpired, EndReason::kRevoked})
    ended_[e] = &ended.Add({{"reason", std::string(end_reason_label(e))}});
  auto& rejected =
      pm::BuildCounter().Name("wm_sessions_rejected_total").Help("Play streams refused at Start, by reason").Register(r);
  for (const char* reason : {"draining", "kv_budget", "max_sessions", "client_cap", "unknown_format", "prompt_rate", "unauthenticated",
                             "unknown_model", "invalid_start", "unimplemented", "engine", "resume_not_found",
                             "resume_attached", "resume_draining", "start_timeout"})
    rejected_[reason] = &rejected.Add({{"reason", reason}});
  rejected_other_ = &rejected.Add({{"reason", "other"}});
  connections_open = gauge(r, "wm_connections_open", "gRPC connections open (as of the last accept or sweep, within 1 s)");
  auto& refused = pm::BuildCounter()
                      .Name("wm_connections_refused_total")
                      .Help("connections closed at accept, by reason (--max_connections, "
                            "--max_connections_per_client, --client_connection_rate, an address refused after "
                            "--max_calls_per_connection, no file descriptor left)")
                      .Register(r);
  for (const char* reason : {"total_cap", "client_cap", "client_rate", "client_blocked", "no_fds", "other"})
    refused_connections_[reason] = &refused.Add({{"reason", reason}});
  connections_shut_down = counter(r, "wm_connections_shut_down_total",
                                  "connections shut down for opening more calls in a second than "
                                  "--max_calls_per_connection (their address is refused for a while)");
  sessions_evicted_idle = &pm::BuildCounter()
                               .Name("wm_sessions_evicted_total")
                               .Help("sessions closed by the server, by reason")
                               .Register(r)
                               .Add({{"reason", "idle_ttl"}});
  sessions_parked_total = counter(r, "wm_sessions_parked_total", "streams that broke and left their session parked");
  sessions_resumed = counter(r, "wm_sessions_resumed_total", "parked sessions re-attached to a new stream");
  frames_sent = counter(r, "wm_frames_sent_total", "frames written to clients");
  auto& dropped = pm::BuildCounter().Name("wm_frames_dropped_total").Help("frames generated and never sent, by reason")
                      .Register(r);
  frames_dropped_slow_client = &dropped.Add({{"reason", "slow_client"}});
  frames_dropped_session_end = &dropped.Add({{"reason", "session_end"}});
  actions_received = counter(r, "wm_actions_received_total", "actions received");
  auto& invalid = pm::BuildCounter().Name("wm_actions_invalid_total").Help("actions refused as invalid, by reason")
                      .Register(r);
  for (const char* reason : {"out_of_range", "bad_seq", "empty", "unparseable", "before_start"})
    invalid_[reason] = &invalid.Add({{"reason", reason}});
  invalid_other_ = &invalid.Add({{"reason", "other"}});
  auto& actions_dropped = pm::BuildCounter()
                              .Name("wm_actions_dropped_total")
                              .Help("valid actions never applied, by reason")
                              .Register(r);
  actions_dropped_queue_full = &actions_dropped.Add({{"reason", "queue_full"}});
  actions_superseded = &actions_dropped.Add({{"reason", "superseded"}});
  deadlines_missed = counter(r, "wm_frame_deadlines_missed_total",
                             "fixed-rate frames ready after their deadline, or ticks skipped because the engine was behind");
  engine_errors = counter(r, "wm_engine_errors_total", "engine steps or session opens that failed");

  action_to_frame = histogram(r, "wm_action_to_frame_seconds",
                              "from an action's arrival to the write of the first frame that applies it",
                              {.005, .01, .025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 2.5, 5});
  time_to_first_frame = histogram(r, "wm_time_to_first_frame_seconds", "from Start to the first frame's write",
                                  {.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10});
  step_duration = histogram(r, "wm_step_duration_seconds", "one engine step (one block for every session in the batch)",
                            {.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5});
  step_wait = histogram(r, "wm_step_wait_seconds",
                        "from a session having work (its oldest queued action, or its tick falling due) to the "
                        "start of the engine step that serves it",
                        {.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5});
  batch_size = histogram(r, "wm_batch_size", "sessions per engine step", {1, 2, 4, 8, 16, 32, 64, 128, 256});
  jpeg_encode = histogram(r, "wm_jpeg_encode_seconds", "JPEG encoding of one frame",
                          {.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05});
  inter_frame_interval = histogram(r, "wm_inter_frame_interval_seconds",
                                   "between two consecutive frame writes of a session",
                                   {.005, .01, .02, .033, .05, .075, .1, .15, .25, .5, 1, 2.5});
  session_duration = histogram(r, "wm_session_duration_seconds", "from Start to the session's end",
                               {1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600});
}

pm::Counter& Metrics::sessions_rejected(absl::string_view reason) {
  auto it = rejected_.find(reason);
  return it == rejected_.end() ? *rejected_other_ : *it->second;
}

pm::Counter& Metrics::connections_refused(absl::string_view reason) {
  auto it = refused_connections_.find(reason);
  return it == refused_connections_.end() ? *refused_connections_.at("other") : *it->second;
}

pm::Counter& Metrics::actions_invalid(absl::string_view reason) {
  auto it = invalid_.find(reason);
  return it == invalid_.end() ? *invalid_other_ : *it->second;
}

void Metrics::set_gpu_memory(int64_t total, int64_t free) {
  if (total <= 0) return;
  gpu_memory_family_->Add({{"kind", "total"}}).Set(static_cast<double>(total));
  gpu_memory_family_->Add({{"kind", "used"}}).Set(static_cast<double>(total - free));
}

void Metrics::set_device_graphs(int64_t recorded, int64_t recording_failed, int64_t launched) {
  constexpr std::array<const char*, 3> kEvents = {"recorded", "recording_failed", "launched"};
  follow_totals(*graph_family_, "event", kEvents, {recorded, recording_failed, launched}, graph_seen_);
}

void Metrics::set_span_coder(int64_t coder, int64_t checks_same, int64_t checks_different) {
  if (coder < 1 || coder > 3) return;
  constexpr std::array<const char*, 3> kCoders = {"device", "host_kmeans", "host"};
  for (int64_t i = 0; i < 3; ++i) span_coder_family_->Add({{"coder", kCoders[i]}}).Set(i + 1 == coder ? 1.0 : 0.0);
  // both series exist from the first call: a scrape reads "different 0", not nothing
  for (const char* result : {"same", "different"}) span_checks_family_->Add({{"result", result}});
  constexpr std::array<const char*, 2> kResults = {"same", "different"};
  follow_totals(*span_checks_family_, "result", kResults, {checks_same, checks_different}, span_checks_seen_);
}

void Metrics::set_drift(const std::string& format, const DriftStats& drift) {
  drift_family_->Add({{"format", format}}).Set(drift.drift());
  drift_queries_family_->Add({{"format", format}}).Set(static_cast<double>(drift.queries));
  if (drift.frames == 0) return;
  shadow_psnr_family_->Add({{"format", format}}).Set(drift.frame_psnr());
  shadow_psnr_min_family_->Add({{"format", format}}).Set(drift.frame_psnr_min);
  shadow_frames_family_->Add({{"format", format}}).Set(static_cast<double>(drift.frames));
}

}  // namespace wm::server
