// Peers named by a DNS name (actors/name_resolver.hpp): the lookup runs on the resolver's
// thread, never on the caller's (an actor worker) or the gate's, and the dial then goes through
// the preamble like any other; a gate that stops answers every lookup still pending, once.
// Only `localhost` is looked up (from /etc/hosts): no test asks a DNS server.

#include <future>
#include <mutex>
#include <thread>

#include "actors/name_resolver.hpp"
#include "actors/peer_gate.hpp"
#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

TEST_CASE("a peer named by a DNS name is resolved off the caller's thread, then dialed",
          "[e2e][peer_names]") {
  peer_gate server("server", "", {});
  std::promise<std::string> admitted;
  REQUIRE(server.listen("127.0.0.1", 0, [&](int fd, const std::string& node) {
    ::close(fd);
    admitted.set_value(node);
  }) == "");
  server.start();
  peer_gate client("client", "", {});
  client.start();
  std::promise<std::pair<int, std::string>> dialed;
  std::thread::id answered_on;
  client.dial("localhost", server.port(),
              [&](int fd, const std::string&, const std::string& error, bool) {
                answered_on = std::this_thread::get_id();
                dialed.set_value({fd, error});
              });
  auto f = dialed.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  auto [fd, error] = f.get();
  INFO(error);
  REQUIRE(fd >= 0);
  ::close(fd);
  CHECK(answered_on != std::this_thread::get_id());
  auto a = admitted.get_future();
  REQUIRE(a.wait_for(20s) == std::future_status::ready);
  CHECK(a.get() == "client");
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
