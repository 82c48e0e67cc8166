// A C++ client made with a reconnect_policy (clients/cpp/ferry/client.hpp) whose ferryd is
// killed with -9 and started again on the same config: the request in flight fails with 302,
// the subscribed room is reported Failed with 302 and a reason naming the socket, a call made
// while the daemon is down fails at once with 300, and after the restart the same client
// object connects again by itself and moves a room byte for byte, once with daemon pools
// (mapped anew) and once with `memory: client` pools (the memfds registered again by the
// client). A client that gives up after max_attempts stays given up; one whose ferryd drains is
// told (407), its accepted room finishes, and it reconnects to the restarted daemon.

#include <dirent.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <fstream>
#include <thread>

#include "ferry/engine_memory.hpp"
#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;
using namespace std::chrono_literals;

namespace {

using notice = client::connection_notice;

/// A client of `d` that reconnects by itself with `policy`; its notices go to `notes`.
std::unique_ptr<client::client> reconnecting(const daemon_proc& d,
                                             const client::reconnect_policy& policy,
                                             std::vector<notice>& notes, bool map = true) {
  client::connect_options o;
  o.name = "reconnecting-engine";
  o.reconnect = policy;
  auto c = client::client::connect(d.socket(), o);
  INFO(c.message);
  REQUIRE(c);
  c.value->on_connection([&notes](const notice& n) { notes.push_back(n); });
  if (map) REQUIRE(c.value->map_pools());
  return std::move(c.value);
}

/// Until every thread of `pid` is stopped (after SIGSTOP; bounded).
void wait_stopped(pid_t pid) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (int i = 0; i < 2000; ++i) {
    bool all = true;
    DIR* dir = opendir(task.c_str());
    REQUIRE(dir);
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(task + "/" + e->d_name + "/stat");
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const auto close_paren = stat.rfind(')');
      if (close_paren == std::string::npos || close_paren + 2 >= stat.size()) continue;
      const char state = stat[close_paren + 2];
      if (state != 'T' && state != 't') all = false;
    }
    closedir(dir);
    if (all) return;
    std::this_thread::sleep_for(5ms);
  }
  FAIL("ferryd " << pid << " did not stop");
}

/// Until bytes written to unix socket `fd` wait unread in its peer (bounded).
void wait_unread(int fd) {
  for (int i = 0; i < 2000; ++i) {
    int queued = 0;
    REQUIRE(ioctl(fd, SIOCOUTQ, &queued) == 0);
    if (queued > 0) return;
    std::this_thread::sleep_for(5ms);
  }
  FAIL("the request was never sent");
}

