// Peers named by a DNS name (os/name_resolver.hpp): the lookup runs on the resolver's
// thread, never on the caller's (an actor worker) or the gate's, and the dial then goes through
// the preamble like any other; a gate that stops answers every lookup still pending, once.
// Only `localhost` is looked up (from /etc/hosts): no test asks a DNS server.

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "harness.hpp"
#include "os/name_resolver.hpp"
#include "transport/channels/peer_gate.hpp"

using namespace ferry;
using namespace ferry::test;

TEST_CASE("a peer named by a DNS name is resolved off the caller's thread, then dialed",
          "[e2e][peer_names]") {
  peer_gate server("server", "", {});
  std::promise<std::string> admitted, said;
  REQUIRE(server.listen("127.0.0.1", 0, [&](const peer_link_ptr& link) {
    admitted.set_value(link->peer_node());
    link->bind([&](peer_wire::message&& m) { said.set_value(std::get<peer_hello>(m).role); },
               nullptr, true);
  }) == "");
  server.start();
  peer_gate client("client", "", {});
  client.start();
  std::promise<std::pair<peer_link_ptr, std::string>> dialed;
  std::thread::id answered_on;
  client.dial("localhost", server.port(),
              [&](const peer_link_ptr& link, const std::string& error, bool) {
                answered_on = std::this_thread::get_id();
                dialed.set_value({link, error});
              });
  auto f = dialed.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  auto [link, error] = f.get();
  INFO(error);
  REQUIRE(link);
  CHECK(answered_on != std::this_thread::get_id());
  auto a = admitted.get_future();
  REQUIRE(a.wait_for(20s) == std::future_status::ready);
  CHECK(a.get() == "client");
  // The link carries a message, checked and decoded on the server's gate thread.
  link->bind([](peer_wire::message&&) {}, nullptr);
  peer_hello h;
  h.role = "hello over the channel";
  REQUIRE(link->send(h));
  auto s = said.get_future();
  REQUIRE(s.wait_for(20s) == std::future_status::ready);
  CHECK(s.get() == "hello over the channel");
  client.stop();
  server.stop();
}

TEST_CASE("a resolver that stops answers every lookup still pending, exactly once",
          "[e2e][peer_names]") {
  std::mutex m;
  std::vector<std::string> answers;
  {
    name_resolver r;
    for (int i = 0; i < 50; ++i)
      r.resolve("localhost", 7401, [&](const name_resolver::address* a, const std::string& e) {
        std::lock_guard g(m);
        answers.push_back(a ? "resolved" : e);
      });
    r.stop();
    // Once stopped, a lookup is answered at once, on the caller's thread.
    r.resolve("localhost", 7401, [&](const name_resolver::address* a, const std::string& e) {
      std::lock_guard g(m);
      answers.push_back(a ? "resolved late" : "late: " + e);
    });
  }
  std::lock_guard g(m);
  REQUIRE(answers.size() == 51);
  for (size_t i = 0; i < 50; ++i)
    CHECK((answers[i] == "resolved" || answers[i] == "the daemon is stopping"));
  CHECK(answers[50] == "late: the daemon is stopping");
}

TEST_CASE(
    "a name whose lookup never answers holds one resolver thread, not the names behind it, "
    "and a stop answers it at once",
    "[e2e][peer_names]") {
  // A lookup the test controls: "stuck" blocks until released, any other name resolves.
  std::mutex m;
  std::condition_variable cv;
  bool release = false, stuck_entered = false, stuck_left = false;
  auto lookup = [&](const std::string& host, uint16_t, name_resolver::address& out, std::string&) {
    if (host == "stuck") {
      std::unique_lock lk(m);
      stuck_entered = true;
      cv.notify_all();
      cv.wait(lk, [&] { return release; });
      stuck_left = true;  // the last the lookup touches of this test's state
      cv.notify_all();
    }
    out.len = sizeof(sockaddr_in);
    return true;
  };
  std::vector<std::string> answers;  // guarded by m
  auto record = [&](const std::string& name) {
    return [&, name](const name_resolver::address* a, const std::string& e) {
      std::lock_guard g(m);
      answers.push_back(name + ": " + (a ? "resolved" : e));
      cv.notify_all();
    };
  };
  auto r = std::make_unique<name_resolver>(lookup);
  r->resolve("stuck", 1, record("stuck"));
  {
    std::unique_lock lk(m);
    REQUIRE(cv.wait_for(lk, 20s, [&] { return stuck_entered; }));
  }
  r->resolve("fast", 1, record("fast"));
  {
    std::unique_lock lk(m);
    REQUIRE(cv.wait_for(lk, 20s, [&] { return !answers.empty(); }));
    CHECK(answers == std::vector<std::string>{"fast: resolved"});
  }
  r->stop();  // returns while "stuck" is still inside its lookup
  {
    std::lock_guard g(m);
    CHECK(answers == std::vector<std::string>{"fast: resolved", "stuck: the daemon is stopping"});
  }
  r.reset();
  {
    std::lock_guard g(m);
    release = true;
    cv.notify_all();
  }
  // The detached thread finishes its lookup and must answer nothing more (it finds the resolver
  // stopped). It cannot be joined: wait until it is past this test's state, then check.
  std::unique_lock lk(m);
  REQUIRE(cv.wait_for(lk, 20s, [&] { return stuck_left; }));
  CHECK(answers.size() == 2);
}
