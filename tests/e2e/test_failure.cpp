// Failure semantics on loopback, with real daemons: cancel with drain and immediate reuse of the
// pages, hung (SIGSTOPped) and killed peers in both directions, restarts, per-state deadlines
// and the cluster secret. Every scenario asserts the terminal states and reasons on both sides,
// that nothing stays held, and the bytes of the rooms that must succeed. Detection bounds are
// asserted loosely (they are liveness properties, not benchmarks).

#include <fmt/format.h>
#include <sys/stat.h>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

using clock_type = std::chrono::steady_clock;

/// A room big and fragmented enough that many writes are still in flight when its first write
/// has landed: 2048 single-page runs per buffer, sent in two chunks (with the default
/// fabric.pack_threshold_bytes, packed through staging on both sides: a few large writes).
room_spec big_room(uint64_t id) {
  room_spec r;
  r.room = id;
  for (uint32_t i = 0; i < 2048; ++i) {
    r.src_pages.push_back(2 * i);
    r.dst_pages.push_back(4095 - 2 * i);
  }
  r.chunks = {1024, 1024};
  r.src_slot = 1, r.dst_slot = 5;
  r.src_row = 2, r.dst_row = 7;
  return r;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Three daemons on loopback: two prefills and one decode (a second prefill to serve the room
/// that reuses the pages while the first is hung or dead).
struct trio {
  temp_dir dir;
  shape s;
  daemon_proc p1, p2, d;
  std::unique_ptr<client::client> c1, c2, cd;
  explicit trio(shape sh)
      : s(sh),
        p1(launch_only, dir, "prefill-1", "prefill", s),
        p2(launch_only, dir, "prefill-2", "prefill", s),
        d(launch_only, dir, "decode-0", "decode", s) {
    await_ready(p1, p2, d);
    c1 = p1.connect();
    c2 = p2.connect();
    cd = d.connect();
  }
};

shape fast_liveness() {
  shape s;
  s.heartbeat_ms = 200;
  s.heartbeat_misses = 3;
  return s;
}

}  // namespace

TEST_CASE(
    "a room cancelled mid-transfer drains, and its pages reused at once get only the new bytes",
    "[e2e][failure]") {
  // One write per run (packing off): thousands of small writes in flight when it is cancelled.
  // The packed path is test_pack.cpp's "a packed room cancelled mid-transfer...".
  shape s;
  s.pack_threshold_bytes = 0;
  pair c(s);
  auto a = big_room(701);
  stage(c, a);
  prepare(c, a);
  send_chunk(*c.p, a, 0);
  wait_status(*c.d, a.room, room_status::transferring);

  SECTION("cancelled by the decode client") { cancel_and_check(*c.d, *c.p, a.room); }
  SECTION("cancelled by the prefill client") {
    cancel_and_check(*c.p, *c.d, a.room);
    // Its remaining chunk is refused with the reason, not queued.
    auto late = c.p->send({a.room, {}, true, a.src_slot, a.src_row});
    CHECK_FALSE(late);
  }
  // Every write of the old room that will ever land has landed before Failed was reported:
  // none arrives afterwards (a late write would be counted as stray).
  CHECK(status_of(*c.d)["stray_writes"] == 0);
  check_no_room_held(*c.d);
  check_no_room_held(*c.p);

  // The very same destination pages, slot and row, at once, for a new room.
  auto b = big_room(702);
  b.src_pages = range(0, 2048);
  run_and_verify(c, b);
  CHECK(status_of(*c.d)["stray_writes"] == 0);
}

TEST_CASE("a room cancelled while waiting for input fails on both sides and holds nothing",
          "[e2e][failure]") {
  pair c;
  auto a = big_room(711);
  stage(c, a);
  prepare(c, a);
  wait_status(*c.d, a.room, room_status::waiting_for_input);
  REQUIRE(c.d->cancel(a.room));
  CHECK(wait_done(*c.d, a.room).status == room_status::failed);
  CHECK(wait_done(*c.p, a.room).status == room_status::failed);
  check_no_room_held(*c.d);
  check_no_room_held(*c.p);
}

TEST_CASE(
    "a prepare that reaches a prefill room after its actor ended is refused, and the decode fails "
    "at once",
    "[e2e][failure]") {
  // Two decode ranks race a room's end: one cancels it, the other's prepare still waits in the
  // prefill room's mailbox as its actor ends. The failpoint ends the room just before its actor
  // takes the prepare. The prefill's Scheduler answers that prepare: the decode fails at once
  // with the prefill's reason, instead of waiting for a drain report no one sends and fencing
  // its link after drain_ms (failing every other room on it); both sides hold nothing, and the
  // next room succeeds byte-exact.
  shape s;
  s.drain_ms = 60000;  // without the answer the decode would wait this long
  shape ps = s;
  ps.env = {{"FERRY_FAILPOINTS", "sender_ends_before_prepare=1"}};
  pair c(ps, s);
  room_spec r;
  r.room = 721;
  r.src_pages = range(0, 8);
  r.dst_pages = range(100, 8);
  stage(c, r);
  prepare(c, r);
  auto de = wait_done(*c.d, r.room);
  INFO(de.reason);
  CHECK(de.status == room_status::failed);
  CHECK(de.code == errc::cancelled);
  CHECK_THAT(de.reason,
             Catch::StartsWith("prefill ") &&
                 Catch::EndsWith(" refused the prepare: room 721 failed on the prefill before it "
                                 "took this decode's prepare: ended by the failpoint "
                                 "sender_ends_before_prepare"));
  auto pe = wait_done(*c.p, r.room);
  CHECK(pe.status == room_status::failed);
  CHECK(pe.code == errc::cancelled);
  CHECK(pe.reason == "ended by the failpoint sender_ends_before_prepare");
  check_no_room_held(*c.d);
  check_no_room_held(*c.p);
  room_spec next;
  next.room = 722;
  next.src_pages = range(0, 8);
  next.dst_pages = range(100, 8);
  run_and_verify(c, next);
  CHECK(status_of(*c.d)["stray_writes"] == 0);
}

TEST_CASE("each non-terminal state has its own deadline, and the other side is told",
          "[e2e][failure]") {
  SECTION("decode WaitingForInput: the prefill never sends") {
    // Only the decode's bound is short: the prefill enters WaitingForInput a little earlier
    // (at the prepare), so with the same bound it could time out first.
    shape s, d;
    d.waiting_for_input_ms = 300;
    pair c(s, d);
    auto a = big_room(721);
    stage(c, a);
    prepare(c, a);
    auto de = wait_done(*c.d, a.room);
    CHECK(de.status == room_status::failed);
    CHECK(de.reason ==
          "timed out in WaitingForInput after 300 ms (waiting for the first write: 0 landed, none "
          "announced)");
    auto pe = wait_done(*c.p, a.room);
    CHECK(pe.status == room_status::failed);
    CHECK_THAT(pe.reason, Catch::Contains("timed out in WaitingForInput after 300 ms"));
    check_no_room_held(*c.d);
  }
  SECTION("Transferring: the last chunk never comes") {
    shape s;
    s.transferring_ms = 500;
    pair c(s);
    auto a = big_room(722);
    stage(c, a);
    prepare(c, a);
    send_chunk(*c.p, a, 0);
    auto pe = wait_done(*c.p, a.room);
    CHECK(pe.status == room_status::failed);
    CHECK(pe.reason ==
          "timed out in Transferring after 500 ms (waiting for the last chunk and the decode's "
          "commit)");
    auto de = wait_done(*c.d, a.room);
    CHECK(de.status == room_status::failed);
    CHECK_THAT(de.reason, Catch::Contains("timed out in Transferring"));
    CHECK(status_of(*c.d)["stray_writes"] == 0);
    check_no_room_held(*c.d);
    check_no_room_held(*c.p);
  }
}

TEST_CASE("a hung prefill is declared dead within the heartbeat bound and fenced",
          "[e2e][failure]") {
  trio t(fast_liveness());
  auto a = big_room(731);
  stage(*t.c1, *t.cd, a);
  prepare(*t.cd, t.p1.control(), a);
  send_chunk(*t.c1, a, 0);
  wait_status(*t.cd, a.room, room_status::transferring);

  t.p1.signal(SIGSTOP);
  const auto t0 = clock_type::now();
  auto de = wait_done(*t.cd, a.room);
  const double detected = seconds_since(t0);
  CHECK(de.status == room_status::failed);
  CHECK_THAT(de.reason, Catch::Contains("unresponsive: nothing heard for"));
  // 3 x 200 ms of silence, one more tick, then the fence: well under the 2 s drain bound.
  CHECK(detected < 5.0);
  check_no_room_held(*t.cd);

  // New rooms naming the hung prefill fail at once instead of waiting for a handshake timeout.
  auto c = big_room(733);
  c.dst_pages = range(0, 8);
  c.chunks = {8};
  prepare(*t.cd, t.p1.control(), c);
  const auto t1 = clock_type::now();
  auto ce = wait_done(*t.cd, c.room);
  CHECK(seconds_since(t1) < 1.0);
  CHECK(ce.status == room_status::failed);
  CHECK_THAT(ce.reason, Catch::Contains("unresponsive") && Catch::Contains("not retried"));

  // Another prefill reuses the same pages, slot and row at once.
  auto b = big_room(732);
  run_and_verify(*t.c2, *t.cd, t.p2.control(), b);

  // The hung prefill resumes with writes of the old room still queued: the fabric rejects them
  // (its registrations at the decode are closed), so the new room keeps exactly its bytes.
  t.p1.signal(SIGCONT);
  auto pe = wait_done(*t.c1, a.room);
  CHECK(pe.status == room_status::failed);
  check_exact_after_fence(*t.cd, b);
  check_no_room_held(*t.c1);
}

TEST_CASE("a prefill resumed after a stop longer than its heartbeat bound reads its peer first",
          "[e2e][failure]") {
  // The prefill judges 300 ms of silence; the decode beats as often but judges 10 s. Stopped
  // for longer than its own bound, the prefill finds the decode's heartbeats waiting when it
  // resumes: its late tick must not declare the decode dead for its own pause
  // (core/peer_handshake.hpp, heartbeat_tick).
  shape ps;
  ps.heartbeat_ms = 100;
  ps.heartbeat_misses = 3;
  shape ds = ps;
  ds.heartbeat_misses = 100;
  pair c(ps, ds);
  room_spec a;
  a.room = 1;
  a.src_pages = range(0, 8);
  a.dst_pages = range(100, 8);
  run_and_verify(c, a);  // the peers are connected

  c.prefill.signal(SIGSTOP);
  std::this_thread::sleep_for(1500ms);  // the stop itself (5 x the prefill's bound), not a wait
  c.prefill.signal(SIGCONT);
  REQUIRE(log_shows(c.prefill, "this daemon did not run for"));

  room_spec b = a;
  b.room = 2;
  run_and_verify(c, b);  // over the same connection
  CHECK(c.prefill.log_text().find("unresponsive") == std::string::npos);
  CHECK(c.decode.log_text().find("unresponsive") == std::string::npos);
  CHECK(c.decode.log_text().find("connection closed") == std::string::npos);
}

TEST_CASE("a killed prefill fails the decode's rooms at once, and restarted it serves new rooms",
          "[e2e][failure]") {
  trio t(fast_liveness());
  auto a = big_room(741);
  stage(*t.c1, *t.cd, a);
  prepare(*t.cd, t.p1.control(), a);
  send_chunk(*t.c1, a, 0);
  wait_status(*t.cd, a.room, room_status::transferring);
  // An unrelated room from the other prefill, in flight at the same time.
  auto other = big_room(742);
  for (uint32_t i = 0; i < 2048; ++i) other.dst_pages[i] = 2 * i;  // disjoint from room 741's
  other.dst_slot = 6, other.dst_row = 8;
  stage(*t.c2, *t.cd, other);
  prepare(*t.cd, t.p2.control(), other);
  send_chunk(*t.c2, other, 0);

  t.p1.signal(SIGKILL);
  const auto t0 = clock_type::now();
  auto de = wait_done(*t.cd, a.room);
  CHECK(seconds_since(t0) < 5.0);
  CHECK(de.status == room_status::failed);
  CHECK_THAT(de.reason, Catch::Contains("lost"));

  // The other room is unaffected.
  send_chunk(*t.c2, other, 1);
  auto oe = wait_done(*t.cd, other.room);
  INFO(oe.reason);
  CHECK(oe.status == room_status::success);
  CHECK(client::verify_room(*t.cd, other.room, other.dst_pages, other.dst_slot, other.dst_row)
            .message == "");
  check_no_room_held(*t.cd);

  // Same address, new instance: it handshakes again and serves the reused pages.
  t.p1.restart();
  t.c1 = t.p1.connect();
  auto b = big_room(743);
  run_and_verify(*t.c1, *t.cd, t.p1.control(), b);
  const auto peers = info_of(*t.cd, proto::info_topic::peers);
  INFO(peers.dump());
  CHECK(std::any_of(peers.begin(), peers.end(), [](const json& p) {
    return p["node"] == "prefill-1" && p["state"] == "connected";
  }));
}

TEST_CASE("a dead or hung decode fails the prefill's rooms for it, not the others",
          "[e2e][failure]") {
  shape s = fast_liveness();
  temp_dir dir;
  daemon_proc p(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc d1(launch_only, dir, "decode-1", "decode", s);
  daemon_proc d2(launch_only, dir, "decode-2", "decode", s);
  await_ready(p, d1, d2);
  auto cp = p.connect();
  auto c1 = d1.connect();
  auto c2 = d2.connect();
  auto a = big_room(751);
  auto b = big_room(752);
  for (uint32_t i = 0; i < 2048; ++i) b.src_pages[i] = 2 * i + 1;  // disjoint from a's sources
  stage(*cp, *c1, a);
  stage(*cp, *c2, b);
  prepare(*c1, p.control(), a);
  prepare(*c2, p.control(), b);
  send_chunk(*cp, a, 0);
  send_chunk(*cp, b, 0);
  wait_status(*cp, a.room, room_status::transferring);

  std::string expect;
  // A decode that exits closes its end of the fabric connection too: a write of the room that is
  // in flight then (the packed room's writes are few and large) may fail before the control
  // connection's loss is seen. Either names that decode.
  bool or_write_error = false;
  SECTION("killed") {
    d1.signal(SIGKILL);
    expect = "lost";
    or_write_error = true;
  }
  SECTION("hung") {
    d1.signal(SIGSTOP);
    expect = "unresponsive";
  }
  SECTION("stopped (SIGTERM) while the prefill writes into it") {
    // It must exit cleanly although the prefill may still be writing into its endpoint.
    CHECK(d1.stop() == 0);
    expect = "lost";
    or_write_error = true;
  }
  const auto t0 = clock_type::now();
  auto pe = wait_done(*cp, a.room);
  CHECK(seconds_since(t0) < 8.0);  // detection, then at most the 2 s drain bound
  CHECK(pe.status == room_status::failed);
  if (or_write_error)
    CHECK_THAT(pe.reason,
               Catch::Contains(expect) || Catch::StartsWith("write to decode decode-1/"));
  else
    CHECK_THAT(pe.reason, Catch::Contains(expect));

  send_chunk(*cp, b, 1);
  auto be = wait_done(*c2, b.room);
  INFO(be.reason);
  CHECK(be.status == room_status::success);
  CHECK(wait_done(*cp, b.room).status == room_status::success);
  CHECK(client::verify_room(*c2, b.room, b.dst_pages, b.dst_slot, b.dst_row).message == "");
  check_no_room_held(*cp);
}

TEST_CASE("a daemon stopped while it connects to a peer exits cleanly", "[e2e][failure]") {
  // SIGTERM while a room's peer connection is still being set up. With CAF's middleman actor
  // on its own thread, the actor system's teardown waited forever in about a third of these
  // stops (docs/architecture.md, Shutdown); stop() reports -1 when it had to SIGKILL after 15 s.
  temp_dir dir;
  shape s;
  daemon_proc p(dir, "prefill-0", "prefill", s);
  for (uint32_t i = 0; i < 10; ++i) {
    daemon_proc d(dir, fmt::format("decode-{}", i), "decode", s);
    auto cd = d.connect();
    room_spec r;
    r.room = 760 + i;
    r.dst_pages = range(0, 8);
    prepare(*cd, p.control(), r);
    INFO("stop " << i);
    REQUIRE(d.stop() == 0);
  }
  // The prefill saw ten peers come and go; it still serves a new decode byte-exact, and by
  // the end of that room it holds nothing of the ten.
  auto cp = p.connect();
  daemon_proc d(dir, "decode-last", "decode", s);
  auto cd = d.connect();
  run_and_verify(*cp, *cd, p.control(), big_room(770));
  check_no_room_held(*cp);
}

TEST_CASE("peers prove the cluster secret at handshake", "[e2e][failure][security]") {
  temp_dir secrets;
  const auto good = write_secret(secrets, "good", "correct horse battery staple");
  const auto other = write_secret(secrets, "other", "a different secret of the cluster");
  shape ps, ds;
  std::string expect;
  SECTION("same secret: the room succeeds") { ps.secret_file = ds.secret_file = good; }
  SECTION("different secrets") {
    ps.secret_file = good;
    ds.secret_file = other;
    expect = "failed the cluster-secret challenge (different secrets?)";
  }
  SECTION("only the prefill has one") {
    ps.secret_file = good;
    expect =
        "this daemon requires peers to prove the cluster secret, and the peer offered no "
        "challenge";
  }
  SECTION("only the decode has one") {
    ds.secret_file = good;
    expect = "the peer requires a cluster secret but this daemon has none";
  }
  temp_dir dir;
  daemon_proc p(launch_only, dir, "prefill-0", "prefill", ps);
  daemon_proc d(launch_only, dir, "decode-0", "decode", ds);
  await_ready(p, d);
  auto cp = p.connect();
  auto cd = d.connect();
  room_spec r;
  r.room = 761;
  r.src_pages = range(0, 8);
  r.dst_pages = range(8, 8);
  r.chunks = {8};
  if (expect.empty()) {
    run_and_verify(*cp, *cd, p.control(), r);
  } else {
    stage(*cp, *cd, r);
    prepare(*cd, p.control(), r);
    auto de = wait_done(*cd, r.room);
    CHECK(de.status == room_status::failed);
    CHECK_THAT(de.reason, Catch::Contains(expect));
    check_no_room_held(*cd);
  }
}

TEST_CASE("a client's rooms are cancelled when it disconnects, unless it said otherwise",
          "[e2e][failure]") {
  pair c;
  auto a = big_room(771);
  stage(c, a);
  SECTION("a library client (cancel_on_disconnect, the default)") {
    {
      auto owner = c.decode.connect();
      prepare(*owner, c.prefill.control(), a);
      send_chunk(*c.p, a, 0);
      wait_status(*c.d, a.room, room_status::transferring);
      REQUIRE(c.d->subscribe(a.room));
    }  // the engine process "crashes": its connection closes
    auto de = c.d->wait_terminal(a.room, 60s);
    REQUIRE(de);
    CHECK(de.value.status == room_status::failed);
    CHECK(de.value.reason == "cancelled: its client disconnected");
    auto pe = wait_done(*c.p, a.room);
    CHECK(pe.status == room_status::failed);
    CHECK_THAT(pe.reason, Catch::Contains("cancelled: its client disconnected"));
    CHECK(status_of(*c.d)["stray_writes"] == 0);
    check_no_room_held(*c.d);
    check_no_room_held(*c.p);
  }
  SECTION("a ferryctl-style client (each command its own connection)") {
    {
      auto cli = client::client::connect(c.decode.socket(), "cli", 10s, false);
      REQUIRE(cli);
      prepare(*cli.value, c.prefill.control(), a);
    }
    send_chunk(*c.p, a, 0);
    send_chunk(*c.p, a, 1);
    auto de = wait_done(*c.d, a.room);
    INFO(de.reason);
    CHECK(de.status == room_status::success);
    CHECK(client::verify_room(*c.d, a.room, a.dst_pages, a.dst_slot, a.dst_row).message == "");
  }
}
