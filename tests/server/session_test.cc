// A session's output path with a fake stream: one write in flight, frames
// that arrive meanwhile replace older unsent ones (counted as slow_client),
// the Finish waits for the write in flight, flush or not.
#include "server/session.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "common/image_io.h"
#include "server/session_log.h"

namespace wm::server {
namespace {

namespace v1 = ::wmserve::v1;

class FakeWriter : public StreamWriter {
 public:
  void start_write(const v1::PlayResponse* msg) override {
    std::lock_guard<std::mutex> lk(mu_);
    EXPECT_FALSE(in_flight_) << "two writes in flight";
    EXPECT_FALSE(finished_) << "a write after finish";
    in_flight_ = true;
    writes_.push_back(*msg);
    cv_.notify_all();
  }
  void finish(const absl::Status& status) override {
    std::lock_guard<std::mutex> lk(mu_);
    EXPECT_FALSE(in_flight_) << "finish with a write in flight";
    EXPECT_FALSE(finished_) << "finish twice";
    finished_ = true;
    status_ = status;
    cv_.notify_all();
  }
  // waits until n writes have started (or finish)
  bool wait_writes(size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return writes_.size() >= n; });
  }
  bool wait_finished() {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return finished_; });
  }
  void complete(ServerSession& s, bool ok = true) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ASSERT_TRUE(in_flight_);
      in_flight_ = false;
    }
    s.on_write_done(ok);
  }
  std::vector<v1::PlayResponse> writes() {
    std::lock_guard<std::mutex> lk(mu_);
    return writes_;
  }
  bool finished() {
    std::lock_guard<std::mutex> lk(mu_);
    return finished_;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lk(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool in_flight_ = false;
  bool finished_ = false;
  absl::Status status_;
  std::vector<v1::PlayResponse> writes_;
};

struct Fixture {
  Fixture() : encoder(1) {
    model.config.name = "m";
    model.default_format = "fp16";
    model.reservation_bytes["fp16"] = 100;
    model.compression_ratio["fp16"] = 1;
    metrics = std::make_unique<Metrics>(model, "test");
    SessionSetup setup;
    setup.id = "s1";
    setup.key = 1;
    setup.params.jpeg_quality = 80;
    setup.frame_capacity = 1;
    session = std::make_shared<ServerSession>(std::move(setup), &writer, &encoder, metrics.get());
  }
  OutFrame frame(int64_t index) {
    OutFrame f;
    f.frame.index = index;
    f.frame.action_seq = static_cast<uint64_t>(index + 1);
    f.frame.width = 8;
    f.frame.height = 8;
    f.frame.rgb.assign(8 * 8 * 3, static_cast<uint8_t>(index * 10));
    return f;
  }
  void send(int64_t index) {
    std::vector<OutFrame> v;
    v.push_back(frame(index));
    session->send_frames(std::move(v));
  }
  // Started, written: the first write of every stream
  void started() {
    session->send_started(v1::Started());
    ASSERT_TRUE(writer.wait_writes(1));
    writer.complete(*session);
  }
  ServedModel model;
  EncoderPool encoder;
  std::unique_ptr<Metrics> metrics;
  FakeWriter writer;
  std::shared_ptr<ServerSession> session;
};

TEST(ServerSession, OneWriteInFlightAndNewerFramesReplaceUnsentOnes) {
  Fixture t;
  t.session->send_started(v1::Started());
  ASSERT_TRUE(t.writer.wait_writes(1));
  // the client is slow: frames 0..4 arrive while Started is still in flight
  for (int i = 0; i < 5; ++i) t.send(i);
  EXPECT_EQ(t.writer.writes().size(), 1u);
  EXPECT_EQ(t.session->frames_dropped(), 4u);  // only frame 4 waits
  EXPECT_EQ(t.metrics->frames_dropped_slow_client->Value(), 4);
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_writes(2));
  const auto w = t.writer.writes();
  ASSERT_TRUE(w[1].has_frame());
  EXPECT_EQ(w[1].frame().index(), 4);
  EXPECT_EQ(w[1].frame().last_action_seq(), 5u);
  EXPECT_EQ(w[1].frame().frames_dropped(), 4u);
  auto img = jpeg_decode(w[1].frame().jpeg().data(), w[1].frame().jpeg().size());
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->width, 8);
  EXPECT_NEAR(img->pixels[0], 40, 2);
  t.writer.complete(*t.session);
  EXPECT_EQ(t.session->frames_sent(), 1u);
  EXPECT_EQ(t.metrics->frames_sent->Value(), 1);
}

