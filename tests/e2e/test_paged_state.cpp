// A paged state pool end to end (SGLang's swa state type: the sliding window's pages, a page
// list of their own beside the KV pages): real daemons on loopback, every destination byte of
// the KV, of each named state page and of the aux row checked; a state page list of another
// length refused by name; SWA under a TP mismatch refused at the handshake with SGLang's reason.

#include <fmt/format.h>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

shape swa(uint32_t tp, uint32_t rank) {
  shape s;
  s.state_type = "swa";
  s.pages = 512;
  s.slots = 64;  // pages of the swa pool
  s.kv_layers = 2;
  s.mamba_layers = 2;
  s.conv_dim = 256;
  s.temporal_heads = 8;
  s.temporal_dim = 16;
  s.tp_size = tp;
  s.tp_rank = rank;
  return s;
}

/// The pattern key of a state page's bytes: its room and its position in the window.
uint64_t page_key(uint64_t room, size_t position) { return room * 1000 + position; }

struct swa_room {
  uint64_t room = 0;
  std::vector<uint32_t> src_pages, dst_pages;
  std::vector<uint32_t> src_state, dst_state;  // the window's pages, by position
  uint32_t src_row = 0, dst_row = 0;
};

void fill(client::client& c, const swa_room& r) {
  REQUIRE(client::fill_kv(c, r.room, r.src_pages, 0).message == "");
  for (size_t i = 0; i < r.src_state.size(); ++i)
    REQUIRE(client::fill_state_and_aux(c, page_key(r.room, i), r.src_state[i], no_index, r.room)
                .message == "");
  REQUIRE(client::fill_state_and_aux(c, r.room, no_index, r.src_row).message == "");
}

void verify(client::client& c, const swa_room& r) {
  CHECK(client::verify_room(c, r.room, r.dst_pages, no_index, r.dst_row).message == "");
  for (size_t i = 0; i < r.dst_state.size(); ++i) {
    INFO("state page position " << i);
    CHECK(
        client::verify_room(c, page_key(r.room, i), r.room, {}, r.dst_state[i], no_index).message ==
        "");
  }
}

proto::prepare prepare_of(const swa_room& r, std::vector<std::string> peers) {
  proto::prepare p;
  p.room = r.room;
  p.prefill_peers = std::move(peers);
  p.dst_pages = r.dst_pages;
  p.aux_row = r.dst_row;
  p.state_pages = r.dst_state;
  return p;
}

proto::send last_send(const swa_room& r) {
  proto::send s;
  s.room = r.room;
  s.src_pages = r.src_pages;
  s.last = true;
  s.aux_row = r.src_row;
  s.state_pages = r.src_state;
  return s;
}

swa_room window_room(uint64_t id) {
  swa_room r;
  r.room = id;
  for (uint32_t i = 0; i < 24; ++i) {
    r.src_pages.push_back(40 + i);
    r.dst_pages.push_back(300 - i);
  }
  r.src_state = {5, 6, 7, 20};  // a run and a page apart
  r.dst_state = {30, 31, 2, 3};
  r.src_row = 3;
  r.dst_row = 11;
  return r;
}

}  // namespace

TEST_CASE("paged state: a swa room moves its KV and its window's own pages byte for byte",
          "[e2e][paged_state]") {
  require_provider("tcp");
  // The last run checks what lands (integrity.checksums): its digests cover the window's pages.
  for (auto [tp, checks] : {std::pair{1u, false}, std::pair{2u, false}, std::pair{2u, true}}) {
    INFO("TP " << tp << " -> " << tp << (checks ? ", checksums" : ""));
    temp_dir dir;
    std::vector<std::unique_ptr<daemon_proc>> pre, dec;
    std::vector<std::unique_ptr<client::client>> p, d;
    for (uint32_t r = 0; r < tp; ++r) {
      auto checked = swa(tp, r);
      checked.checksums = checks;
      pre.push_back(
          std::make_unique<daemon_proc>(dir, fmt::format("prefill-{}", r), "prefill", swa(tp, r)));
      dec.push_back(
          std::make_unique<daemon_proc>(dir, fmt::format("decode-{}", r), "decode", checked));
      p.push_back(pre.back()->connect());
      d.push_back(dec.back()->connect());
    }
    std::vector<std::string> peers;
    for (const auto& x : pre) peers.push_back(x->control());
    const auto r = window_room(7);
    for (auto& c : p) fill(*c, r);
    for (auto& c : d) {
      REQUIRE(client::clear_room(*c, r.dst_pages, no_index, r.dst_row).message == "");
      for (auto page : r.dst_state)
        REQUIRE(client::clear_room(*c, {}, page, no_index).message == "");
      auto ok = c->prepare(prepare_of(r, peers));
      INFO(ok.message);
      REQUIRE(ok);
    }
    for (auto& c : p) {
      auto ok = c->send(last_send(r));
      INFO(ok.message);
      REQUIRE(ok);
    }
    for (size_t i = 0; i < tp; ++i) {
      auto e = wait_done(*d[i], r.room);
      INFO(e.reason);
      REQUIRE(e.status == room_status::success);
      REQUIRE(wait_done(*p[i], r.room).status == room_status::success);
      verify(*d[i], r);
    }
  }
}

