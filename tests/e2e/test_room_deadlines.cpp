// actors/room_lifecycle_glue.hpp `send_after` with a real CAF actor system: a room's deadline
// reaches its actor as a message, and the deadline of an actor that has ended is dropped and
// keeps nothing alive (the timer holds the actor weakly).

#include <caf/all.hpp>

#include "actors/room_lifecycle_glue.hpp"
#include "harness.hpp"

using namespace ferry;
using namespace std::chrono_literals;

TEST_CASE("room deadlines reach their actor, and an ended actor's are dropped", "[e2e][timers]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  timer_service timers;
  caf::scoped_actor self{sys};

  {
    // With an argument: CAF 0.17 binds a null tuple for a function spawned without one (UBSan).
    auto brief = sys.spawn(
        [](caf::event_based_actor* a, int) -> caf::behavior {
          a->quit();
          return {};
        },
        0);
    send_after(timers, 1ms, brief, caf::make_message(std::string("to nobody")));
  }
  // A later deadline to us comes after it, so by then the dropped one has been handled.
  send_after(timers, 10ms, self, caf::make_message(std::string("after")));
  self->receive([&](const std::string& s) { CHECK(s == "after"); },
                caf::after(std::chrono::seconds(30)) >> [&] { FAIL("no deadline arrived"); });
  CHECK(timers.pending() == 0);
  timers.stop();
}
