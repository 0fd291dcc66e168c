#include "server/service.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace wm::server {

namespace v1 = ::wmserve::v1;

namespace {

// how a session of a revoked API token ends
absl::Status revoked_status() {
  return absl::UnauthenticatedError(
      "the API token this session was started with was revoked (the server's --auth_tokens changed): session "
      "closed");
}

grpc::Status to_grpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// parses a request's bytes as M (consuming them); INVALID_ARGUMENT naming M when they do not parse
template <class M>
absl::Status parse(grpc::ByteBuffer* bytes, M* out) {
  const size_t n = bytes->Length();
  out->Clear();
  if (grpc::SerializationTraits<M>::Deserialize(bytes, out).ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("a message of ", n, " bytes that does not parse as ", M::descriptor()->full_name()));
}

// a unary request's bytes parsed as M; on failure the call is finished with the reason and false returned
template <class M>
bool parse_unary(const grpc::ByteBuffer* request, M* out, grpc::ServerUnaryReactor* reactor) {
  // a call that half-closed without a message has no buffer (an empty
  // message is a valid one of 0 bytes)
  if (request == nullptr || !request->Valid()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("the call ended without a request message: send one ",
                                              M::descriptor()->full_name(), " (it may be empty)")));
    return false;
  }
  grpc::ByteBuffer bytes(*request);
  const absl::Status s = parse(&bytes, out);
  if (!s.ok()) reactor->Finish(to_grpc(s));
  return s.ok();
}

// a response's bytes
template <class M>
grpc::Status serialize(const M& msg, grpc::ByteBuffer* out) {
  bool own = false;
  return grpc::SerializationTraits<M>::Serialize(msg, out, &own);
}

// One Play stream. Until a Start is accepted the reactor answers alone;
// afterwards its ServerSession decides every write and the Finish.
class PlayReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>, public StreamWriter {
 public:
  PlayReactor(PlayService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), client_(client_of_peer(context->peer())) {
    pending_ = service_->await_start(Clock::now(), [this](const absl::Status& s) { start_timed_out(s); });
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    std::shared_ptr<ServerSession> s = session();
    if (!ok) {
      // the client half-closed (or the stream is gone: OnCancel parks or
      // closes the session, and a half-close must not close it first)
      if (s != nullptr) {
        if (!context_->IsCancelled()) service_->worker().end_input(*s);
      } else if (started_in_time()) {
        // a caller without a known API token hears that first, as at a first message
        auto user = service_->authenticate(*context_);
        if (!user.ok()) {
          reject("unauthenticated", user.status());
        } else {
          finish_once(absl::FailedPreconditionError("the stream ended before a Start message"));
        }
      }
      return;
    }
    const absl::Status parsed = parse(&read_, &request_);
    if (s == nullptr) {
      // the stream's first message: who sent it (the API token) decides
      // before what it says. Checked here rather than in the constructor,
      // so that everything the check sets lives in this one callback
      auto user = service_->authenticate(*context_);
      if (!user.ok()) {
        if (!started_in_time()) return;
        reject("unauthenticated", user.status());
        return;
      }
      user_ = user->name;
      credential_ = user->credential;
      // the per-client caps and the Start ration count per user when there are tokens
      identity_ = user_.empty() ? client_group(client_) : "user:" + user_;
      if (!parsed.ok()) {
        finish_once(parsed);
        return;
      }
      switch (request_.kind_case()) {
        case v1::PlayRequest::kStart:
          if (!started_in_time()) return;  // the start timeout ended this stream already
          if (handle_start(request_.start())) StartRead(&read_);
          return;
        case v1::PlayRequest::kAction:
          service_->metrics().actions_received->Increment();
          service_->metrics().actions_invalid("before_start").Increment();
          finish_once(absl::FailedPreconditionError(
              absl::StrCat("the first message of a Play stream must be a Start; got an Action (seq ",
                           request_.action().seq(), ")")));
          return;
        default:
          finish_once(absl::InvalidArgumentError("empty PlayRequest: set start or action"));
          return;
      }
    }
    if (s->finishing()) return;  // nothing more to read
    if (!parsed.ok()) {
      service_->metrics().actions_invalid("unparseable").Increment();
      s->send_event(v1::Event::WARNING, "INVALID_ACTION", absl::StrCat(parsed.message(), ": ignored"));
      StartRead(&read_);
      return;
    }
    switch (request_.kind_case()) {
      case v1::PlayRequest::kStart:
        service_->worker().close_stream(
            *s, absl::FailedPreconditionError("this stream already has a session: one Start per Play stream"),
            EndReason::kProtocol);
        return;
      case v1::PlayRequest::kAction:
        handle_action(*s, request_.action());
        break;
      default:
        service_->metrics().actions_invalid("empty").Increment();
        s->send_event(v1::Event::WARNING, "INVALID_ACTION", "empty PlayRequest ignored: set start or action");
        break;
    }
    StartRead(&read_);
  }

