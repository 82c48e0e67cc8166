#include "actors/timer_service.hpp"

#include <pthread.h>

namespace ferry {

timer_service::timer_service() : thread_([this] { run(); }) {}

timer_service::~timer_service() { stop(); }

timer_service::token timer_service::arm(std::chrono::milliseconds after, const caf::actor& to,
                                        caf::message msg) {
  const auto due = std::chrono::steady_clock::now() + after;
  std::lock_guard lock(mutex_);
  if (stopping_) return 0;
  const bool earliest = !queue_.next_due() || due < *queue_.next_due();
  const token t = queue_.arm(due, entry{caf::actor_cast<caf::actor_addr>(to), std::move(msg)});
  if (earliest) changed_.notify_one();
  return t;
}

bool timer_service::cancel(token t) {
  if (t == 0) return false;
  std::lock_guard lock(mutex_);
  // No wake-up: the thread finds nothing due at the cancelled deadline's time and sleeps on.
  return queue_.cancel(t);
}

size_t timer_service::pending() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

void timer_service::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    queue_.clear();
  }
  changed_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void timer_service::run() {
  pthread_setname_np(pthread_self(), "ferry.timers");
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const auto next = queue_.next_due();
    if (!next) {
      changed_.wait(lock);
      continue;
    }
    if (changed_.wait_until(lock, *next) == std::cv_status::no_timeout) continue;
    auto due = queue_.take_due(std::chrono::steady_clock::now());
    lock.unlock();
    for (auto& e : due)
      if (auto to = caf::actor_cast<caf::actor>(e.to)) caf::anon_send(to, std::move(e.msg));
    lock.lock();
  }
}

}  // namespace ferry