TEST(ServerSession, FinishWaitsForTheWriteInFlight) {
  Fixture t;
  t.started();
  t.send(0);
  ASSERT_TRUE(t.writer.wait_writes(2));
  t.send(1);  // waits
  t.session->finish(absl::UnavailableError("bye"), /*flush=*/false);
  EXPECT_FALSE(t.writer.finished());
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_finished());
  EXPECT_EQ(t.writer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t.writer.writes().size(), 2u);  // frame 1 was dropped, not written
  EXPECT_EQ(t.metrics->frames_dropped_session_end->Value(), 1);
  // later frames and events go nowhere, and nothing touches the writer again
  t.send(2);
  t.session->send_event(v1::Event::WARNING, "X", "late");
  t.session->finish(absl::OkStatus(), true);
  EXPECT_EQ(t.writer.writes().size(), 2u);
}

TEST(ServerSession, FlushWritesWhatIsQueuedThenFinishes) {
  Fixture t;
  t.started();
  t.send(0);
  ASSERT_TRUE(t.writer.wait_writes(2));
  t.session->send_event(v1::Event::WARNING, "INVALID_ACTION", "x", 7);
  t.send(1);
  t.session->finish(absl::OkStatus(), /*flush=*/true);
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_writes(3));
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_writes(4));
  EXPECT_FALSE(t.writer.finished());
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_finished());
  EXPECT_TRUE(t.writer.status().ok());
  const auto w = t.writer.writes();
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[2].event().code(), "INVALID_ACTION");
  EXPECT_EQ(w[2].event().action_seq(), 7u);
  EXPECT_EQ(w[3].frame().index(), 1);
}

// what the session log reports at the end waits for the stream's status:
// a frame still being written when the session closed is counted
TEST(ServerSession, WhenFinishedRunsOnceTheLastFrameIsCounted) {
  Fixture t;
  t.started();
  t.send(0);
  ASSERT_TRUE(t.writer.wait_writes(2));
  t.session->finish(absl::OkStatus(), /*flush=*/true);
  std::atomic<int> calls{0};
  std::atomic<uint64_t> sent_then{0};
  t.session->when_finished([&] {
    ++calls;
    sent_then = t.session->frames_sent();
  });
  EXPECT_EQ(calls.load(), 0);  // frame 0 is in flight
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_finished());
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(sent_then.load(), 1u);
  // after the finish: at once
  t.session->when_finished([&] { ++calls; });
  EXPECT_EQ(calls.load(), 2);
  // a session destroyed before its stream finished runs its callback then
  Fixture u;
  u.started();
  bool ran = false;
  u.session->when_finished([&] { ran = true; });
  EXPECT_FALSE(ran);
  u.session.reset();
  EXPECT_TRUE(ran);
}

// a half-closed session's end is counted once the stream is over: the
// callback gets whether the stream failed before the client had its status
TEST(ServerSession, WhenStreamDoneTellsWhetherTheStreamWasCancelled) {
  Fixture t;
  t.started();
  std::vector<bool> seen;
  t.session->when_stream_done([&](bool cancelled) { seen.push_back(cancelled); });
  t.session->finish(absl::OkStatus(), /*flush=*/true);
  ASSERT_TRUE(t.writer.wait_finished());
  EXPECT_TRUE(seen.empty()) << "the status is handed over, the stream not yet over";
  t.session->stream_done(true);
  t.session->stream_done(false);  // once only
  EXPECT_EQ(seen, std::vector<bool>{true});
  // after the stream is over: at once, with what it was
  t.session->when_stream_done([&](bool cancelled) { seen.push_back(cancelled); });
  EXPECT_EQ(seen, (std::vector<bool>{true, true}));
  // a session destroyed first runs it then: cancelled when a write had failed
  // (Started is the write that fails: a frame's encoder job could hold the
  // session a moment after its write, and destroy it on its own thread)
  for (const bool fail : {false, true}) {
    Fixture u;
    u.session->send_started(v1::Started());
    ASSERT_TRUE(u.writer.wait_writes(1));
    u.writer.complete(*u.session, /*ok=*/!fail);
    std::vector<bool> got;
    u.session->when_stream_done([&](bool cancelled) { got.push_back(cancelled); });
    u.session.reset();
    EXPECT_EQ(got, std::vector<bool>{fail});
  }
}