  void OnWriteDone(bool ok) override {
    if (auto s = session(); s != nullptr) s->on_write_done(ok);
  }

  void OnCancel() override {
    std::shared_ptr<ServerSession> s;
    {
      std::lock_guard<std::mutex> lk(mu_);
      cancelled_ = true;
      s = session_;
    }
    if (s == nullptr) {
      finish_once(absl::CancelledError("cancelled"));
      return;
    }
    // a broken stream parks its session (--park_ttl_s) for a resume
    service_->park_or_close(s, absl::CancelledError("the client cancelled the stream"), EndReason::kCancelled);
    s->finish(absl::CancelledError("the client cancelled the stream"), false);
  }

  void OnDone() override {
    // a safety net: a session never outlives its stream unless it is parked
    if (auto s = session(); s != nullptr) {
      service_->park_or_close(s, absl::CancelledError("stream done"), EndReason::kCancelled);
      s->stream_done(context_->IsCancelled());
    }
    if (pending_ != nullptr) {
      std::lock_guard<std::recursive_mutex> lk(pending_->mu);  // waits for a sweep finishing this stream
      pending_->finish = nullptr;
    }
    delete this;
  }

  // StreamWriter: called by the ServerSession only
  // the session has one write in flight at a time: its bytes live in write_ until OnWriteDone
  void start_write(const v1::PlayResponse* msg) override {
    write_.Clear();
    const grpc::Status st = serialize(*msg, &write_);
    if (!st.ok()) {
      // the stream ends with the reason; the session then learns that its write failed
      finish_once(absl::InternalError(absl::StrCat("a PlayResponse did not serialize: ", st.error_message())));
      if (auto s = session(); s != nullptr) s->on_write_done(false);
      return;
    }
    StartWrite(&write_);
  }
  void finish(const absl::Status& status) override { finish_once(status); }

 private:
  std::shared_ptr<ServerSession> session() {
    std::lock_guard<std::mutex> lk(mu_);
    return session_;
  }

  // the Start arrived: the start timeout no longer applies; false when it fired first
  bool started_in_time() {
    if (pending_ == nullptr) return true;
    std::lock_guard<std::recursive_mutex> lk(pending_->mu);
    const bool in_time = pending_->finish != nullptr;
    pending_->finish = nullptr;
    return in_time;
  }

  void finish_once(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(to_grpc(status));
  }

  void reject(absl::string_view reason, const absl::Status& status) {
    service_->metrics().sessions_rejected(reason).Increment();
    finish_once(status);
  }

  // the Start timeout (sweep_idle's thread, under pending_->mu, while the
  // stream is open): a caller without a known API token hears that, as at a
  // first message, rather than that it was slow
  void start_timed_out(const absl::Status& timeout) {
    auto user = service_->authenticate(*context_);
    if (!user.ok()) {
      reject("unauthenticated", user.status());
      return;
    }
    reject("start_timeout", timeout);
  }

