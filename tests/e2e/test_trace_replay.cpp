// The pure room machines agree with the actors: two real daemons run with FERRY_TRACE_DIR
// (actors/room_trace.hpp), every Sender and Receiver records the events it fed its machine and
// the effects it got back, and each trace replayed into a fresh machine (core/sender_room.hpp,
// core/receiver_room.hpp) gives back the same effects, event for event. The rooms cover
// success, a send before its prepare, a refused chunk, a cancel on each side, a room sent
// in layer ranges, and a paged state room (swa) with a refused state page count.

#include <filesystem>
#include <fstream>
#include <set>

#include "actors/room_trace.hpp"
#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;
using trace::json;

namespace {

/// The trace files in `dir`.
std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

struct replayed {
  size_t events = 0;
  std::set<std::string> reports;  // statuses reported
};

/// Replay one trace into a fresh machine of its kind; every line's effects must come back.
template <class Machine>
void replay_file(const std::string& path, Machine&& make, replayed& out) {
  std::ifstream in(path);
  std::string line;
  REQUIRE(std::getline(in, line));
  const auto created = json::parse(line);
  auto m = make(created);
  // Every line is stamped with the monotonic clock, in the order it was written.
  REQUIRE(created.contains("t_us"));
  int64_t last_us = created["t_us"].get<int64_t>();
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    const auto rec = json::parse(line);
    REQUIRE(rec.contains("t_us"));
    CHECK(rec["t_us"].get<int64_t>() >= last_us);
    last_us = rec["t_us"].get<int64_t>();
    INFO(path << " line " << n + 1 << ": " << rec["event"].dump());
    const auto got = trace::effects_json(trace::replay(m, rec.at("event")));
    CHECK(got == rec.at("effects"));
    for (const auto& e : got)
      if (e.at("e") == "life" && !e["effects"]["report"].is_null())
        out.reports.insert(e["effects"]["report"].template get<std::string>());
  }
  out.events += n;
}

}  // namespace