/// Run `r` from `p` to `d` and check every destination byte; a first attempt that fails
/// because the decode still held its connection to the killed prefill is retried once, as an
/// engine would.
void move_room(client::client& p, client::client& d, const std::string& prefill,
               const room_spec& r) {
  stage(p, d, r);
  for (int attempt = 0;; ++attempt) {
    REQUIRE(attempt < 2);
    prepare(d, prefill, r);
    send_rest(p, r, 0);
    auto de = wait_done(d, r.room);
    auto pe = wait_done(p, r.room);
    if (de.status == room_status::success && pe.status == room_status::success) break;
    INFO(de.reason << " / " << pe.reason);
    REQUIRE(attempt == 0);
  }
  CHECK(client::verify_room(d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

room_spec room(uint64_t id, uint32_t src_first, uint32_t dst_first, uint32_t slot) {
  room_spec r;
  r.room = id;
  r.src_pages = range(src_first, 16);
  r.dst_pages = range(dst_first, 16);
  r.chunks = {8, 8};
  r.src_slot = r.dst_slot = slot;
  r.src_row = r.dst_row = slot;
  return r;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

TEST_CASE(
    "reconnect: a client of a prefill ferryd with daemon pools survives kill -9 and a restart, "
    "and maps the new pools",
    "[e2e][reconnect]") {
  temp_dir dir;
  shape s;
  s.pages = 512;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  // Every call attempts at once while disconnected: the lazy reconnect, no explicit call.
  client::reconnect_policy policy;
  policy.initial_delay = policy.max_delay = 0ms;
  std::vector<notice> notes;
  auto p = reconnecting(prefill, policy, notes);
  auto d = decode.connect();
  move_room(*p, *d, prefill.control(), room(1, 0, 0, 1));
  const std::string first_instance = p->daemon().instance;
  REQUIRE(p->pool(pool_kind::kv) != nullptr);

  // Room 10 in flight on the prefill (its first chunk sent), subscribed on both sides.
  const auto r = room(10, 32, 64, 2);
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  send_chunk(*p, r, 0);
  REQUIRE(p->subscribe(r.room));
  REQUIRE(d->subscribe(r.room));

  // A poll waits for its reply (sent, unread by the stopped daemon) when ferryd is killed.
  prefill.signal(SIGSTOP);
  wait_stopped(prefill.pid());
  const int sock = p->native_handle();
  result<proto::poll_reply> waiting;
  std::thread asker([&] { waiting = p->poll(r.room); });
  wait_unread(sock);
  prefill.signal(SIGKILL);
  asker.join();
  INFO(waiting.message);
  CHECK(waiting.code == errc::peer_lost);
  // (unread bytes in its socket make the kernel reset the connection rather than end it)
  CHECK((waiting.message == "ferryd closed the connection" ||
         waiting.message == "reading from ferryd failed: Connection reset by peer"));
  CHECK(p->lost());
  CHECK(p->native_handle() == -1);
  CHECK(p->pool(pool_kind::kv) == nullptr);  // the old mapping is not ferryd's memory any more

  // The subscribed room is reported Failed with 302, and why.
  auto ev = p->wait_terminal(r.room, 30s);
  INFO(ev.message);
  REQUIRE(ev);
  CHECK(ev.value.status == room_status::failed);
  CHECK(ev.value.code == errc::peer_lost);
  INFO(ev.value.reason);
  CHECK(starts_with(ev.value.reason, "ferryd at " + prefill.socket() + " went away (" +
                                         waiting.message + ") before the room ended"));
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].what == notice::kind::disconnected);
  CHECK(notes[0].error.code == errc::peer_lost);
  CHECK(notes[0].failed_rooms == std::vector<uint64_t>{r.room});
  CHECK(notes[0].reconnecting);
  CHECK_FALSE(notes[0].drained);
  auto de = d->wait_terminal(r.room, 60s);  // its peer died
  INFO(de.message);
  REQUIRE(de);
  CHECK(de.value.status == room_status::failed);

  // While nothing listens, a call fails at once with 300, naming the socket and the attempt.
  auto down = p->poll(r.room);
  INFO(down.message);
  CHECK(down.code == errc::peer_unreachable);
  CHECK(starts_with(down.message, "not connected to ferryd at " + prefill.socket() +
                                      ": the connection was lost "));
  CHECK(down.message.find("attempt 1 failed: cannot connect to ferryd at '" + prefill.socket()) !=
        std::string::npos);
  CHECK(notes.size() == 1);

  // Back: the next call connects again by itself.
  prefill.restart();
  auto status = p->info(proto::info_topic::status);
  INFO(status.message);
  REQUIRE(status);
  REQUIRE(notes.size() == 2);
  const auto& back = notes[1];
  CHECK(back.what == notice::kind::reconnected);
  CHECK(back.generation == 2);
  CHECK(back.attempts == 2);
  CHECK(back.previous_instance == first_instance);
  CHECK(back.instance == p->daemon().instance);
  CHECK(back.instance != first_instance);
  CHECK(back.registered.empty());
  CHECK(back.not_registered.empty());
  CHECK(back.remapped == std::vector<pool_kind>{pool_kind::kv, pool_kind::state, pool_kind::aux});
  CHECK(back.not_remapped.empty());
  CHECK(p->generation() == 2);
  CHECK_FALSE(p->lost());
  CHECK(p->native_handle() >= 0);
  REQUIRE(p->pool(pool_kind::kv) != nullptr);

  // The same client object moves a room from the new daemon's pools, byte for byte.
  move_room(*p, *d, prefill.control(), room(11, 96, 128, 3));
}

TEST_CASE(
    "reconnect: a decode engine lending memfds survives kill -9 and a restart of its ferryd, "
    "and the client registers the memory again by itself",
    "[e2e][reconnect]") {
  temp_dir dir;
  shape s;
  s.client_memory = true;
  s.pages = 512;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto p = prefill.connect();
  auto pm = client::engine_memory::lend(*p);
  INFO(pm.message);
  REQUIRE(pm);
  client::reconnect_policy policy;
  policy.initial_delay = 50ms;
  policy.max_delay = 500ms;
  std::vector<notice> notes;
  // The engine's memory outlives its client; the client keeps duplicates of the memfds.
  client::engine_memory dm;
  auto d = reconnecting(decode, policy, notes, false);
  {
    auto lent = client::engine_memory::lend(*d);
    INFO(lent.message);
    REQUIRE(lent);
    REQUIRE(lent.value.lent() == 3);
    dm = std::move(lent.value);
  }
  move_room(*p, *d, prefill.control(), room(1, 0, 0, 1));
  const std::string first_instance = d->daemon().instance;

  // Room 20 prepared on the decode (waiting for its input) and subscribed when ferryd dies.
  const auto r = room(20, 32, 64, 2);
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  REQUIRE(d->subscribe(r.room));
  decode.signal(SIGKILL);
  auto ev = d->wait_terminal(r.room, 30s);
  INFO(ev.message);
  REQUIRE(ev);
  CHECK(ev.value.status == room_status::failed);
  CHECK(ev.value.code == errc::peer_lost);
  INFO(ev.value.reason);
  CHECK(starts_with(ev.value.reason, "ferryd at " + decode.socket() + " went away ("));
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].what == notice::kind::disconnected);
  CHECK(notes[0].failed_rooms == std::vector<uint64_t>{r.room});
  // Client memory stays the engine's: still reachable while disconnected.
  CHECK(d->pool(pool_kind::kv) != nullptr);

  // While down: at once, 300.
  auto down = d->prepare({21, {prefill.control()}, r.dst_pages, r.dst_slot, r.dst_row});
  INFO(down.message);
  CHECK(down.code == errc::peer_unreachable);
  CHECK(starts_with(down.message, "not connected to ferryd at " + decode.socket()));

  decode.restart();
  auto back = d->reconnect(30s);
  INFO(back.message);
  REQUIRE(back);
  REQUIRE(notes.size() == 2);
  CHECK(notes[1].what == notice::kind::reconnected);
  CHECK(notes[1].generation == 2);
  CHECK(notes[1].previous_instance == first_instance);
  CHECK(notes[1].instance != first_instance);
  CHECK(notes[1].registered ==
        std::vector<pool_kind>{pool_kind::kv, pool_kind::state, pool_kind::aux});
  CHECK(notes[1].not_registered.empty());
  CHECK(notes[1].remapped.empty());
  const auto doc = info_of(*d, proto::info_topic::pools);
  INFO(doc.dump());
  for (const char* k : {"kv", "state", "aux"}) CHECK(doc[k]["registered"] == true);

  // The same client object: a room lands in the same memfds, byte for byte.
  move_room(*p, *d, prefill.control(), room(22, 96, 128, 3));
}