  // a Start with a resume token: every other field is ignored
  bool handle_resume(const v1::Start& start, TimePoint now) {
    // with tokens, only the user who started a session resumes it
    auto s = service_->resume(start.resume_token(), this, now, user_.empty() ? "" : identity_, client_);
    if (!s.ok()) {
      finish_once(s.status());  // resume() counted the rejection
      return false;
    }
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      cancelled = cancelled_;
      if (!cancelled) session_ = *s;
    }
    if (cancelled) {
      // the new stream is gone already: the session goes back to its parking,
      // and its ServerSession is finished now (as OnCancel finishes one), so
      // that a later close of the parked session never reaches this reactor,
      // which is deleted once the stream is done
      service_->park_or_close(*s, absl::CancelledError("cancelled"), EndReason::kCancelled);
      (*s)->finish(absl::CancelledError("cancelled"), /*flush=*/false);
      finish_once(absl::CancelledError("cancelled"));
      return false;
    }
    if (SessionLog* log = service_->session_log(); log != nullptr) log->resumed(**s);
    service_->worker().activate(*s);
    return true;
  }

  bool handle_start(const v1::Start& start) {
    const TimePoint now = Clock::now();
    if (!start.resume_token().empty()) return handle_resume(start, now);
    // a client past its prompt frames is refused before its JPEGs are
    // decoded (admit checks again, with the model's own prompt counted)
    if (const int n = start.prompt_jpeg_size(); n > 0 && n <= service_->config().limits.max_prompt_frames) {
      if (absl::Status st = service_->check_prompt_frames(identity_, n, now); !st.ok()) {
        reject("prompt_rate", st);
        return false;
      }
    }
    int prompts_decoded = 0;
    auto params = parse_start(start, service_->model(), service_->config().limits, &prompts_decoded);
    if (!params.ok()) {
      // its JPEGs were decoded all the same: they count against the ration,
      // or a client could have the server decode prompts without end
      service_->charge_prompt_frames(identity_, prompts_decoded, now);
      absl::string_view reason = "invalid_start";
      if (absl::IsNotFound(params.status()))
        reason = (!start.model().empty() && start.model() != service_->model().config.name) ? "unknown_model"
                                                                                              : "unknown_format";
      if (absl::IsUnimplemented(params.status())) reason = "unimplemented";
      reject(reason, params.status());
      return false;
    }
    std::string token;
    // a Start costs its prompt frames, and at least one: a client that
    // starts and drops sessions without prompts is rationed too
    const int prompt_frames = std::max(1, static_cast<int>(params->prompt.size()));
    auto key = service_->admit(identity_, credential_, params->cache_format, prompt_frames, &params->audit, now,
                               &token);
    if (!key.ok()) {
      finish_once(key.status());  // admit() counted the rejection
      return false;
    }
    SessionSetup setup;
    setup.id = service_->new_session_id();
    setup.key = *key;
    setup.client = client_;
    setup.user = user_;
    setup.params = std::move(*params);
    setup.resume_token = std::move(token);
    setup.started = now;
    // the unsent rest of the block being written plus one newer block; with
    // one frame per block a newer frame replaces the unsent one
    setup.frame_capacity = 2 * service_->model().config.frames_per_block - 1;
    setup.event_capacity = service_->config().event_capacity;
    auto s = std::make_shared<ServerSession>(std::move(setup), this, &service_->encoder(), &service_->metrics());
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (cancelled_) {
        service_->release(*key);
        s = nullptr;
      } else {
        session_ = s;
      }
    }
    if (s == nullptr) {
      finish_once(absl::CancelledError("cancelled"));
      return false;
    }
    service_->worker().open(s);
    // a reload between admit() and here swept before the worker knew the
    // session (set_tokens swaps the tokens, then sweeps): close it now
    if (!service_->still_authorized(credential_))
      service_->worker().close(*key, revoked_status(), EndReason::kRevoked);
    return true;
  }

  void handle_action(ServerSession& s, const v1::Action& msg) {
    const TimePoint now = Clock::now();
    Metrics& m = service_->metrics();
    m.actions_received->Increment();
    auto action = parse_action(msg, service_->model().config.actions);
    if (!action.ok()) {
      m.actions_invalid("out_of_range").Increment();
      s.send_event(v1::Event::WARNING, "INVALID_ACTION",
                   absl::StrCat("action ", msg.seq(), " dropped: ", action.status().message()), msg.seq());
      return;
    }
    TimedAction ta{*action, msg.client_time_us(), now};
    const absl::Status st = service_->worker().submit(s, ta);
    if (st.ok()) {
      service_->touch(s.key(), now);
    } else if (absl::IsInvalidArgument(st)) {
      m.actions_invalid("bad_seq").Increment();
      s.send_event(v1::Event::WARNING, "INVALID_ACTION", absl::StrCat("action dropped: ", st.message()), msg.seq());
    } else if (absl::IsResourceExhausted(st)) {
      m.actions_dropped_queue_full->Increment();
      s.send_event(v1::Event::WARNING, "ACTION_QUEUE_FULL", st.message(), msg.seq());
    }
    // FAILED_PRECONDITION: the session is ending; the action has no use
  }

  PlayService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string client_;
  std::string user_;       // the API token's name, "" without tokens
  std::string credential_;  // the API token's digest, "" without tokens
  std::string identity_;   // what the per-client caps count: the user, or else the address
  grpc::ByteBuffer read_;     // the message being read
  v1::PlayRequest request_;  // ... parsed
  grpc::ByteBuffer write_;    // the message being written
  std::mutex mu_;
  std::shared_ptr<ServerSession> session_;
  std::shared_ptr<PendingStart> pending_;  // until the Start arrives
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace

