#include "server/engine_worker.h"

#include <algorithm>
#include <cmath>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/plugin_loader.h"

namespace wm::server {

namespace v1 = ::wmserve::v1;

EngineWorker::EngineWorker(WorkerConfig config, ClosedFn on_closed)
    : config_(std::move(config)), on_closed_(std::move(on_closed)) {}

EngineWorker::~EngineWorker() { stop(); }

absl::StatusOr<ServedModel> EngineWorker::start() {
  WM_CHECK(!thread_.joinable());
  std::promise<absl::StatusOr<ServedModel>> started;
  auto result = started.get_future();
  // the engine is built on its own thread: thread-local library settings
  // (OpenMP thread counts) then apply where it runs
  thread_ = std::thread([this, &started] { run(&started); });
  absl::StatusOr<ServedModel> model = result.get();
  if (!model.ok()) thread_.join();
  return model;
}

void EngineWorker::run(std::promise<absl::StatusOr<ServedModel>>* started) {
  // frames go out before their K/V are written; do_step writes them right after
  EngineOptions eo = config_.engine;
  eo.defer_writes = true;
  auto engine = Engine::create(eo);
  if (!engine.ok()) {
    started->set_value(engine.status());
    return;
  }
  engine_ = std::move(*engine);
  // the largest batch's buffers now: a GPU too small for --max_batch fails at start-up, not mid-session
  if (auto st = engine_->reserve_batch(config_.max_batch); !st.ok()) {
    engine_.reset();
    started->set_value(absl::Status(st.code(), absl::StrCat("buffers for --max_batch ", config_.max_batch,
                                                            " sessions: ", st.message())));
    return;
  }
  auto model = describe_served_model(*engine_, config_.engine.model_dir, config_.default_cache_format);
  if (!model.ok()) {
    engine_.reset();
    started->set_value(model.status());
    return;
  }
  model_ = *model;
  started->set_value(std::move(*model));
  loop();
  engine_.reset();
}

ActionQueue EngineWorker::new_action_queue(const StartParams& p) const {
  const int B = model_.config.frames_per_block;
  return ActionQueue(p.pacing, std::max(config_.action_queue, B), B);
}

void EngineWorker::open(std::shared_ptr<ServerSession> session) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_) {
      entries_.emplace(session->key(), Entry(session, new_action_queue(session->params())));
      to_open_.push_back(session->key());
      sessions_ = static_cast<int>(entries_.size());
      cv_.notify_all();
      return;
    }
  }
  session->finish(absl::UnavailableError("the server is shutting down"), false);
  on_closed_(session, EndReason::kShutdown, /*opened=*/false);
}

absl::Status EngineWorker::submit(const ServerSession& from, const TimedAction& action) {
  int superseded = 0;
  absl::Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(from.key());
    if (it == entries_.end() || it->second.session.get() != &from || it->second.parked ||
        it->second.close_requested || it->second.input_closed)
      return absl::FailedPreconditionError("the session is ending");
    const bool was_empty = it->second.input.empty();
    st = it->second.input.push(action, &superseded);
    if (st.ok() && was_empty && !it->second.pacer.has_value()) cv_.notify_all();
  }
  if (superseded > 0 && metrics() != nullptr) metrics()->actions_superseded->Increment(superseded);
  return st;
}

void EngineWorker::end_input(const ServerSession& from) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(from.key());
  if (it == entries_.end() || it->second.session.get() != &from || it->second.parked) return;
  it->second.input_closed = true;
  cv_.notify_all();
}

bool EngineWorker::park(const ServerSession& from) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(from.key());
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  if (e.session.get() != &from || !e.opened || e.close_requested || e.input_closed) return false;
  if (e.parked) {
    // attached by a resume that never got going: activate() must not wake it
    e.resume_broke = true;
    return true;
  }
  e.parked = true;
  // actions not applied yet are dropped: the resumed stream's frame indices
  // tell the client where the session stands
  e.input = new_action_queue(from.params());
  e.pacer.reset();
  cv_.notify_all();
  return true;
}

