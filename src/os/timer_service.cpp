#include "os/timer_service.hpp"

#include <pthread.h>

namespace ferry {

timer_service::timer_service() : thread_([this] { run(); }) {}

timer_service::~timer_service() { stop(); }

timer_service::token timer_service::arm(std::chrono::milliseconds after,
                                        std::function<void()> fire) {
  const auto due = std::chrono::steady_clock::now() + after;
  std::lock_guard lock(mutex_);
  if (stopping_) return 0;
  const token t = queue_.arm(due, std::move(fire));
  // Only a deadline before the thread's next wake-up needs it woken. It never sleeps longer
  // than `max_sleep`, so the deadlines of rooms (seconds away) are armed without a wake-up each.
  if (due < wake_at_) changed_.notify_one();
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
  deadline_queue<entry> dropped;  // destroyed after the lock is released
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    std::swap(dropped, queue_);
  }
  changed_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void timer_service::run() {
  pthread_setname_np(pthread_self(), "ferry.timers");
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    wake_at_ = std::min(queue_.next_due().value_or(now + max_sleep), now + max_sleep);
    if (wake_at_ > now && changed_.wait_until(lock, wake_at_) == std::cv_status::no_timeout)
      continue;
    // Awake: what `arm` adds meanwhile is seen before the next wait.
    wake_at_ = std::chrono::steady_clock::time_point::min();
    auto due = queue_.take_due(std::chrono::steady_clock::now());
    lock.unlock();
    for (auto& fire : due) fire();
    due.clear();  // what the callbacks captured goes outside the lock too
    lock.lock();
  }
}

}  // namespace ferry