PlayService::PlayService(ServiceConfig config, const ServedModel& model, SessionManagerConfig manager,
                         EngineWorker* worker, EncoderPool* encoder, Metrics* metrics, SessionLog* session_log)
    : config_(std::move(config)),
      model_(model),
      worker_(worker),
      encoder_(encoder),
      metrics_(metrics),
      session_log_(session_log),
      manager_(std::move(manager)),
      tokens_(config_.tokens) {
  std::random_device rd;
  id_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

void PlayService::set_health(grpc::HealthCheckServiceInterface* health) {
  std::lock_guard<std::mutex> lk(mu_);
  health_ = health;
  if (health_ != nullptr) health_->SetServingStatus("", true);
  admitting_ = -1;
  update_health_locked();
}

void PlayService::update_health_locked() {
  const bool can = manager_.can_admit(model_.default_format);
  metrics_->admitting->Set(can ? 1 : 0);
  if (health_ == nullptr || admitting_ == static_cast<int>(can)) return;
  admitting_ = can;
  health_->SetServingStatus(kAdmitHealthService, can);
}

absl::StatusOr<SessionManager::Key> PlayService::admit(const std::string& client, const std::string& credential,
                                                       const std::string& format, int prompt_frames, bool* audit,
                                                       TimePoint now, std::string* token) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!credential.empty()) {
    // a reload between this stream's first message and now: set_tokens
    // sweeps the sessions admitted before it takes mu_, this refuses the rest
    std::shared_ptr<const TokenTable> tokens;
    {
      std::lock_guard<std::mutex> tl(tokens_mu_);
      tokens = tokens_;
    }
    if (tokens == nullptr || !tokens->holds(credential)) {
      metrics_->sessions_rejected("unauthenticated").Increment();
      return absl::UnauthenticatedError("this API token was revoked (the server's --auth_tokens changed)");
    }
  }
  RejectReason reason = RejectReason::kNone;
  std::string t = new_resume_token_locked();
  // deterministic and evenly spread: the n-th admitted session is audited
  // when the running count of fraction * n crosses an integer
  bool sampled = false;
  if (!*audit && model_.audit_supported && config_.audit_fraction > 0) {
    const double f = std::min(1.0, config_.audit_fraction);
    sampled = std::floor(f * static_cast<double>(admitted_ + 1)) > std::floor(f * static_cast<double>(admitted_));
  }
  AdmitRequest request{client, format, t};
  request.credential = credential;
  request.audit = *audit || sampled;
  request.prompt_frames = prompt_frames;
  auto key = manager_.admit(request, now, &reason);
  if (!key.ok()) {
    metrics_->sessions_rejected(reject_reason_label(reason)).Increment();
    return key.status();
  }
  ++admitted_;
  *audit = request.audit;
  *token = std::move(t);
  update_health_locked();
  return key;
}