void EngineWorker::close_stream(const ServerSession& from, const absl::Status& status, EndReason reason) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(from.key());
    if (it == entries_.end() || it->second.session.get() != &from || it->second.parked) return;
  }
  // a resume cannot slip in between: only a parked session is resumed
  close(from.key(), status, reason);
}

std::shared_ptr<ServerSession> EngineWorker::parked_session(SessionManager::Key key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.parked || it->second.close_requested) return nullptr;
  return it->second.session;
}

bool EngineWorker::attach(std::shared_ptr<ServerSession> fresh) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(fresh->key());
  if (it == entries_.end() || !it->second.parked || it->second.close_requested || stopping_) return false;
  it->second.session = std::move(fresh);
  it->second.resume_broke = false;
  return true;
}

void EngineWorker::activate(const std::shared_ptr<ServerSession>& fresh) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(fresh->key());
    if (it == entries_.end() || it->second.session != fresh || it->second.close_requested) return;
  }
  // Started first: the session is still parked, so no frame can overtake it
  v1::Started st = started_message(*fresh);
  st.set_resumed(true);
  fresh->send_started(std::move(st));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(fresh->key());
  // the resuming stream may have broken since (OnCancel parked the session
  // again): it stays parked, for the next resume or its park TTL
  if (it == entries_.end() || it->second.session != fresh || it->second.close_requested ||
      it->second.resume_broke)
    return;
  Entry& e = it->second;
  e.parked = false;
  e.input = new_action_queue(fresh->params());
  e.input_closed = false;
  if (fresh->params().pacing == PacingMode::kFixedRate)
    e.pacer.emplace(from_seconds(1.0 / fresh->params().fps), Clock::now());
  cv_.notify_all();
}

void EngineWorker::close(SessionManager::Key key, const absl::Status& status, EndReason reason) {
  std::shared_ptr<ServerSession> s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.close_requested) return;
    it->second.close_requested = true;
    it->second.end_reason = reason;
    s = it->second.session;
    cv_.notify_all();
  }
  s->finish(status, /*flush=*/false);
}

void EngineWorker::close_all(const absl::Status& status, EndReason reason) {
  std::vector<std::shared_ptr<ServerSession>> sessions;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [key, e] : entries_) {
      if (e.close_requested) continue;
      e.close_requested = true;
      e.end_reason = reason;
      sessions.push_back(e.session);
    }
    cv_.notify_all();
  }
  for (auto& s : sessions) s->finish(status, false);
}

void EngineWorker::broadcast_event(v1::Event::Level level, absl::string_view code, absl::string_view message) {
  std::vector<std::shared_ptr<ServerSession>> sessions;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [key, e] : entries_)
      if (!e.parked) sessions.push_back(e.session);
  }
  for (auto& s : sessions) s->send_event(level, code, message);
}

void EngineWorker::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  close_all(absl::UnavailableError("the server is shutting down"), EndReason::kShutdown);
  thread_.join();
}

