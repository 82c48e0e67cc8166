// Discovery (docs/protocol.md, discover; docs/architecture.md): a decode engine names one
// address of a prefill instance and ferryd finds every rank of it from that rank's config
// (discovery.instance_ranks), with each rank's TP/PP position, or why it cannot be used; a rank
// that is down is reported, not waited on.

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

TEST_CASE(
    "discover: one address of a TP 2 prefill instance finds both ranks and the one that "
    "is down",
    "[e2e][discovery]") {
  temp_dir dir;
  const uint16_t port0 = free_port(), port1 = free_port(), port_down = free_port();
  const auto at = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
  shape s;
  s.instance_ranks = {at(port0), at(port1), at(port_down)};
  shape r0 = s, r1 = s;
  r0.tp_size = r1.tp_size = 2;
  r1.tp_rank = 1;
  daemon_proc prefill0(launch_only, dir, "prefill-0", "prefill", r0, placement{"", port0});
  daemon_proc prefill1(launch_only, dir, "prefill-1", "prefill", r1, placement{"", port1});
  await_ready(prefill0, prefill1);
  shape ds;
  daemon_proc decode(dir, "decode-0", "decode", ds);
  auto d = decode.connect();

  auto found = d->discover(at(port1));
  INFO(found.message);
  REQUIRE(found);
  const auto& ranks = found.value.ranks;
  REQUIRE(ranks.size() == 3);
  CHECK(ranks[0].address == at(port1));  // the one named comes first
  CHECK(ranks[0].up);
  CHECK(ranks[0].node == "prefill-1");
  CHECK(ranks[0].tp_size == 2);
  CHECK(ranks[0].tp_rank == 1);
  CHECK(ranks[1].address == at(port0));
  CHECK(ranks[1].up);
  CHECK(ranks[1].tp_rank == 0);
  CHECK(ranks[2].address == at(port_down));
  CHECK_FALSE(ranks[2].up);
  CHECK_THAT(ranks[2].reason, Catch::Contains("cannot connect to " + at(port_down)));

  // The ranks that are up are what a prepare names: both accept the room.
  std::vector<std::string> up;
  for (const auto& x : ranks)
    if (x.up) up.push_back(x.address);
  REQUIRE(d->prepare({31, up, range(0, 4), 1, 1}));
  wait_status(*d, 31, room_status::waiting_for_input);
  REQUIRE(d->cancel(31));

  // A daemon that is not there at all: one rank, down, with the reason.
  auto none = d->discover(at(port_down));
  REQUIRE(none);
  REQUIRE(none.value.ranks.size() == 1);
  CHECK_FALSE(none.value.ranks[0].up);
  // Bad input is refused by name.
  auto bad = d->discover("nowhere");
  CHECK_FALSE(bad);
  CHECK(bad.message == "discover: 'nowhere' is not host:port (a port in 1..65535)");
}

TEST_CASE(
    "discover: an instance with attention DP 2 reports each rank's group, and a prepare names "
    "one group's ranks",
    "[e2e][discovery]") {
  temp_dir dir;
  const uint16_t port0 = free_port(), port1 = free_port();
  const auto at = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
  shape g0;
  g0.instance_ranks = {at(port0), at(port1)};
  g0.dp_size = 2;
  shape g1 = g0;
  g1.dp_rank = 1;
  daemon_proc prefill0(launch_only, dir, "prefill-dp0", "prefill", g0, placement{"", port0});
  daemon_proc prefill1(launch_only, dir, "prefill-dp1", "prefill", g1, placement{"", port1});
  daemon_proc decode(launch_only, dir, "decode-0", "decode", shape{});
  await_ready(prefill0, prefill1, decode);
  auto d = decode.connect();

  auto found = d->discover(at(port0));
  INFO(found.message);
  REQUIRE(found);
  const auto& ranks = found.value.ranks;
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[0].up);
  CHECK(ranks[0].dp_size == 2);
  CHECK(ranks[0].dp_rank == 0);
  CHECK(ranks[1].up);
  CHECK(ranks[1].node == "prefill-dp1");
  CHECK(ranks[1].dp_size == 2);
  CHECK(ranks[1].dp_rank == 1);

  // Both groups hold TP rank 0: naming both is refused by name, not resolved by guess.
  REQUIRE(d->prepare({41, {at(port0), at(port1)}, range(0, 4), 1, 1}));
  const auto failed = wait_for_status_or_end(*d, 41, room_status::success);
  REQUIRE(failed.status == room_status::failed);
  CHECK(failed.code == errc::peer_incompatible);
  CHECK_THAT(failed.reason,
             Catch::Contains("different attention DP groups") && Catch::Contains("DP rank 1 of 2"));
  // One group's ranks: the room is prepared.
  REQUIRE(d->prepare({42, {at(port1)}, range(0, 4), 1, 1}));
  wait_status(*d, 42, room_status::waiting_for_input);
  REQUIRE(d->cancel(42));
}