std::string PlayService::new_resume_token_locked() {
  // 128 bits from the OS's generator, hex: unguessable, unlike session ids
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(static_cast<uint32_t>(entropy_()), absl::kZeroPad8));
  return token;
}

void PlayService::park_or_close(const std::shared_ptr<ServerSession>& session, const absl::Status& status,
                                EndReason reason) {
  bool parked = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // the worker first: it knows whether the engine state is still there
    if (manager_.can_park(session->key()) && worker_->park(*session)) {
      parked = manager_.park(session->key(), Clock::now());
      metrics_->sessions_parked_total->Increment();
      metrics_->sessions_parked->Set(manager_.parked());
      // under the lock: a resume (which takes it) is logged after this
      if (parked && session_log_ != nullptr) session_log_->parked(*session);
    }
  }
  if (!parked) worker_->close_stream(*session, status, reason);
}

bool PlayService::still_authorized(const std::string& credential) const {
  if (credential.empty()) return true;
  std::lock_guard<std::mutex> lk(tokens_mu_);
  return tokens_ != nullptr && tokens_->holds(credential);
}

absl::StatusOr<Caller> PlayService::authenticate(const grpc::CallbackServerContext& context) const {
  std::shared_ptr<const TokenTable> tokens;
  {
    std::lock_guard<std::mutex> lk(tokens_mu_);
    tokens = tokens_;
  }
  if (tokens == nullptr) return Caller();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  return tokens->identify(it == md.end() ? absl::string_view()
                                         : absl::string_view(it->second.data(), it->second.size()));
}

int PlayService::set_tokens(std::shared_ptr<const TokenTable> tokens) {
  {
    std::lock_guard<std::mutex> lk(tokens_mu_);
    tokens_ = tokens;
  }
  std::vector<SessionManager::Key> revoked;
  {
    std::lock_guard<std::mutex> lk(mu_);
    revoked = manager_.take_revoked(
        [&](const std::string& credential) { return tokens != nullptr && tokens->holds(credential); });
  }
  // open sessions are told on their stream; a parked one has none
  for (auto key : revoked) worker_->close(key, revoked_status(), EndReason::kRevoked);
  return static_cast<int>(revoked.size());
}

absl::StatusOr<std::shared_ptr<ServerSession>> PlayService::resume(absl::string_view token, StreamWriter* writer,
                                                                   TimePoint now, absl::string_view only_client,
                                                                   const std::string& address) {
  std::lock_guard<std::mutex> lk(mu_);
  auto key = manager_.unpark(token, now, only_client);
  if (!key.ok()) {
    metrics_->sessions_rejected(absl::IsAlreadyExists(key.status()) ? "resume_attached"
                                : absl::IsUnavailable(key.status()) ? "resume_draining"
                                                                    : "resume_not_found")
        .Increment();
    return key.status();
  }
  metrics_->sessions_parked->Set(manager_.parked());
  std::shared_ptr<ServerSession> old = worker_->parked_session(*key);
  if (old != nullptr) {
    SessionSetup setup = old->setup();
    setup.client = address;
    auto fresh = std::make_shared<ServerSession>(std::move(setup), writer, encoder_, metrics_);
    if (worker_->attach(fresh)) {
      metrics_->sessions_resumed->Increment();
      return fresh;
    }
  }
  // the session is being closed (its release follows)
  metrics_->sessions_rejected("resume_not_found").Increment();
  return absl::NotFoundError("the session of this resume token has ended; start a new session");
}

void PlayService::close_parked(const std::vector<SessionManager::Key>& keys, const absl::Status& status,
                               EndReason reason) {
  for (auto key : keys) worker_->close(key, status, reason);
}

absl::Status PlayService::check_prompt_frames(const std::string& client, int prompt_frames, TimePoint now) {
  std::lock_guard<std::mutex> lk(mu_);
  return manager_.check_prompt_frames(client, prompt_frames, now);
}