TEST_CASE("paged state: a window of another length is refused by name, and a Mamba slot too",
          "[e2e][paged_state]") {
  require_provider("tcp");
  temp_dir dir;
  daemon_proc pre(dir, "prefill", "prefill", swa(1, 0)), dec(dir, "decode", "decode", swa(1, 0));
  auto p = pre.connect();
  auto d = dec.connect();
  // The pools document says what the state pool holds, so its items are read as pages.
  const auto pools = info_of(*d, proto::info_topic::pools);
  CHECK(pools["state"]["type"] == "swa");
  CHECK(pools["state"]["items"] == 64);
  CHECK(info_of(*d, proto::info_topic::pools)["kv"].contains("type") == false);
  auto r = window_room(9);
  auto bad = prepare_of(r, {pre.control()});
  bad.state_slot = 1;
  auto refused = d->prepare(bad);
  REQUIRE_FALSE(refused);
  CHECK(refused.code == errc::invalid_request);
  CHECK(refused.message ==
        "room 9: dst state slot 1 given, but the swa state pool is indexed by pages "
        "(state_pages), not by a slot");
  REQUIRE(d->prepare(prepare_of(r, {pre.control()})));
  wait_status(*d, r.room, room_status::waiting_for_input);  // the prefill accepted it
  fill(*p, r);
  auto s = last_send(r);
  s.state_pages.pop_back();
  refused = p->send(s);
  REQUIRE_FALSE(refused);
  CHECK(refused.code == errc::invalid_request);
  CHECK(refused.message ==
        "room 9: the last chunk names 3 state pages but the decode prepared 4 (the lists must be "
        "the same length)");
  // The room goes on: the right list completes it.
  REQUIRE(p->send(last_send(r)));
  REQUIRE(wait_done(*d, r.room).status == room_status::success);
  verify(*d, r);
}

TEST_CASE("paged state: SWA under a TP mismatch is refused at the handshake with SGLang's reason",
          "[e2e][paged_state]") {
  require_provider("tcp");
  temp_dir dir;
  daemon_proc p0(dir, "prefill-0", "prefill", swa(2, 0)),
      p1(dir, "prefill-1", "prefill", swa(2, 1));
  daemon_proc dec(dir, "decode", "decode", swa(1, 0));
  auto d = dec.connect();
  auto r = window_room(5);
  REQUIRE(d->prepare(prepare_of(r, {p0.control(), p1.control()})));
  const auto failed = wait_done(*d, r.room);
  REQUIRE(failed.status == room_status::failed);
  CHECK(failed.code == errc::peer_incompatible);
  CHECK_THAT(failed.reason, Catch::Contains("swa state cannot move from prefill TP 2 to decode TP "
                                            "1: SGLang refuses SWA state under a TP mismatch for "
                                            "non-MLA models"));
}

TEST_CASE(
    "paged state: a peer speaking an older peer protocol is refused by name, not sent pages "
    "it cannot read",
    "[e2e][paged_state]") {
  require_provider("tcp");
  temp_dir dir;
  auto old = swa(1, 0);
  old.env.push_back({"FERRY_FAILPOINTS", "peer_protocol_6"});
  daemon_proc pre(dir, "prefill", "prefill", old), dec(dir, "decode", "decode", swa(1, 0));
  auto d = dec.connect();
  auto r = window_room(3);
  REQUIRE(d->prepare(prepare_of(r, {pre.control()})));
  const auto failed = wait_done(*d, r.room);
  REQUIRE(failed.status == room_status::failed);
  CHECK(failed.code == errc::peer_incompatible);
  CHECK_THAT(failed.reason, Catch::Contains("has a swa state pool, which needs peer protocol 8; "
                                            "the pair speaks 6"));
}
