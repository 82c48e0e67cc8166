// Failure paths of two ferryd in this process (actors/daemon.hpp with daemon_options), each over
// the libfabric engine inside the fault-injecting wrapper (transport/fault_engine.hpp): a fault
// armed by the test, not a signal or a second process, takes the room down, and the test checks
// the statuses, codes and reasons on both sides, what landed, and that the daemons serve on.

#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "actors/daemon.hpp"
#include "harness.hpp"
#include "transport/fault_engine.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// A ferryd on a thread of this process, its engine wrapped in a fault_engine the test arms.
class inproc_daemon {
 public:
  inproc_daemon(const temp_dir& dir, const std::string& name, const std::string& role,
                const shape& s)
      : socket_((dir.path / (name + ".sock")).string()) {
    // free_port() may be taken by another connection before the daemon listens: then, and
    // only then, start again on another (as daemon_proc does).
    for (int attempt = 1; attempt <= 3 && !ready_; ++attempt) start(name, role, s);
    REQUIRE(ready_);
  }
  ~inproc_daemon() { stop(); }

  /// Stop it (as SIGTERM would) and wait for run_daemon to return; its exit code.
  int stop() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    faults_ = nullptr;  // the engine went with the daemon
    return rc_;
  }

  transport::fault_engine& faults() {
    REQUIRE(faults_ != nullptr);
    return *faults_;
  }
  std::unique_ptr<client::client> connect() const {
    auto c = client::client::connect(socket_, "test", std::chrono::seconds(10), true);
    INFO(c.message);
    REQUIRE(c);
    REQUIRE(c.value->map_pools());
    return std::move(c.value);
  }
  std::string control() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void start(const std::string& name, const std::string& role, const shape& s) {
    port_ = free_port();
    auto parsed = parse_config_text(make_config(name, role, port_, socket_, s));
    INFO(parsed.message);
    REQUIRE(parsed);
    ferry_config cfg = parsed.value;
    auto valid = validate_config(cfg);
    INFO(valid.message);
    REQUIRE(valid);
    fill_derived(cfg);
    daemon_options o;
    o.make_engine = [this](const transport::engine_config& c) {
      auto opened = transport::engine::open(c);
      if (opened) {
        auto wrapped = std::make_unique<transport::fault_engine>(std::move(opened.value));
        faults_ = wrapped.get();
        opened.value = std::move(wrapped);
      }
      return opened;
    };
    o.on_ready = [this] {
      std::lock_guard lock(m_);
      ready_ = true;
      cv_.notify_all();
    };
    o.wait_for_stop = [this] {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return stop_; });
    };
    exited_ = false;
    thread_ = std::thread([this, cfg, o] {
      const int rc = run_daemon(cfg, o);
      std::lock_guard lock(m_);
      rc_ = rc;
      exited_ = true;
      cv_.notify_all();
    });
    std::unique_lock lock(m_);
    const bool settled = cv_.wait_for(lock, 30s, [&] { return ready_ || exited_; });
    lock.unlock();
    if (!settled) FAIL("in-process ferryd " << name << " neither became ready nor exited");
    if (!ready_) thread_.join();  // it exited (start-up failed): try again or give up
  }

  std::string socket_;
  uint16_t port_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  bool ready_ = false, exited_ = false, stop_ = false;
  int rc_ = -1;
  transport::fault_engine* faults_ = nullptr;  // owned by the daemon's context
  std::thread thread_;
};

/// A small room: 12 pages in one chunk, one state slot and one aux row.
room_spec small_room(uint64_t id) {
  room_spec r;
  r.room = id;
  r.src_pages = range(0, 12);
  r.dst_pages = range(40, 12);
  r.chunks = {12};
  r.src_slot = 1, r.dst_slot = 2;
  r.src_row = 3, r.dst_row = 4;
  return r;
}

shape small_shape() {
  shape s;
  s.pages = 256;
  s.kv_layers = 2;
  s.mamba_layers = 1;
  s.temporal_heads = 2;
  s.aux_rows = 16;
  s.staging_bytes = 0;
  return s;
}

}  // namespace

