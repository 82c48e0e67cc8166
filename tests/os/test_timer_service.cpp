// os/timer_service.hpp on its own: deadlines fire in due order, a cancelled one never fires and
// leaves nothing pending, and stop() drops what is left. (That a deadline sent to an actor that
// has ended is dropped is actors/room_lifecycle_glue.hpp's `send_after`:
// tests/e2e/test_room_deadlines.cpp.)

#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "os/timer_service.hpp"

using namespace ferry;
using namespace std::chrono_literals;

namespace {

/// What fired, in order, and a wait for the next of it (bounded).
struct fired {
  std::mutex m;
  std::condition_variable changed;
  std::vector<std::string> names;

  std::function<void()> note(std::string name) {
    return [this, name] {
      std::lock_guard g(m);
      names.push_back(name);
      changed.notify_all();
    };
  }
  bool wait_for_count(size_t n) {
    std::unique_lock l(m);
    return changed.wait_for(l, 30s, [&] { return names.size() >= n; });
  }
};

}  // namespace

TEST_CASE("timer service: due order, cancel and stop", "[unit][timers]") {
  fired f;  // declared first: it outlives the timer thread that may still call into it
  timer_service timers;
  const auto late = timers.arm(60ms, f.note("late"));
  const auto early = timers.arm(1ms, f.note("early"));
  const auto gone = timers.arm(5ms, f.note("cancelled"));
  CHECK(late != 0);
  CHECK(early != late);
  CHECK(timers.cancel(gone));
  CHECK_FALSE(timers.cancel(gone));
  CHECK(timers.pending() == 2);

  REQUIRE(f.wait_for_count(2));
  {
    std::lock_guard g(f.m);
    CHECK(f.names == std::vector<std::string>{"early", "late"});
  }
  CHECK(timers.pending() == 0);  // the cancelled one is not waiting to fire
  CHECK_FALSE(timers.cancel(early));

  timers.arm(1h, f.note("never"));
  CHECK(timers.pending() == 1);
  timers.stop();
  CHECK(timers.pending() == 0);
  CHECK(timers.arm(1ms, f.note("after stop")) == 0);
  std::lock_guard g(f.m);
  CHECK(f.names.size() == 2);
}
