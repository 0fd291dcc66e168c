#include "server/session.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/image_io.h"

namespace wm::server {

namespace v1 = ::wmserve::v1;

ServerSession::ServerSession(SessionSetup setup, StreamWriter* writer, EncoderPool* encoder, Metrics* metrics)
    : setup_(std::move(setup)),
      writer_(writer),
      encoder_(encoder),
      metrics_(metrics),
      outbox_(static_cast<size_t>(std::max(1, setup_.frame_capacity)),
              static_cast<size_t>(std::max(1, setup_.event_capacity))) {}

void ServerSession::send_started(v1::Started started) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // one Started per stream: a second would jump ahead of what is queued
    if (finish_requested_ || started_queued_) return;
    OutItem item;
    *item.message.mutable_started() = std::move(started);
    outbox_.push_essential_first(std::move(item));
    started_queued_ = true;
  }
  pump();
}

void ServerSession::send_event(v1::Event::Level level, absl::string_view code, absl::string_view message,
                               uint64_t action_seq) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finish_requested_ && !flush_) return;
    OutItem item;
    v1::Event* e = item.message.mutable_event();
    e->set_level(level);
    e->set_code(std::string(code));
    e->set_message(std::string(message));
    e->set_action_seq(action_seq);
    outbox_.push_event(std::move(item));
  }
  pump();
}

void ServerSession::send_frames(std::vector<OutFrame> frames) {
  int slow = 0, ended = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if ((finish_requested_ && !flush_) || broken_) {
      ended = static_cast<int>(frames.size());
    } else {
      for (auto& f : frames) {
        OutItem item;
        item.frame = std::make_unique<OutFrame>(std::move(f));
        slow += outbox_.push_frame(std::move(item));
      }
    }
  }
  if (slow > 0) metrics_->frames_dropped_slow_client->Increment(slow);
  if (ended > 0) metrics_->frames_dropped_session_end->Increment(ended);
  pump();
}

ServerSession::~ServerSession() {
  if (on_finished_) on_finished_();
  if (on_stream_done_) on_stream_done_(broken_);
}

void ServerSession::stream_done(bool cancelled) {
  std::function<void(bool)> fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stream_done_) return;
    stream_done_ = true;
    stream_cancelled_ = cancelled;
    fn = std::move(on_stream_done_);
    on_stream_done_ = nullptr;
  }
  if (fn) fn(cancelled);
}

void ServerSession::when_stream_done(std::function<void(bool cancelled)> fn) {
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stream_done_) {
      on_stream_done_ = std::move(fn);
      return;
    }
    cancelled = stream_cancelled_;
  }
  fn(cancelled);
}

void ServerSession::when_finished(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!finish_called_) {
      on_finished_ = std::move(fn);
      return;
    }
  }
  fn();
}

void ServerSession::finish(const absl::Status& status, bool flush) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finish_requested_) return;
    finish_requested_ = true;
    flush_ = flush;
    finish_status_ = status;
  }
  pump();
}

bool ServerSession::finishing() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finish_requested_;
}

uint64_t ServerSession::frames_dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return outbox_.frames_dropped();
}

uint64_t ServerSession::frames_sent() const {
  std::lock_guard<std::mutex> lk(mu_);
  return frames_sent_;
}

void ServerSession::set_audit_result(const DriftStats& drift) {
  std::lock_guard<std::mutex> lk(mu_);
  audit_result_ = drift;
}

std::optional<DriftStats> ServerSession::audit_result() const {
  std::lock_guard<std::mutex> lk(mu_);
  return audit_result_;
}

void ServerSession::on_write_done(bool ok) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    write_in_flight_ = false;
    if (ok && writing_frame_) {
      ++frames_sent_;
      metrics_->frames_sent->Increment();
    }
    writing_frame_ = false;
    if (!ok) {
      // the stream is gone (cancelled or broken): nothing more can be written
      broken_ = true;
      if (!finish_requested_) {
        finish_requested_ = true;
        flush_ = false;
        finish_status_ = absl::CancelledError("the stream broke while writing");
      }
    }
  }
  pump();
}