void EngineWorker::loop() {
  for (;;) {
    std::vector<std::pair<SessionManager::Key, Entry>> closing;
    std::vector<SessionManager::Key> opens;
    std::vector<Planned> planned;
    int queued = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      std::vector<SessionManager::Key> keys;
      std::vector<StepCandidate> candidates;
      StepPlan plan;
      TimePoint now;
      for (;;) {
        now = Clock::now();
        keys.clear();
        candidates.clear();
        bool any_closing = false;
        for (auto& [key, e] : entries_) {
          const bool fixed = e.pacer.has_value();
          if (e.close_requested || (e.opened && e.input_closed && (fixed || e.input.empty()))) {
            any_closing = true;
            continue;
          }
          if (!e.opened || e.parked) continue;
          StepCandidate c;
          c.fixed_rate = fixed;
          c.served_until = e.served_until;
          if (fixed) {
            c.ready = e.pacer->is_due(now);
            c.ready_since = c.next_due = e.pacer->due();
          } else {
            c.ready = !e.input.empty();
            if (c.ready) c.ready_since = e.input.oldest_arrival();
          }
          keys.push_back(key);
          candidates.push_back(c);
        }
        if (stopping_ && entries_.empty() && to_open_.empty()) return;
        plan = plan_step(candidates, now, config_.max_batch_wait, config_.max_batch, engine_free_since_);
        if (any_closing || !to_open_.empty() || plan.go) break;
        cv_.wait_until(lk, std::min(plan.wake_at, now + std::chrono::milliseconds(250)));
        if (Clock::now() - last_drift_publish_ > std::chrono::seconds(1)) break;  // refresh the gauges
      }
      for (auto it = entries_.begin(); it != entries_.end();) {
        Entry& e = it->second;
        if (e.close_requested || (e.opened && e.input_closed && (e.pacer.has_value() || e.input.empty()))) {
          closing.emplace_back(it->first, std::move(e));
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
      opens.swap(to_open_);
      int ready = 0;
      for (const auto& c : candidates) ready += c.ready ? 1 : 0;
      if (plan.go) {
        for (size_t idx : plan.batch) {
          auto it = entries_.find(keys[idx]);
          if (it == entries_.end()) continue;  // it was closing
          Entry& e = it->second;
          Planned p{keys[idx], e.engine_id, e.session, {}, candidates[idx].ready_since, std::nullopt};
          if (e.pacer.has_value()) p.tick = e.pacer->take(now);
          p.block = e.input.take_block();
          planned.push_back(std::move(p));
        }
      }
      queued = ready - static_cast<int>(planned.size());
      sessions_ = static_cast<int>(entries_.size());
    }

    for (auto& [key, e] : closing) {
      if (e.opened) {
        if (const KvCache* cache = engine_->session_cache(e.engine_id); cache != nullptr)
          if (const DriftStats* d = cache->drift(); d != nullptr) e.session->set_audit_result(*d);
        if (auto st = engine_->close_session(e.engine_id); !st.ok())
          std::fprintf(stderr, "wmserve: closing session %s: %s\n", e.session->id().c_str(), st.ToString().c_str());
      }
      // a client that half-closed gets its last frames, then OK
      if (!e.close_requested) e.session->finish(absl::OkStatus(), /*flush=*/true);
      on_closed_(e.session, e.end_reason, e.opened);
    }
    for (SessionManager::Key key : opens) do_open(key);
    if (!planned.empty()) {
      do_step(planned);
      std::lock_guard<std::mutex> lk(mu_);
      for (const Planned& p : planned)
        if (auto it = entries_.find(p.key); it != entries_.end()) it->second.served_until = engine_free_since_;
    }
    publish_gauges(queued);
  }
}

void EngineWorker::do_open(SessionManager::Key key) {
  std::shared_ptr<ServerSession> s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;  // closed before it opened
    s = it->second.session;
  }
  const StartParams& p = s->params();
  SessionOptions so;
  so.seed = p.seed;
  so.cache_format = p.cache_format;
  so.prompt = p.prompt;
  so.audit = p.audit;  // asked by the Start or sampled at admission (--audit_fraction)
  so.batch_invariant = p.batch_invariant;
  auto id = engine_->open_session(so);
  if (!id.ok()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      entries_.erase(key);
      sessions_ = static_cast<int>(entries_.size());
    }
    std::fprintf(stderr, "wmserve: opening session %s: %s\n", s->id().c_str(), id.status().ToString().c_str());
    if (metrics() != nullptr) {
      metrics()->engine_errors->Increment();
      metrics()->sessions_rejected("engine").Increment();
    }
    s->finish(id.status(), false);
    on_closed_(s, EndReason::kError, /*opened=*/false);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    Entry& e = entries_.at(key);
    e.engine_id = *id;
    e.opened = true;
    if (p.pacing == PacingMode::kFixedRate) e.pacer.emplace(from_seconds(1.0 / p.fps), Clock::now());
    cv_.notify_all();
  }
  if (metrics() != nullptr) metrics()->sessions_started->Increment();
  v1::Started started = started_message(*s);
  if (SessionLog* log = session_log_.load(std::memory_order_acquire); log != nullptr)
    log->started(*s, started.kv_reserved_bytes());
  s->send_started(std::move(started));
}

v1::Started EngineWorker::started_message(const ServerSession& s) const {
  const StartParams& p = s.params();
  v1::Started st;
  st.set_session_id(s.id());
  st.set_width(model_.config.width);
  st.set_height(model_.config.height);
  fill_action_space(model_.config.actions, st.mutable_action_space());
  fill_model_info(model_, st.mutable_model());
  st.set_cache_format(p.cache_format);
  st.set_pacing(p.pacing == PacingMode::kFixedRate ? v1::PACING_FIXED_RATE : v1::PACING_PER_ACTION);
  st.set_fps(p.fps);
  st.set_jpeg_quality(p.jpeg_quality);
  st.set_kv_reserved_bytes(model_.reservation_bytes.at(p.cache_format) + (p.audit ? model_.audit_bytes : 0));
  st.set_prompt_frames(static_cast<int32_t>(p.prompt.size()));
  st.set_action_queue_capacity(p.pacing == PacingMode::kFixedRate
                                   ? model_.config.frames_per_block
                                   : std::max(config_.action_queue, model_.config.frames_per_block));
  st.set_resume_token(s.resume_token());
  st.set_batch_invariant(p.batch_invariant);
  return st;
}

void EngineWorker::do_step(std::vector<Planned>& planned) {
  std::vector<StepRequest> requests;
  requests.reserve(planned.size());
  for (const auto& p : planned) requests.push_back(StepRequest{p.engine_id, p.block.actions, {}});
  const TimePoint t_start = Clock::now();
  StepStats stats;
  auto results = engine_->step(requests, &stats);
  const TimePoint t_done = Clock::now();
  engine_free_since_ = t_done;
  ++steps_;
  if (metrics() != nullptr) {
    metrics()->step_duration->Observe(to_seconds(t_done - t_start));
    metrics()->batch_size->Observe(static_cast<double>(planned.size()));
  }
  if (!results.ok()) {
    std::fprintf(stderr, "wmserve: engine step of %zu sessions failed: %s\n", planned.size(),
                 results.status().ToString().c_str());
    if (metrics() != nullptr) metrics()->engine_errors->Increment();
    for (const auto& p : planned)
      close(p.key, absl::InternalError(absl::StrCat("engine step failed: ", results.status().message())),
            EndReason::kError);
    return;
  }
  const int64_t model_us = to_us(t_done - t_start);
  for (size_t i = 0; i < planned.size(); ++i) {
    Planned& p = planned[i];
    StepResult& r = (*results)[i];
    auto info = engine_->session_info(p.engine_id);
    const int64_t kv = info.ok() ? info->kv.total() : 0;
    const bool late = p.tick.has_value() && t_done > p.tick->deadline;
    // from the session having work to this step: its frames' queue_us, and the step-wait histogram
    const int64_t queue_us = std::max<int64_t>(0, to_us(t_start - p.ready_since));
    if (metrics() != nullptr) metrics()->step_wait->Observe(static_cast<double>(queue_us) / 1e6);
    std::vector<OutFrame> frames;
    frames.reserve(r.frames.size());
    for (size_t b = 0; b < r.frames.size(); ++b) {
      OutFrame f;
      f.frame = std::move(r.frames[b]);
      f.client_time_us = p.block.client_time_us[b];
      f.arrival = p.block.arrival[b];
      f.fresh = p.block.fresh[b];
      f.queue_us = queue_us;
      f.model_us = model_us;
      f.batch_size = static_cast<int32_t>(planned.size());
      f.kv_cache_bytes = kv;
      f.deadline_missed = late;
      frames.push_back(std::move(f));
    }
    if (p.tick.has_value()) {
      const int64_t missed = (late ? static_cast<int64_t>(frames.size()) : 0) + p.tick->skipped;
      if (missed > 0) {
        if (metrics() != nullptr) metrics()->deadlines_missed->Increment(static_cast<double>(missed));
        bool tell = false;
        {
          std::lock_guard<std::mutex> lk(mu_);
          auto it = entries_.find(p.key);
          if (it != entries_.end() && t_done - it->second.last_deadline_event >= std::chrono::seconds(1)) {
            it->second.last_deadline_event = t_done;
            tell = true;
          }
        }
        // at most one event a second per session
        if (tell)
          p.session->send_event(v1::Event::WARNING, "DEADLINE_MISSED",
                                absl::StrCat("the server is behind the requested ", p.session->params().fps,
                                             " frames/s: ", missed, " frame(s) late or skipped (step took ",
                                             model_us / 1000, " ms for ", planned.size(), " sessions)"));
      }
    }
    p.session->send_frames(std::move(frames));
  }
  // the frames are on their way: now their K/V go into the caches, before any next step
  const absl::Status written = engine_->flush_writes();
  engine_free_since_ = Clock::now();
  if (!written.ok()) {
    std::fprintf(stderr, "wmserve: writing the K/V of %zu sessions failed: %s\n", planned.size(),
                 written.ToString().c_str());
    if (metrics() != nullptr) metrics()->engine_errors->Increment();
    for (const auto& p : planned)
      close(p.key, absl::InternalError(absl::StrCat("engine step failed: ", written.message())), EndReason::kError);
  }
}

