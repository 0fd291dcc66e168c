// A few threads that JPEG-encode frames off the engine thread.
//
// The queue needs no bound of its own: every session has at most one frame
// being encoded (server/session.h), so it holds at most one job per session.
// Threading: submit() from any thread; stop() once, from the owner.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace wm::server {

class EncoderPool {
 public:
  explicit EncoderPool(int threads);
  ~EncoderPool();
  EncoderPool(const EncoderPool&) = delete;
  EncoderPool& operator=(const EncoderPool&) = delete;

  void submit(std::function<void()> job);
  // runs the jobs already queued, then joins the threads; later submits run inline
  void stop();
  size_t queued() const;

 private:
  void run();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace wm::server