TEST_CASE("room traces of an end-to-end run replay into the pure machines with the same effects",
          "[e2e][trace]") {
  temp_dir dir;
  shape s;
  s.env = {{"FERRY_TRACE_DIR", dir.path.string()}};
  {
    pair c(s);
    room_spec ok;
    ok.room = 1;
    ok.src_pages = range(0, 8);
    ok.dst_pages = range(100, 8);
    ok.chunks = {3, 5};
    run_and_verify(c, ok);

    room_spec early;  // the send arrives before the prepare
    early.room = 2;
    early.src_pages = range(20, 4);
    early.dst_pages = range(200, 4);
    stage(c, early);
    send_chunks(c, early);
    prepare(c, early);
    REQUIRE(wait_done(*c.d, early.room).status == room_status::success);

    room_spec refused;  // a page sent twice is refused; the room then completes
    refused.room = 3;
    refused.src_pages = range(40, 4);
    refused.dst_pages = range(300, 4);
    refused.chunks = {2, 2};
    stage(c, refused);
    prepare(c, refused);
    send_chunk(*c.p, refused, 0);
    auto again = c.p->send({refused.room, {40}, false, no_index, no_index});
    REQUIRE_FALSE(again);
    CHECK(again.code == errc::invalid_request);
    send_chunk(*c.p, refused, 1);
    REQUIRE(wait_done(*c.d, refused.room).status == room_status::success);

    room_spec cancelled;  // prepared, one chunk sent, then cancelled by the decode's client
    cancelled.room = 4;
    cancelled.src_pages = range(60, 4);
    cancelled.dst_pages = range(400, 4);
    cancelled.chunks = {2, 2};
    stage(c, cancelled);
    prepare(c, cancelled);
    send_chunk(*c.p, cancelled, 0);
    REQUIRE(c.d->cancel(cancelled.room));
    CHECK(wait_done(*c.d, cancelled.room).status == room_status::failed);
    CHECK(wait_done(*c.p, cancelled.room).status == room_status::failed);

    room_spec by_prefill;  // cancelled by the prefill's client before its last chunk
    by_prefill.room = 5;
    by_prefill.src_pages = range(80, 4);
    by_prefill.dst_pages = range(500, 4);
    by_prefill.chunks = {2, 2};
    stage(c, by_prefill);
    prepare(c, by_prefill);
    send_chunk(*c.p, by_prefill, 0);
    // Once the prefill room holds the decode's prepare, so the cancel reaches the decode at once
    // (a prepare that arrived after the cancel would open a new incarnation of the room id).
    wait_status(*c.p, by_prefill.room, room_status::waiting_for_input);
    REQUIRE(c.p->cancel(by_prefill.room));
    CHECK(wait_done(*c.p, by_prefill.room).status == room_status::failed);
    CHECK(wait_done(*c.d, by_prefill.room).status == room_status::failed);

    room_spec layered;  // sent in layer ranges, out of order (protocol v6)
    layered.room = 6;
    layered.src_pages = range(100, 4);
    layered.dst_pages = range(600, 4);
    layered.chunks = {2, 2};
    stage(c, layered);
    prepare(c, layered);
    for (size_t k = 0; k < 2; ++k) {
      const bool last = k == 1;
      const std::vector<uint32_t> pages = range(100 + 2 * static_cast<uint32_t>(k), 2);
      for (auto [first, count] : {std::pair<uint32_t, uint32_t>{8, 8}, {0, 8}}) {
        auto ok = c.p->send(
            {layered.room, pages, last, last ? 0u : no_index, last ? 0u : no_index, first, count});
        INFO(ok.message);
        REQUIRE(ok);
      }
    }
    REQUIRE(wait_done(*c.d, layered.room).status == room_status::success);

    CHECK(c.prefill.stop() == 0);
    CHECK(c.decode.stop() == 0);
  }
  replayed senders, receivers;
  size_t sender_files = 0, receiver_files = 0;
  for (const auto& f : files_in(dir.path)) {
    if (f.find("/sender-") != std::string::npos) {
      ++sender_files;
      replay_file(f, trace::sender_of, senders);
    } else if (f.find("/receiver-") != std::string::npos) {
      ++receiver_files;
      replay_file(f, trace::receiver_of, receivers);
    }
  }
  CHECK(sender_files == 6);
  CHECK(receiver_files == 6);
  CHECK(senders.events >= 20);
  CHECK(receivers.events >= 20);
  CHECK(senders.reports.count("Success") == 1);
  CHECK(senders.reports.count("Failed") == 1);
  CHECK(receivers.reports.count("Success") == 1);
  CHECK(receivers.reports.count("Failed") == 1);
}

TEST_CASE(
    "a paged state room's trace replays too: its state page counts and the refusal of a "
    "last chunk that names another count",
    "[e2e][trace]") {
  temp_dir dir;
  shape s;
  s.state_type = "swa";
  s.slots = 16;  // pages of the swa pool
  s.env = {{"FERRY_TRACE_DIR", dir.path.string()}};
  {
    pair c(s);
    proto::prepare p{7, {c.prefill.control()}, range(100, 4), no_index, 1};
    p.state_pages = {9, 2};
    REQUIRE(c.d->prepare(p));
    wait_status(*c.d, 7, room_status::waiting_for_input);  // the prefill room holds it
    proto::send last{7, range(0, 4), true, no_index, 1};
    last.state_pages = {3};  // one page where the decode named two: refused, the room goes on
    REQUIRE(client::fill_state_and_aux(*c.p, 7, no_index, 1).message == "");
    CHECK(c.p->send(last).code == errc::invalid_request);
    last.state_pages = {3, 4};
    REQUIRE(c.p->send(last));
    REQUIRE(wait_done(*c.d, 7).status == room_status::success);
    CHECK(c.prefill.stop() == 0);
    CHECK(c.decode.stop() == 0);
  }
  replayed senders;
  for (const auto& f : files_in(dir.path))
    if (f.find("/sender-") != std::string::npos) replay_file(f, trace::sender_of, senders);
  CHECK(senders.events >= 5);
  CHECK(senders.reports.count("Success") == 1);
}