TEST_CASE(
    "reconnect: a client gives up after max_attempts and says so, and a bad policy is refused",
    "[e2e][reconnect]") {
  {
    client::connect_options o;
    o.reconnect = client::reconnect_policy{};
    o.reconnect->initial_delay = 10s;
    o.reconnect->max_delay = 1s;
    auto c = client::client::connect("/nonexistent/ferryd.sock", o);
    CHECK(c.code == errc::invalid_request);
    CHECK(c.message ==
          "reconnect_policy: needs 0 <= initial_delay <= max_delay, got 10000 ms and 1000 ms");
  }
  temp_dir dir;
  shape s;
  s.pages = 256;
  daemon_proc decode(dir, "decode-0", "decode", s);
  client::reconnect_policy policy;
  policy.initial_delay = policy.max_delay = 0ms;
  policy.max_attempts = 2;
  std::vector<notice> notes;
  auto d = reconnecting(decode, policy, notes);
  auto plain = decode.connect();
  decode.signal(SIGKILL);

  // The call that finds the connection gone fails with 302, then two attempts fail.
  auto first = d->poll(1);
  INFO(first.message);
  CHECK(first.code == errc::peer_lost);
  auto second = d->poll(1);
  INFO(second.message);
  CHECK(second.code == errc::peer_unreachable);
  CHECK_FALSE(d->ended());
  auto third = d->poll(1);
  INFO(third.message);
  CHECK(third.code == errc::peer_unreachable);
  CHECK(starts_with(third.message, "gave up reconnecting to ferryd at " + decode.socket() +
                                       " after 2 attempts: "));
  CHECK(d->ended());
  REQUIRE(notes.size() == 2);
  CHECK(notes[1].what == notice::kind::disconnected);
  CHECK_FALSE(notes[1].reconnecting);
  CHECK(notes[1].error.message == third.message);

  // Given up for good: a restarted daemon does not bring it back.
  decode.restart();
  auto after = d->poll(1);
  CHECK(after.message == third.message);
  CHECK(notes.size() == 2);

  // Without a policy nothing changed: the loss is 302 and stays; reconnect() is refused.
  auto lost = plain->poll(1);
  CHECK(lost.code == errc::peer_lost);
  CHECK(plain->lost());
  CHECK(plain->ended());
  auto refused = plain->reconnect(1s);
  CHECK(refused.code == errc::invalid_request);
  CHECK(plain->poll(1).code == errc::peer_lost);
}