TEST_CASE(
    "in process: a write error on the prefill fails the room on both sides once the decode has "
    "fenced it",
    "[e2e][in_process]") {
  require_provider("tcp");
  temp_dir dir;
  const shape s = small_shape();
  inproc_daemon prefill(dir, "prefill-0", "prefill", s);
  inproc_daemon decode(dir, "decode-0", "decode", s);
  auto p = prefill.connect();
  auto d = decode.connect();
  // The wrapper with nothing armed: a room moves byte-exact.
  run_and_verify(*p, *d, prefill.control(), small_room(1));

  // The second write of the next batch fails, and with it the batch: one notification covers
  // all of its writes (transport/fault_engine.hpp).
  prefill.faults().arm(transport::fault::of(transport::fault::kind::fail_writes, 1,
                                            "fi_cq_readerr: Connection reset by peer")
                           .at_write(1));
  auto r = small_room(2);
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  send_rest(*p, r, 0);
  const auto pe = wait_done(*p, r.room);
  CHECK(pe.status == room_status::failed);
  CHECK(pe.code == errc::fabric_write_failed);
  CHECK_THAT(pe.reason, Catch::StartsWith("write to decode ") &&
                            Catch::EndsWith(" failed: injected: fi_cq_readerr: Connection reset "
                                            "by peer"));
  const auto de = wait_done(*d, r.room);
  CHECK(de.status == room_status::failed);
  CHECK(de.code == errc::fabric_write_failed);
  CHECK(de.reason == "prefill " + prefill.control() + " reported: " + pe.reason);
  // The prefill drained reporting a failed write: no landed notification covers the rest of
  // its batch (tcp: one marker after the batch's last write), so the decode reported Failed only
  // once it had fenced the prefill (core/receiver_room.cpp, drained).
  const auto ps = prefill.faults().stats();
  const auto ds = decode.faults().stats();
  CHECK(ps.failed_writes > 1);
  CHECK(ps.failed_batches == 1);
  CHECK(ds.calls.fence_peer == 1);
  // The failed write's bytes never arrived.
  const auto verified = client::verify_room(*d, r.room, r.dst_pages, r.dst_slot, r.dst_row);
  CHECK_FALSE(verified);
  CHECK(verified.code == errc::internal);  // a mismatch, not an index the pools lack
  check_nothing_held(*p);
  check_nothing_held(*d);

  // The fault is used up: over a new connection (the fence ended the old one), the same pages,
  // slot and row serve the next room byte-exact.
  run_and_verify(*p, *d, prefill.control(), small_room(3));
  CHECK(prefill.stop() == 0);
  CHECK(decode.stop() == 0);
}

TEST_CASE(
    "in process: a decode missing an immediate times out, fences the prefill at the drain "
    "deadline, and reports Failed only once the fence has happened",
    "[e2e][in_process]") {
  require_provider("tcp");
  temp_dir dir;
  const shape s = small_shape();
  // Only the decode's bounds are short: the decode, not the prefill, is to time out first.
  shape ds = s;
  ds.transferring_ms = 2000;
  ds.drain_ms = 500;
  inproc_daemon prefill(dir, "prefill-0", "prefill", s);
  inproc_daemon decode(dir, "decode-0", "decode", ds);
  auto p = prefill.connect();
  auto d = decode.connect();

  // One write's immediate never reaches the decode's Scheduler, and the fence waits for the test.
  decode.faults().arm(transport::fault::of(transport::fault::kind::drop_immediates, 1));
  decode.faults().arm(transport::fault::of(transport::fault::kind::hold_fences));
  auto r = small_room(11);
  r.chunks = {4, 4, 4};  // a batch, and on tcp one notification, per chunk
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  send_rest(*p, r, 0);
  const auto pe = wait_done(*p, r.room);
  CHECK(pe.status == room_status::failed);
  CHECK(pe.code == errc::timed_out);
  const uint64_t n = prefill.faults().stats().writes_completed;
  REQUIRE(n > 1);

  // The decode timed out in Transferring, the prefill drained, one write's immediate is missing:
  // at the drain deadline the decode fences the prefill, and the fence is held.
  REQUIRE(decode.faults().wait_for([](const auto& st) { return st.fences_held == 1; }, 30s));
  auto held = d->poll(r.room);
  INFO(held.message);
  REQUIRE(held);
  CHECK(held.value.status != room_status::failed);  // a write may still land: not reusable yet
  CHECK(held.value.status != room_status::success);
  CHECK(decode.faults().release_fences() == 1);
  const auto de = wait_done(*d, r.room);
  CHECK(de.status == room_status::failed);
  CHECK(de.code == errc::timed_out);
  INFO(de.reason);
  CHECK_THAT(de.reason, Catch::StartsWith(fmt::format(
                            "timed out in Transferring after 2000 ms (waiting for the remaining "
                            "writes: {} landed, {} announced)",
                            n - 1, n)));
  CHECK_THAT(de.reason, Catch::EndsWith(fmt::format(
                            "; drain incomplete after 500 ms (timeouts.drain_ms), fenced: {} ({} "
                            "of {} drained writes landed)",
                            prefill.control(), n - 1, n)));
  CHECK_THAT(pe.reason, Catch::StartsWith("decode ") && Catch::Contains(" reported: timed out in "
                                                                        "Transferring"));
  const auto seen = decode.faults().stats();
  CHECK(seen.immediates_dropped == 1);
  CHECK(seen.immediates_delivered == n - 1);

  // A new connection to the prefill (the fence ended the old one) moves the next room.
  run_and_verify(*p, *d, prefill.control(), small_room(12));
  check_nothing_held(*p);
  check_nothing_held(*d);
  CHECK(prefill.stop() == 0);
  CHECK(decode.stop() == 0);
}

