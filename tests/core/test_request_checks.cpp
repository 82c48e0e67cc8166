// core/request_checks.hpp: what a client's prepare and send must satisfy before any room sees
// them, against the shipped hybrid decode config (kv 20480 pages, 8 Mamba slots, 64 aux rows),
// each refusal naming the room, the field and the value.

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/request_checks.hpp"

using namespace ferry;

namespace {

ferry_config hybrid() {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  auto r =
      load_config_file(std::string(dir ? dir : FERRY_DEFAULT_SOURCE_DIR) + "/configs/decode.yaml");
  INFO(r.message);
  REQUIRE(r);
  return r.value;
}

proto::prepare prepare_ok() {
  proto::prepare p;
  p.room = 3;
  p.prefill_peers = {"10.0.0.1:7401"};
  p.dst_pages = {0, 1};
  p.state_slot = 0;
  p.aux_row = 0;
  return p;
}

std::string refusal(const result<>& r) {
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::invalid_request);
  return r.message;
}

}  // namespace

TEST_CASE(
    "request checks: a prepare names peers, whole-page prefixes, pages, one slot and one "
    "row",
    "[unit][request_checks]") {
  const auto cfg = hybrid();
  const auto layout = make_layout(cfg.pools);
  CHECK(check_prepare(cfg, layout, prepare_ok()));
  auto p = prepare_ok();
  p.prefill_peers.clear();
  CHECK(refusal(check_prepare(cfg, layout, p)) == "room 3: no prefill peer named");
  p = prepare_ok();
  p.prefill_peers = {"10.0.0.1:7401", "10.0.0.1:7401"};
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 3: prefill peer 10.0.0.1:7401 is named twice");
  p.prefill_peers = {"10.0.0.1"};
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 3: prefill peer 0 '10.0.0.1' is not host:port (a port in 1..65535)");
  p.prefill_peers = {""};
  CHECK(refusal(check_prepare(cfg, layout, p)) == "room 3: prefill peer 0 is empty");
  p = prepare_ok();
  p.state_slot = no_index;
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "mamba requires single state index: room 3 got dst=none (exactly one dst state slot is "
        "required)");
  p.state_slot = 8;
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 3: dst state slot 8 is outside the pool of 8 slots");
  p = prepare_ok();
  p.aux_row = no_index;
  CHECK(refusal(check_prepare(cfg, layout, p)) == "room 3: exactly one dst aux row is required");
  p.aux_row = 64;
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 3: dst aux row 64 is outside the pool of 64 rows");
  p = prepare_ok();
  p.dst_pages = {0, 20480};
  CHECK_THAT(refusal(check_prepare(cfg, layout, p)), Catch::StartsWith("room 3: dst page"));
}

TEST_CASE("request checks: a prefix is whole pages of a kv pool", "[unit][request_checks]") {
  auto cfg = hybrid();
  cfg.pools.kv->page_tokens = 16;
  auto layout = make_layout(cfg.pools);
  auto p = prepare_ok();
  p.prefix_tokens = 32;
  CHECK(check_prepare(cfg, layout, p));
  p.prefix_tokens = 20;
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 3: prefix_tokens 20 is not a multiple of the page size 16 (pools.kv.page_tokens)");
  cfg.pools.kv.reset();
  layout = make_layout(cfg.pools);
  p.dst_pages.clear();
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 3: prefix_tokens 20 named, but this daemon has no kv pool");
}

TEST_CASE("request checks: a send's slot and row go with its last chunk only, pools it has",
          "[unit][request_checks]") {
  auto cfg = hybrid();
  auto layout = make_layout(cfg.pools);
  proto::send s{3, {0, 1}, false, no_index, no_index};
  CHECK(check_send(cfg, layout, s));
  s.state_slot = 1;
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 3: state slot, state pages and aux row go only with the last chunk");
  s.last = true;
  s.aux_row = 2;
  CHECK(check_send(cfg, layout, s));
  cfg.pools.mamba.reset();
  layout = make_layout(cfg.pools);
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 3: src state slot 1 given but this daemon has no mamba pool");
  cfg.pools.kv.reset();
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 3: src pages given but this daemon has no kv pool");
}

TEST_CASE("request checks: a send's layer range lies within this rank's layers",
          "[unit][request_checks]") {
  // The shipped config: 48 layers, KV at 3, 7, ..., 47, GDN state at the others.
  const auto cfg = hybrid();
  const auto layout = make_layout(cfg.pools);
  proto::send s{3, {0, 1}, false, no_index, no_index, 0, 1};
  CHECK(check_send(cfg, layout, s));
  s.first_layer = 47;
  CHECK(check_send(cfg, layout, s));
  s.first_layer = 40, s.layer_count = 12;
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 3: layers [40, 52) reach outside this rank's layers 0..47");
  s.first_layer = 48, s.layer_count = 1;
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 3: layers [48, 49) reach outside this rank's layers 0..47");
  s.first_layer = 5, s.layer_count = 0;
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 3: first_layer 5 given with layer_count 0 (a layer_count of 0 sends every layer)");
  // The last chunk's ranges each carry the slot and the row, as a whole last send does.
  proto::send last{3, {}, true, 1, 2, 3, 1};
  CHECK(check_send(cfg, layout, last));
  last.aux_row = no_index;
  CHECK(refusal(check_send(cfg, layout, last)) == "room 3: exactly one src aux row is required");
}

TEST_CASE("request checks: a last chunk's aux row must carry the room's id, where the pool says so",
          "[unit][request_checks]") {
  auto cfg = hybrid();
  REQUIRE(cfg.pools.aux->room_id_buffer == 0);  // the shipped configs check it
  const auto layout = make_layout(cfg.pools);
  const auto& rows = layout[pool_kind::aux].buffers[0];
  std::vector<uint8_t> aux(layout[pool_kind::aux].total_bytes, 0);
  const uint64_t room = 3, other = 0x0102030405060708;
  std::memcpy(aux.data() + rows.offset + 2 * rows.item_bytes, &room, sizeof room);
  std::memcpy(aux.data() + rows.offset + 5 * rows.item_bytes, &other, sizeof other);
  proto::send s{room, {0, 1}, true, 0, 2};
  CHECK(check_aux_room_id(cfg, layout, aux.data(), s));
  s.aux_row = 5;
  CHECK(refusal(check_aux_room_id(cfg, layout, aux.data(), s)) ==
        "room 3: src aux row 5 carries room id 72623859790382856, expected 3");
  s.last = false;  // a chunk before the last names no row
  CHECK(check_aux_room_id(cfg, layout, aux.data(), s));
  s.last = true;
  cfg.pools.aux->room_id_buffer = aux_pool_config::no_room_id;
  CHECK(check_aux_room_id(cfg, layout, aux.data(), s));
}