void PlayService::charge_prompt_frames(const std::string& client, int prompt_frames, TimePoint now) {
  std::lock_guard<std::mutex> lk(mu_);
  manager_.charge_prompt_frames(client, prompt_frames, now);
}

void PlayService::release(SessionManager::Key key) {
  std::lock_guard<std::mutex> lk(mu_);
  manager_.release(key);
  update_health_locked();
}

void PlayService::touch(SessionManager::Key key, TimePoint now) {
  std::lock_guard<std::mutex> lk(mu_);
  manager_.touch(key, now);
}

std::string PlayService::new_session_id() {
  std::lock_guard<std::mutex> lk(mu_);
  // splitmix64 over a random start: unique and not guessable from the count
  uint64_t z = (id_state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return absl::StrFormat("%016x", z ^ (z >> 31));
}

void PlayService::on_session_closed(const std::shared_ptr<ServerSession>& session, EndReason reason, bool opened) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    manager_.release(session->key());
    update_health_locked();
    metrics_->sessions_parked->Set(manager_.parked());
  }
  // started = ended + active: a session the engine never opened was not started
  if (!opened) return;
  const double seconds = to_seconds(Clock::now() - session->started());
  metrics_->session_duration->Observe(seconds);
  SessionLog* log = session_log_;
  ServerSession* raw = session.get();  // the callbacks run while it lives
  if (reason == EndReason::kClientClosed) {
    // a half-close ends the session once its last frames and OK have gone
    // out; a stream that breaks first (the client cancels or disconnects,
    // gRPC refuses an oversize message) ended it as cancelled. Counted and
    // logged when the stream is over
    Metrics* metrics = metrics_;
    session->when_stream_done([metrics, log, raw, seconds](bool cancelled) {
      const EndReason r = cancelled ? EndReason::kCancelled : EndReason::kClientClosed;
      if (log != nullptr) log->ended(*raw, r, seconds);  // first: a reader who saw the count finds the line
      metrics->sessions_ended(r).Increment();
    });
    return;
  }
  metrics_->sessions_ended(reason).Increment();
  if (reason == EndReason::kIdleTtl) metrics_->sessions_evicted_idle->Increment();
  // logged once the stream has its status: the frames still being written
  // when the session closed are counted
  if (log != nullptr) session->when_finished([log, raw, reason, seconds] { log->ended(*raw, reason, seconds); });
}

std::shared_ptr<PendingStart> PlayService::await_start(TimePoint now,
                                                      std::function<void(const absl::Status&)> finish) {
  if (config_.start_timeout <= Duration::zero()) return nullptr;
  auto p = std::make_shared<PendingStart>();
  p->finish = std::move(finish);
  p->deadline = now + config_.start_timeout;
  std::lock_guard<std::mutex> lk(pending_mu_);
  pending_.push_back(p);
  return p;
}

void PlayService::sweep_idle(TimePoint now) {
  std::vector<std::shared_ptr<PendingStart>> pending;
  {
    std::lock_guard<std::mutex> lk(pending_mu_);
    pending.swap(pending_);
  }
  std::vector<std::shared_ptr<PendingStart>> waiting;
  for (auto& p : pending) {
    std::lock_guard<std::recursive_mutex> lk(p->mu);
    if (p->finish == nullptr) continue;  // started or gone
    if (now < p->deadline) {
      waiting.push_back(p);
      continue;
    }
    // a copy: finishing may end the stream, whose OnDone clears p->finish
    const auto finish = std::exchange(p->finish, nullptr);
    finish(absl::DeadlineExceededError(absl::StrCat("no Start message within ",
                                                    to_seconds(config_.start_timeout),
                                                    " s of opening the Play stream (--start_timeout_s)")));
  }
  {
    std::lock_guard<std::mutex> lk(pending_mu_);
    pending_.insert(pending_.end(), waiting.begin(), waiting.end());
  }

  std::vector<SessionManager::Key> expired, park_expired;
  double ttl = 0, park_ttl = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    expired = manager_.take_expired(now);
    park_expired = manager_.take_park_expired(now);
    ttl = to_seconds(manager_.config().idle_ttl);
    park_ttl = to_seconds(manager_.config().park_ttl);
  }
  // no stream is told: a parked session has none
  close_parked(park_expired,
               absl::DeadlineExceededError(absl::StrCat("parked for ", park_ttl, " s (--park_ttl_s)")),
               EndReason::kParkExpired);
  for (auto key : expired)
    worker_->close(key,
                   absl::DeadlineExceededError(absl::StrCat("no action for ", ttl,
                                                            " s (the server's idle TTL, --idle_ttl_s): session closed; "
                                                            "start a new one")),
                   EndReason::kIdleTtl);
}