TEST(ServerSession, AFailedWriteEndsTheStream) {
  Fixture t;
  t.started();
  t.send(0);
  ASSERT_TRUE(t.writer.wait_writes(2));
  t.send(1);
  t.writer.complete(*t.session, /*ok=*/false);
  ASSERT_TRUE(t.writer.wait_finished());
  EXPECT_EQ(t.writer.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(t.writer.writes().size(), 2u);
  EXPECT_TRUE(t.session->finishing());
}

// an event made before the session opened (an invalid action sent right
// after the Start) waits for Started, which goes first; a stream whose
// session never opened ends with its status alone
TEST(ServerSession, NothingIsWrittenBeforeStarted) {
  Fixture t;
  t.session->send_event(v1::Event::WARNING, "INVALID_ACTION", "early", 1);
  EXPECT_TRUE(t.writer.writes().empty());  // messages are written at once when nothing holds them
  t.session->send_started(v1::Started());
  ASSERT_TRUE(t.writer.wait_writes(1));
  t.writer.complete(*t.session);
  ASSERT_TRUE(t.writer.wait_writes(2));
  const auto w = t.writer.writes();
  EXPECT_TRUE(w[0].has_started());
  EXPECT_EQ(w[1].event().code(), "INVALID_ACTION");

  // a second Started writes nothing
  t.session->send_started(v1::Started());
  t.writer.complete(*t.session);
  EXPECT_EQ(t.writer.writes().size(), 2u);

  // held events stay bounded (the oldest go); Started goes ahead of them all
  Fixture many;
  for (int i = 0; i < 20; ++i)
    many.session->send_event(v1::Event::WARNING, "INVALID_ACTION", "early", static_cast<uint64_t>(i));
  EXPECT_TRUE(many.writer.writes().empty());
  many.session->send_started(v1::Started());
  for (size_t n = 1; n <= 17; ++n) {
    ASSERT_TRUE(many.writer.wait_writes(n));
    many.writer.complete(*many.session);
  }
  const auto mw = many.writer.writes();
  ASSERT_EQ(mw.size(), 17u);  // Started and the newest 16 events
  EXPECT_TRUE(mw[0].has_started());
  EXPECT_EQ(mw[1].event().action_seq(), 4u);
  EXPECT_EQ(mw[16].event().action_seq(), 19u);

  // a session that never opens ends with its status alone, flushed or not
  for (bool flush : {false, true}) {
    Fixture never;
    never.session->send_event(v1::Event::WARNING, "INVALID_ACTION", "early", 1);
    never.session->finish(absl::ResourceExhaustedError("no room"), flush);
    ASSERT_TRUE(never.writer.wait_finished());
    EXPECT_EQ(never.writer.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(never.writer.writes().empty());
    never.session->send_started(v1::Started());  // too late: nothing touches the writer
    EXPECT_TRUE(never.writer.writes().empty());
  }
}

// the session log's writer is its own thread: a log nobody reads (a pipe
// left full) costs lines, counted and reported, never the caller's time
TEST(SessionLog, AWriterThatCannotKeepUpDropsLinesAndNeverBlocksTheCaller) {
  Fixture f;
  const std::string fifo = ::testing::TempDir() + "/session_log_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // there, but not reading yet
  ASSERT_GE(reader, 0);
  auto log = SessionLog::open(fifo, /*max_queued=*/8);
  ASSERT_TRUE(log.ok()) << log.status();
  // some 2.5 MB of lines against a 64 KiB pipe: the calls return at once
  const int kLines = 20000;
  for (int i = 0; i < kLines; ++i) (*log)->parked(*f.session);
  EXPECT_GT((*log)->dropped(), 0);
  // now read it all: every line whole JSON, and the drops said
  ASSERT_EQ(::fcntl(reader, F_SETFL, 0), 0);
  std::string text;
  std::thread drain([&] {
    char buf[65536];
    for (ssize_t n; (n = ::read(reader, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  });
  const int64_t dropped = (*log)->dropped();
  log->reset();  // writes what is queued, then closes the pipe: the reader sees its end
  drain.join();
  ::close(reader);
  ::unlink(fifo.c_str());
  int64_t parks = 0, reported = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);  // throws on a broken line
    if (j["event"] == "park") {
      ++parks;
      EXPECT_EQ(j["session"], "s1");
    } else {
      EXPECT_EQ(j["event"], "dropped");
      reported += j["lines"].get<int64_t>();
    }
  }
  EXPECT_EQ(parks + dropped, kLines);
  EXPECT_EQ(reported, dropped);
}

// a FIFO with no reader is refused at once, at start-up and at a reopen
// (SIGHUP): opening it would wait for a reader, on the main thread
TEST(SessionLog, AFifoWithNoReaderIsRefusedNotWaitedFor) {
  const std::string fifo = ::testing::TempDir() + "/session_log_noreader_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto none = SessionLog::open(fifo);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "a FIFO that nobody reads")) << none.status();
  // with a reader it opens; once the reader is gone a reopen is refused and
  // the log keeps what it had
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  auto log = SessionLog::open(fifo);
  ASSERT_TRUE(log.ok()) << log.status();
  ::close(reader);
  const absl::Status again = (*log)->reopen();
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(again.message(), "a FIFO that nobody reads")) << again;
  log->reset();
  ::unlink(fifo.c_str());
}

}  // namespace
}  // namespace wm::server
