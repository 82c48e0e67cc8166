// actors/timer_service.hpp with a real CAF actor system: deadlines arrive in due order, a
// cancelled one never arrives and leaves nothing pending, a deadline of an ended actor is
// dropped, and stop() drops what is left.

#include <caf/all.hpp>

#include "actors/timer_service.hpp"
#include "harness.hpp"

using namespace ferry;
using namespace std::chrono_literals;

TEST_CASE("timer service: due order, cancel, ended targets, stop", "[e2e][timers]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  timer_service timers;
  caf::scoped_actor self{sys};

  const auto late = timers.arm(60ms, self, caf::make_message(std::string("late")));
  const auto early = timers.arm(1ms, self, caf::make_message(std::string("early")));
  const auto gone = timers.arm(5ms, self, caf::make_message(std::string("cancelled")));
  CHECK(late != 0);
  CHECK(early != late);
  CHECK(timers.cancel(gone));
  CHECK_FALSE(timers.cancel(gone));
  CHECK(timers.pending() == 2);

  std::vector<std::string> got;
  for (int i = 0; i < 2; ++i)
    self->receive([&](const std::string& s) { got.push_back(s); },
                  caf::after(std::chrono::seconds(30)) >> [&] { FAIL("no deadline arrived"); });
  CHECK(got == std::vector<std::string>{"early", "late"});
  CHECK(timers.pending() == 0);  // the cancelled one is not waiting to fire
  CHECK_FALSE(timers.cancel(early));

  // An actor that ends before its deadline: the deadline is dropped, nothing is kept alive.
  {
    // With an argument: CAF 0.17 binds a null tuple for a function spawned without one (UBSan).
    auto brief = sys.spawn(
        [](caf::event_based_actor* a, int) -> caf::behavior {
          a->quit();
          return {};
        },
        0);
    timers.arm(1ms, brief, caf::make_message(std::string("to nobody")));
  }
  // A later deadline to us comes after it, so by then the dropped one has been handled.
  timers.arm(10ms, self, caf::make_message(std::string("after")));
  self->receive([&](const std::string& s) { CHECK(s == "after"); },
                caf::after(std::chrono::seconds(30)) >> [&] { FAIL("no deadline arrived"); });
  CHECK(timers.pending() == 0);

  timers.arm(1h, self, caf::make_message(std::string("never")));
  CHECK(timers.pending() == 1);
  timers.stop();
  CHECK(timers.pending() == 0);
  CHECK(timers.arm(1ms, self, caf::make_message(std::string("after stop"))) == 0);
}
