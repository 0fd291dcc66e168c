#include "server/encoder_pool.h"

#include <algorithm>

namespace wm::server {

EncoderPool::EncoderPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { run(); });
}

EncoderPool::~EncoderPool() { stop(); }

void EncoderPool::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_) {
      jobs_.push_back(std::move(job));
      cv_.notify_one();
      return;
    }
  }
  job();
}

void EncoderPool::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

size_t EncoderPool::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return jobs_.size();
}

void EncoderPool::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace wm::server