TEST_CASE("in process: a client's drain is refused with 400 naming why, and the daemon serves on",
          "[e2e][in_process][drain]") {
  require_provider("tcp");
  temp_dir dir;
  const shape s = small_shape();
  inproc_daemon prefill(dir, "prefill-0", "prefill", s);
  inproc_daemon decode(dir, "decode-0", "decode", s);
  auto p = prefill.connect();
  auto d = decode.connect();
  // The program around the daemon stops it, not a client: a drain would signal that program.
  const auto refused = d->drain();
  CHECK(refused.code == errc::invalid_request);
  CHECK(refused.message ==
        "this ferryd runs inside another program, which stops it: it cannot drain on a "
        "client's request");
  CHECK(status_of(*d).at("draining") == false);
  run_and_verify(*p, *d, prefill.control(), small_room(21));
  CHECK(prefill.stop() == 0);
  CHECK(decode.stop() == 0);
}

TEST_CASE(
    "in process: a cancelled packed room keeps its staging and reports Failed only once every "
    "write the prefill completed has landed",
    "[e2e][in_process][pack]") {
  require_provider("tcp");
  temp_dir dir;
  shape s = small_shape();
  s.staging_bytes = 8 << 20;  // both sides pack through staging (core/pack.hpp)
  s.drain_ms = 60000;         // only the held immediates may end the drain, not its deadline
  inproc_daemon prefill(dir, "prefill-0", "prefill", s);
  inproc_daemon decode(dir, "decode-0", "decode", s);
  auto p = prefill.connect();
  auto d = decode.connect();
  // Single pages on both sides, the decode's descending: the prefill gathers every run, the
  // decode lands them in its staging and would scatter them on commit.
  auto room = [](uint64_t id) {
    room_spec r = small_room(id);
    r.src_pages.clear();
    r.dst_pages.clear();
    for (uint32_t i = 0; i < 100; ++i) {
      r.src_pages.push_back(2 * i);
      r.dst_pages.push_back(250 - 2 * i);
    }
    r.chunks = {100};
    return r;
  };
  run_and_verify(*p, *d, prefill.control(), room(31));
  CHECK(status_of(*p).at("staging").at("packed_bytes") > 0);
  CHECK(status_of(*d).at("staging").at("unpacked_bytes") > 0);

  // Every arrived immediate is held from the decode's Scheduler: the writes land, unseen.
  decode.faults().arm(
      transport::fault::of(transport::fault::kind::hold_immediates, transport::fault::always));
  auto r = room(32);
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  send_rest(*p, r, 0);
  wait_status(*d, r.room, room_status::transferring);  // announced: every write was posted
  REQUIRE(decode.faults().wait_for([](const auto& st) { return st.immediates_held > 0; }, 30s));
  REQUIRE(d->cancel(r.room));
  // The prefill drains (its writes complete) and tells the decode how many completed.
  const auto pe = wait_done(*p, r.room);
  CHECK(pe.status == room_status::failed);
  CHECK(status_of(*p).at("staging").at("in_use") == 0);  // its packed slices are free
  const uint64_t sent = prefill.faults().stats().writes_completed;
  REQUIRE(decode.faults().wait_for(
      [&](const auto& st) { return st.immediates_held == sent - st.immediates_delivered; }, 30s));
  // The decode has not seen them land: it may not report Failed, nor let its staging go.
  auto held = d->poll(r.room);
  INFO(held.message);
  REQUIRE(held);
  CHECK(held.value.status != room_status::failed);
  CHECK(status_of(*d).at("staging").at("in_use") > 0);
  decode.faults().disarm();
  CHECK(decode.faults().release_immediates() > 0);
  const auto de = wait_done(*d, r.room);
  CHECK(de.status == room_status::failed);
  CHECK(de.reason == "cancelled by client");
  CHECK(status_of(*d).at("staging").at("in_use") == 0);
  check_nothing_held(*p);
  check_nothing_held(*d);

  // The same pages, slot and row at once: only the new room's bytes.
  run_and_verify(*p, *d, prefill.control(), room(33));
  CHECK(prefill.stop() == 0);
  CHECK(decode.stop() == 0);
}

