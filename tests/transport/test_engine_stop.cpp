// What an engine does with a call that arrives while a stop drains its posted writes (up to 2 s):
// the call is queued and run on the progress thread during the drain, never on the caller's
// thread under the engine's lock, so a CAF worker calling the engine at shutdown (a Connection
// fencing its peer on its way down) never waits for the drain.

#include <condition_variable>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "transport/engine.hpp"

using namespace ferry::transport;
using namespace ferry::test;

TEST_CASE("an engine call made while a stop drains is queued, not run on the caller's thread",
          "[fabric]") {
  require_provider("tcp");
  std::mutex m;
  std::condition_variable cv;
  bool draining = false, called = false;
  engine_config cfg;
  cfg.provider = "tcp";
  // Holds the drain open (bounded) until the test has made its call.
  cfg.on_drain_start = [&] {
    std::unique_lock lk(m);
    draining = true;
    cv.notify_all();
    cv.wait_for(lk, wait_limit, [&] { return called; });
  };
  auto e = must(engine::open(cfg));
  e->start(nullptr);
  std::thread stopper([&] { e->stop(); });
  {
    std::unique_lock lk(m);
    REQUIRE(cv.wait_for(lk, wait_limit, [&] { return draining; }));
  }
  std::atomic<bool> answered{false};
  std::thread::id answered_on;
  e->insert_peer_async(e->local_address(), [&](ferry::result<peer_handle>) {
    answered_on = std::this_thread::get_id();
    answered = true;
  });
  const bool answered_before_return = answered.load();  // it would have, run under the lock here
  {
    std::lock_guard g(m);
    called = true;
    cv.notify_all();
  }
  stopper.join();
  CHECK_FALSE(answered_before_return);
  CHECK(answered.load());
  CHECK(answered_on != std::this_thread::get_id());
}