TEST_CASE(
    "reconnect: a client whose decode ferryd drains is told, its accepted room finishes, and it "
    "connects to the restarted daemon",
    "[e2e][reconnect]") {
  temp_dir dir;
  shape s;
  s.pages = 512;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  client::reconnect_policy policy;
  policy.initial_delay = policy.max_delay = 0ms;
  std::vector<notice> notes;
  auto p = prefill.connect();
  auto d = reconnecting(decode, policy, notes);

  // Room 30 accepted before the SIGTERM; a new one is refused with 407 and the client is told.
  const auto r = room(30, 0, 0, 1);
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  REQUIRE(d->subscribe(r.room));
  decode.drain();
  REQUIRE(log_shows(decode, "draining: "));
  auto refused = d->prepare({31, {prefill.control()}, range(100, 4), 2, 2});
  INFO(refused.message);
  CHECK(refused.code == errc::draining);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].what == notice::kind::draining);
  CHECK(starts_with(notes[0].message, "room 31: ferryd is draining"));
  CHECK(d->draining());
  send_rest(*p, r, 0);
  auto done = d->wait_terminal(r.room, 60s);
  INFO(done.message);
  REQUIRE(done);
  CHECK(done.value.status == room_status::success);
  CHECK(client::verify_room(*d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
  CHECK(decode.wait_exit() == 0);  // drained: it exits once room 30 ended

  // The next call finds the connection gone (302), the one after reconnects to the new daemon.
  auto first = d->poll(r.room);
  INFO(first.message);
  CHECK(first.code == errc::peer_lost);
  REQUIRE(notes.size() == 2);
  CHECK(notes[1].what == notice::kind::disconnected);
  CHECK(notes[1].drained);
  CHECK(notes[1].failed_rooms.empty());
  decode.restart();
  auto back = d->info(proto::info_topic::status);
  INFO(back.message);
  REQUIRE(back);
  REQUIRE(notes.size() == 3);
  CHECK(notes[2].what == notice::kind::reconnected);
  CHECK_FALSE(d->draining());
  move_room(*p, *d, prefill.control(), room(32, 32, 64, 2));
}