TEST_CASE(
    "in process: with checksums, a byte changed in flight fails the room with checksum_mismatch "
    "naming the buffer, and without them it goes unseen",
    "[e2e][in_process][checksums]") {
  require_provider("tcp");
  temp_dir dir;
  shape s = small_shape();
  shape ds = s;
  ds.checksums = true;
  inproc_daemon prefill(dir, "prefill-0", "prefill", s);
  inproc_daemon decode(dir, "decode-0", "decode", ds);
  auto p = prefill.connect();
  auto d = decode.connect();
  // Nothing armed: the digests match, and the room is byte-exact.
  run_and_verify(*p, *d, prefill.control(), small_room(1));

  // Every write of the next batch reads its source one byte off: it lands wrong bytes and
  // completes as if all were well.
  prefill.faults().arm(transport::fault::of(transport::fault::kind::corrupt_writes));
  auto r = small_room(2);
  stage(*p, *d, r);
  prepare(*d, prefill.control(), r);
  send_rest(*p, r, 0);
  const auto de = wait_done(*d, r.room);
  INFO(de.reason);
  CHECK(de.status == room_status::failed);
  CHECK(de.code == errc::checksum_mismatch);
  CHECK_THAT(de.reason,
             Catch::Matches(R"((kv buffer \d+ \((K|V), layer \d+\)|state buffer \d+ \(tensor \d+, )"
                            R"(layer \d+\)|aux buffer \d+): destination bytes \[\d+, \d+\) of the )"
                            R"((kv|state|aux) pool differ from what prefill )" +
                            prefill.control() +
                            R"( sent \(digest 0x[0-9a-f]{16} landed, 0x[0-9a-f]{16} sent\))"));
  const auto pe = wait_done(*p, r.room);
  CHECK(pe.status == room_status::failed);
  CHECK(pe.code == errc::checksum_mismatch);
  CHECK(prefill.faults().stats().corrupted_writes > 0);
  check_nothing_held(*p);
  check_nothing_held(*d);
  // The next room, nothing armed, is verified and byte-exact.
  run_and_verify(*p, *d, prefill.control(), small_room(3));
  CHECK(prefill.stop() == 0);
  CHECK(decode.stop() == 0);

  // The same fault against a decode that does not check: Success, with wrong bytes.
  temp_dir dir2;
  inproc_daemon prefill2(dir2, "prefill-1", "prefill", s);
  inproc_daemon decode2(dir2, "decode-1", "decode", s);
  auto p2 = prefill2.connect();
  auto d2 = decode2.connect();
  prefill2.faults().arm(transport::fault::of(transport::fault::kind::corrupt_writes));
  auto q = small_room(4);
  stage(*p2, *d2, q);
  prepare(*d2, prefill2.control(), q);
  send_rest(*p2, q, 0);
  CHECK(wait_done(*d2, q.room).status == room_status::success);
  CHECK_FALSE(client::verify_room(*d2, q.room, q.dst_pages, q.dst_slot, q.dst_row));

  // On that decode, a room whose prepare asks for a check (v10) is checked all the same.
  prefill2.faults().arm(transport::fault::of(transport::fault::kind::corrupt_writes));
  auto c = small_room(5);
  c.checksum = true;
  stage(*p2, *d2, c);
  prepare(*d2, prefill2.control(), c);
  send_rest(*p2, c, 0);
  const auto ce = wait_done(*d2, c.room);
  INFO(ce.reason);
  CHECK(ce.status == room_status::failed);
  CHECK(ce.code == errc::checksum_mismatch);
  CHECK_THAT(ce.reason, Catch::Contains("differ from what prefill " + prefill2.control()));
  CHECK(wait_done(*p2, c.room).code == errc::checksum_mismatch);
  check_nothing_held(*p2);
  check_nothing_held(*d2);
  // Nothing armed: a checked room is verified and byte-exact, an unchecked one beside it too.
  auto v = small_room(6);
  v.checksum = true;
  run_and_verify(*p2, *d2, prefill2.control(), v);
  run_and_verify(*p2, *d2, prefill2.control(), small_room(7));
  CHECK(prefill2.stop() == 0);
  CHECK(decode2.stop() == 0);
}
