#pragma once
// Reach a ferryd's Scheduler from a test process the way a ferryd does: Ferry's peer preamble
// through a peer_gate of the test's own, then BASP on the admitted socket (the daemon's CAF
// accepts nothing else, so the middleman's remote_actor() cannot be used).

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <chrono>
#include <future>
#include <string>

#include "actors/peer_gate.hpp"
#include "harness.hpp"

namespace ferry::test {

/// The Scheduler published at `control` ("host:port"), or the reason it could not be reached
/// in `error`. `node` is the name the test gives in the preamble.
inline caf::actor reach_scheduler(caf::actor_system& sys, const std::string& control,
                                  const std::string& node, const std::string& secret,
                                  std::string& error) {
  const auto colon = control.rfind(':');
  const auto port = static_cast<uint16_t>(std::stoi(control.substr(colon + 1)));
  peer_gate gate(node, secret, {});
  gate.start();
  std::promise<std::pair<int, std::string>> dialed;
  auto result = dialed.get_future();
  gate.dial(control.substr(0, colon), port,
            [&dialed](int fd, const std::string&, const std::string& e, bool) {
              dialed.set_value({fd, e});
            });
  if (result.wait_for(20s) != std::future_status::ready) {
    gate.stop();  // fails the dial, which fulfils the promise before `dialed` goes away
    error = "the preamble did not complete within 20 s";
    return {};
  }
  gate.stop();
  auto [fd, e] = result.get();
  if (fd < 0) {
    error = e;
    return {};
  }
  auto& mm = sys.middleman();
  auto basp = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  caf::scoped_actor self{sys};
  caf::actor remote;
  self->request(basp, 20s, caf::connect_atom::value, mm.backend().new_scribe(fd), port)
      .receive(
          [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
            remote = caf::actor_cast<caf::actor>(ptr);
            if (!remote) error = "no actor is published at " + control;
          },
          [&](caf::error& err) { error = sys.render(err); });
  return remote;
}

}  // namespace ferry::test