void ServerSession::pump() {
  enum class Next { kNothing, kWrite, kEncode, kFinish } next = Next::kNothing;
  std::unique_ptr<OutFrame> to_encode;
  std::function<void()> finished;
  absl::Status status;
  int dropped = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finish_called_ || write_in_flight_ || encoding_) return;
    // nothing goes before Started; a stream that ends without one (its
    // session never opened) ends with its status alone
    if (!started_queued_ && !finish_requested_) return;
    if (finish_requested_ && (!flush_ || broken_ || !started_queued_)) dropped = outbox_.clear();
    auto item = outbox_.pop();
    if (!item) {
      if (finish_requested_) {
        finish_called_ = true;
        status = finish_status_;
        finished = std::move(on_finished_);
        on_finished_ = nullptr;
        next = Next::kFinish;
      }
    } else if (item->second.frame != nullptr) {
      encoding_ = true;
      to_encode = std::move(item->second.frame);
      next = Next::kEncode;
    } else {
      writing_ = std::move(item->second.message);
      writing_frame_ = false;
      write_in_flight_ = true;
      next = Next::kWrite;
    }
  }
  if (dropped > 0) metrics_->frames_dropped_session_end->Increment(dropped);
  switch (next) {
    case Next::kNothing: return;
    case Next::kWrite: writer_->start_write(&writing_); return;
    case Next::kFinish:
      writer_->finish(status);
      if (finished) finished();
      return;
    case Next::kEncode: {
      auto self = shared_from_this();
      // std::function needs a copyable callable: hand the frame over by raw pointer
      OutFrame* raw = to_encode.release();
      encoder_->submit([self, raw] { self->encode_and_write(std::unique_ptr<OutFrame>(raw)); });
      return;
    }
  }
}

void ServerSession::encode_and_write(std::unique_ptr<OutFrame> f) {
  const TimePoint t0 = Clock::now();
  auto jpeg = jpeg_encode(f->frame.rgb.data(), f->frame.width, f->frame.height, setup_.params.jpeg_quality);
  const TimePoint t1 = Clock::now();
  metrics_->jpeg_encode->Observe(to_seconds(t1 - t0));
  if (!jpeg.ok()) std::fprintf(stderr, "wmserve: session %s: %s\n", setup_.id.c_str(), jpeg.status().ToString().c_str());
  bool write = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    encoding_ = false;
    if (jpeg.ok() && !broken_ && !(finish_requested_ && !flush_)) {
      writing_.Clear();
      v1::Frame* m = writing_.mutable_frame();
      m->set_index(f->frame.index);
      m->set_last_action_seq(f->frame.action_seq);
      m->set_jpeg(std::move(*jpeg));
      m->set_width(f->frame.width);
      m->set_height(f->frame.height);
      v1::Timings* t = m->mutable_timings();
      t->set_queue_us(f->queue_us);
      t->set_model_us(f->model_us);
      t->set_encode_us(to_us(t1 - t0));
      t->set_batch_size(f->batch_size);
      m->set_kv_cache_bytes(f->kv_cache_bytes);
      m->set_client_time_us(f->client_time_us);
      m->set_frames_dropped(outbox_.frames_dropped());
      m->set_deadline_missed(f->deadline_missed);
      writing_frame_ = true;
      write_in_flight_ = true;
      write = true;
      on_frame_written(*f, Clock::now());
    }
  }
  if (write) {
    writer_->start_write(&writing_);
  } else {
    metrics_->frames_dropped_session_end->Increment();
    pump();
  }
}

// under mu_
void ServerSession::on_frame_written(const OutFrame& f, TimePoint now) {
  if (f.fresh) metrics_->action_to_frame->Observe(to_seconds(now - f.arrival));
  if (!any_frame_written_) {
    metrics_->time_to_first_frame->Observe(to_seconds(now - setup_.started));
  } else {
    metrics_->inter_frame_interval->Observe(to_seconds(now - last_frame_write_));
  }
  any_frame_written_ = true;
  last_frame_write_ = now;
}

}  // namespace wm::server
