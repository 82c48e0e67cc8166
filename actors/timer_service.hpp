#pragma once
/// The daemon's deadlines: one thread sleeps until the earliest one (or `max_sleep`, whichever
/// comes first) and then sends its message. Arming a deadline wakes it only when the deadline
/// comes before its next wake-up, so a room's deadlines, seconds away, cost no wake-up.
/// Unlike CAF 0.17's `delayed_send`, a deadline can be cancelled, and a cancelled one is gone at
/// once, so a room holds at most one deadline per kind (core/room_lifecycle.hpp) instead of
/// leaving one pending timer behind for every status it passed through.
///
/// Thread-safe. `arm` and `cancel` take a short lock and never wait for anything else. The
/// target is held weakly: a deadline of an actor that has ended is dropped when it fires.

#include <caf/all.hpp>
#include <chrono>
#include <condition_variable>
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

  /// Send `msg` to `to` (as an anonymous message) after `after`, unless cancelled first.
  token arm(std::chrono::milliseconds after, const caf::actor& to, caf::message msg);
  /// Cancel a deadline; false when it fired already, was cancelled, or `t` is 0.
  bool cancel(token t);
  /// Deadlines armed and not yet fired or cancelled.
  size_t pending() const;
  /// Drop every deadline and end the thread (before the actor system goes away; later `arm`s
  /// are dropped).
  void stop();

 private:
  struct entry {
    caf::actor_addr to;
    caf::message msg;
  };
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