void EngineWorker::publish_gauges(int queued) {
  const int64_t used = engine_->kv_used_bytes();
  kv_used_ = used;
  if (metrics() == nullptr) return;
  metrics()->sessions_active->Set(sessions_.load());
  metrics()->sessions_queued->Set(std::max(0, queued));
  metrics()->kv_bytes_used->Set(static_cast<double>(used));
  metrics()->kv_bytes_reserved->Set(static_cast<double>(engine_->kv_reserved_bytes()));
  metrics()->kv_usage_ratio->Set(static_cast<double>(used) / static_cast<double>(engine_->kv_capacity_bytes()));
  const TimePoint now = Clock::now();
  if (now - last_drift_publish_ >= std::chrono::seconds(1)) {
    last_drift_publish_ = now;
    for (const auto& [format, d] : engine_->drift_by_format())
      metrics()->set_drift(format, d);
    const BackendMemory mem = engine_->device_memory();
    metrics()->set_gpu_memory(mem.device_total, mem.device_free);
    if (const PluginBackend* p = engine_->device_plugin(); p != nullptr) {
      const auto count = [p](const char* name) {
        const absl::StatusOr<int64_t> v = p->counter(name);
        return v.ok() ? *v : 0;
      };
      metrics()->set_device_graphs(count("graph.recorded"), count("graph.recordings_failed"),
                                  count("graph.launches"));
      const int64_t coder = count("kv.span_coder"), different = count("kv.span_checks_different");
      metrics()->set_span_coder(coder, count("kv.span_checks_same"), different);
      if (different > span_checks_different_) {
        std::fprintf(stderr,
                     "wmserve: a span append coded on the device differed from the CPU coder's; the CPU's codes "
                     "were kept, and the span formats are coded %s now (docs/CUDA.md, \"Span pages\")\n",
                     coder == 2 ? "with the host's k-means and the device's token codes" : "on the host");
        span_checks_different_ = different;
      }
    }
  }
}

}  // namespace wm::server