void PlayService::begin_drain(double grace_seconds) {
  std::vector<SessionManager::Key> parked;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (manager_.draining()) return;  // told once
    manager_.set_draining();
    // tokens do not outlive the process: parked sessions end now
    parked = manager_.take_parked();
    update_health_locked();
    // "" and the admit service NOT_SERVING, and they stay so
    if (health_ != nullptr) health_->Shutdown();
  }
  close_parked(parked, absl::UnavailableError("the server is shutting down"), EndReason::kShutdown);
  worker_->broadcast_event(v1::Event::WARNING, "SERVER_DRAINING",
                           absl::StrCat("the server is shutting down: this session ends within ", grace_seconds,
                                        " s; start a new one elsewhere"));
}

int PlayService::sessions() const {
  std::lock_guard<std::mutex> lk(mu_);
  return manager_.sessions();
}

std::pair<int, int> PlayService::sessions_and_parked() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {manager_.sessions(), manager_.parked()};
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PlayService::Play(grpc::CallbackServerContext* context) {
  return new PlayReactor(this, context);
}

grpc::ServerUnaryReactor* PlayService::ListModels(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  if (auto user = authenticate(*context); !user.ok()) {
    reactor->Finish(to_grpc(user.status()));
    return reactor;
  }
  v1::ListModelsRequest req;
  if (!parse_unary(request, &req, reactor)) return reactor;
  v1::ListModelsResponse msg;
  fill_model_info(model_, msg.add_models());
  reactor->Finish(serialize(msg, response));
  return reactor;
}

grpc::ServerUnaryReactor* PlayService::GetServerInfo(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  if (auto user = authenticate(*context); !user.ok()) {
    reactor->Finish(to_grpc(user.status()));
    return reactor;
  }
  v1::GetServerInfoRequest req;
  if (!parse_unary(request, &req, reactor)) return reactor;
  v1::ServerInfo info;
  info.set_version(config_.version);
  info.add_models(model_.config.name);
  for (const auto& f : model_.cache_formats) info.add_cache_formats(f);
  info.set_default_cache_format(model_.default_format);
  info.set_device(model_.device);
  info.set_max_request_bytes(config_.max_request_bytes);
  info.set_max_prompt_frames(config_.limits.max_prompt_frames);
  info.set_max_connections_per_client(config_.connections.max_per_client);
  info.set_client_connection_rate(config_.connections.rate_per_client);
  info.set_client_connection_burst(config_.connections.burst_per_client);
  info.set_max_calls_per_connection(config_.connections.max_calls_per_s);
  info.set_kv_used_bytes(worker_->kv_used_bytes());
  {
    std::lock_guard<std::mutex> lk(mu_);
    info.set_kv_capacity_bytes(manager_.capacity_bytes());
    info.set_kv_reserved_bytes(manager_.reserved_bytes());
    info.set_kv_free_bytes(manager_.free_bytes());
    info.set_sessions_active(manager_.sessions());
    info.set_max_sessions(manager_.config().max_sessions);
    info.set_max_sessions_per_client(manager_.config().max_sessions_per_client);
    info.set_client_prompt_rate(manager_.config().client_prompt_rate);
    info.set_client_prompt_burst(manager_.config().client_prompt_burst);
    info.set_draining(manager_.draining());
    info.set_admitting(manager_.can_admit(model_.default_format));
    info.set_idle_ttl_seconds(to_seconds(manager_.config().idle_ttl));
  }
  reactor->Finish(serialize(info, response));
  return reactor;
}

}  // namespace wm::server
