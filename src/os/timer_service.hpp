#pragma once
/// The daemon's deadlines: one thread sleeps until the earliest one (or `max_sleep`, whichever
/// comes first) and then runs its callback (the actors' send their deadline message:
/// actors/room_lifecycle_glue.hpp `send_after`). Arming a deadline wakes it only when the deadline
/// comes before its next wake-up, so a room's deadlines, seconds away, cost no wake-up.
/// Unlike CAF 0.17's `delayed_send`, a deadline can be cancelled, and a cancelled one is gone at
/// once, so a room holds at most one deadline per kind (core/room_lifecycle.hpp) instead of
/// leaving one pending timer behind for every status it passed through.
///
/// Thread-safe. `arm` and `cancel` take a short lock and never wait for anything else. A callback
/// runs on the timer thread, outside the lock, and must neither block nor throw; it may arm or
/// cancel deadlines (it and what it captured are destroyed outside the lock too, except by
/// `cancel`, which must not be called from a captured object's destructor).

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "core/deadline_queue.hpp"

namespace ferry {

class timer_service {
 public:
  using token = uint64_t;  ///< 0: none

  timer_service();
  ~timer_service();
  timer_service(const timer_service&) = delete;
  timer_service& operator=(const timer_service&) = delete;

  /// Run `fire` after `after`, unless cancelled first.
  token arm(std::chrono::milliseconds after, std::function<void()> fire);
  /// Cancel a deadline; false when it fired already, was cancelled, or `t` is 0.
  bool cancel(token t);
  /// Deadlines armed and not yet fired or cancelled.
  size_t pending() const;
  /// Drop every deadline and end the thread (before the actor system goes away; later `arm`s
  /// are dropped).
  void stop();

 private:
  using entry = std::function<void()>;
  void run();

  /// The longest the thread sleeps: deadlines further away than this never wake it early.
  static constexpr std::chrono::milliseconds max_sleep{250};

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  /// When the thread wakes next (guarded by mutex_); min() while it is awake.
  std::chrono::steady_clock::time_point wake_at_ = std::chrono::steady_clock::time_point::min();
  deadline_queue<entry> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry
