// End-to-end transfers between different parallel geometries: one real ferryd per rank, every
// destination byte checked against the global pattern (which depends only on layer id, token,
// global head and global channel, never on the planner).

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// One ferryd and one client per rank of a prefill instance and of a decode instance.
struct cluster {
  temp_dir dir;
  std::vector<std::unique_ptr<daemon_proc>> prefill, decode;
  std::vector<std::unique_ptr<client::client>> p, d;
  /// Each prefill rank sends every chunk one of its own layers at a time, last layer first
  /// (protocol v6 layer ranges), instead of whole.
  bool layer_wise = false;

  /// `prefill_shapes` / `decode_shapes`: one shape per rank (geometry fields set).
  cluster(const std::vector<shape>& prefill_shapes, const std::vector<shape>& decode_shapes) {
    // Every rank starts at once; then each is waited for and connected to.
    for (size_t i = 0; i < prefill_shapes.size(); ++i)
      prefill.push_back(std::make_unique<daemon_proc>(
          launch_only, dir, fmt::format("prefill-{}", i), "prefill", prefill_shapes[i]));
    for (size_t i = 0; i < decode_shapes.size(); ++i)
      decode.push_back(std::make_unique<daemon_proc>(launch_only, dir, fmt::format("decode-{}", i),
                                                     "decode", decode_shapes[i]));
    for (auto& x : prefill) {
      x->await_ready();
      p.push_back(x->connect());
    }
    for (auto& x : decode) {
      x->await_ready();
      d.push_back(x->connect());
    }
  }

  std::vector<std::string> prefill_controls() const {
    std::vector<std::string> out;
    for (const auto& x : prefill) out.push_back(x->control());
    return out;
  }

  /// Every prefill rank fills its shard of each room; every decode rank clears, prepares naming
  /// `peers` (default: every prefill rank); every prefill rank sends each room in its chunks;
  /// all rooms are in flight together. Then every rank on both sides must report Success and
  /// every decode byte must match.
  /// Every prefill rank fills its shard of the room; every decode rank clears and prepares it,
  /// naming `peers` (default: every prefill rank).
  void stage(const room_spec& r, std::vector<std::string> peers = {}) {
    if (peers.empty()) peers = prefill_controls();
    for (auto& c : p) {
      REQUIRE(client::fill_kv(*c, r.room, r.src_pages, 0).message == "");
      REQUIRE(client::fill_state_and_aux(*c, r.room, r.src_slot, r.src_row).message == "");
    }
    for (auto& c : d) {
      REQUIRE(client::clear_room(*c, r.dst_pages, r.dst_slot, r.dst_row).message == "");
      auto prep = prepare_of(r, "");
      prep.prefill_peers = peers;
      auto ok = c->prepare(prep);
      INFO(ok.message);
      REQUIRE(ok);
    }
  }

  /// The room succeeded on every rank of both sides, and every decode byte matches.
  void expect_success(const room_spec& r) {
    INFO("room " << r.room);
    for (size_t i = 0; i < d.size(); ++i) {
      auto e = wait_done(*d[i], r.room);
      INFO("decode rank " << i << ": " << e.reason);
      REQUIRE(e.status == room_status::success);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      auto e = wait_done(*p[i], r.room);
      INFO("prefill rank " << i << ": " << e.reason);
      REQUIRE(e.status == room_status::success);
    }
    for (size_t i = 0; i < d.size(); ++i) {
      INFO("decode rank " << i);
      CHECK(client::verify_room(*d[i], r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
    }
  }

  void run_many(const std::vector<room_spec>& rooms, std::vector<std::string> peers = {}) {
    for (const auto& r : rooms) stage(r, peers);
    for (const auto& r : rooms) {
      auto chunks = r.chunks.empty()
                        ? std::vector<uint32_t>{static_cast<uint32_t>(r.src_pages.size())}
                        : r.chunks;
      uint32_t pos = 0;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const bool last = i + 1 == chunks.size();
        std::vector<uint32_t> pages(r.src_pages.begin() + pos,
                                    r.src_pages.begin() + pos + chunks[i]);
        pos += chunks[i];
        for (auto& c : p) {
          std::vector<uint32_t> layers{0};  // a whole send: layer_count 0
          if (layer_wise) layers = c->layers();
          for (auto l = layers.rbegin(); l != layers.rend(); ++l) {
            auto ok = c->send({r.room, pages, last, last ? r.src_slot : no_index,
                               last ? r.src_row : no_index, *l, layer_wise ? 1u : 0u});
            INFO(ok.message);
            REQUIRE(ok);
          }
        }
      }
    }
    for (const auto& r : rooms) expect_success(r);
  }
  void run(const room_spec& r, std::vector<std::string> peers = {}) { run_many({r}, peers); }

  /// Bytes the daemons of one side copied into staging ("packed_bytes") or out of it
  /// ("unpacked_bytes") so far (status "staging").
  static uint64_t copied(const std::vector<std::unique_ptr<client::client>>& side,
                         const char* what) {
    uint64_t n = 0;
    for (const auto& c : side) n += status_of(*c)["staging"][what].get<uint64_t>();
    return n;
  }
};

std::vector<shape> ranks(shape s, uint32_t tp) {
  std::vector<shape> out;
  for (uint32_t r = 0; r < tp; ++r) {
    s.tp_size = tp;
    s.tp_rank = r;
    out.push_back(s);
  }
  return out;
}

/// A fragmented room of `pages` pages in three chunks.
room_spec fragmented_room(uint64_t id, uint32_t pages) {
  room_spec r;
  r.room = id;
  for (uint32_t i = 0; i < pages; ++i) {
    r.src_pages.push_back(100 + i + (i / 7) * 3);  // runs of 7, gaps of 3
    r.dst_pages.push_back(3000 - 2 * i);           // descending, never contiguous
  }
  r.chunks = {pages / 3, pages / 3, pages - 2 * (pages / 3)};
  r.src_slot = 1, r.dst_slot = 6;
  r.src_row = 2, r.dst_row = 9;
  return r;
}

shape small() {
  shape s;
  s.pages = 4096;
  s.kv_layers = 2;
  s.mamba_layers = 2;
  return s;
}

/// Two prefill PP stages (KV layers 3, 7 | 11, 15; state layers 0-2 | 8, 9) into one decode
/// that holds every layer.
cluster pp2_to_1() {
  shape stage0 = small(), stage1 = small(), whole = small();
  stage0.pp_size = stage1.pp_size = 2;
  stage1.pp_rank = 1;
  stage0.kv_layer_ids = {3, 7};
  stage0.mamba_layer_ids = {0, 1, 2};
  stage1.kv_layer_ids = {11, 15};
  stage1.mamba_layer_ids = {8, 9};
  whole.kv_layer_ids = {3, 7, 11, 15};
  whole.mamba_layer_ids = {0, 1, 2, 8, 9};
  return cluster({stage0, stage1}, {whole});
}

}  // namespace

TEST_CASE("TP 4 -> 2: each decode rank gathers from two prefill ranks, byte-exact",
          "[e2e][geometry]") {
  cluster c(ranks(small(), 4), ranks(small(), 2));
  room_spec r;
  r.room = 41;
  r.src_pages = range(10, 300);
  r.dst_pages = range(1000, 300);
  r.src_slot = 2, r.dst_slot = 3;
  r.src_row = 4, r.dst_row = 5;
  c.run(r);
  SECTION("fragmented pages in three chunks") {
    c.run(fragmented_room(42, 200));
    // Runs of 7 pages at the source, none at the decode: the KV-sending replicas gather them
    // into the decode ranks' staging, which scatter them on commit (core/pack.hpp).
    CHECK(c.copied(c.p, "packed_bytes") == 2 * 200 * 4 * 512);
    CHECK(c.copied(c.d, "unpacked_bytes") == 2 * 200 * 4 * 512);
  }
}

TEST_CASE(
    "checksums verify what landed under TP mismatch: packed at the prefill, unpacked at the "
    "decode, layer-wise",
    "[e2e][geometry][checksums]") {
  // Decodes with integrity.checksums: each prefill rank sends the digests of what it sent each
  // decode rank, and each decode rank reports Success only once what landed (after unpacking)
  // digests the same. expect_success also checks every byte.
  auto checked = small();
  checked.checksums = true;
  const auto [ps, pd] = GENERATE(std::pair{1u, 2u}, std::pair{2u, 1u}, std::pair{4u, 2u});
  CAPTURE(ps, pd);
  cluster c(ranks(small(), ps), ranks(checked, pd));
  c.run(fragmented_room(81, 120));
  SECTION("layer by layer") {
    c.layer_wise = true;
    c.run(fragmented_room(82, 60));
  }
}

TEST_CASE("TP 2 -> 1 with fragmented pages: slices gathered at each prefill rank, unpacked",
          "[e2e][geometry]") {
  cluster c(ranks(small(), 2), ranks(small(), 1));
  c.run(fragmented_room(71, 200));
  // Each prefill rank's head slice of every page, gathered into the decode's staging; the
  // decode unpacks both heads of every token.
  CHECK(c.copied(c.p, "packed_bytes") == 2 * 200 * 4 * 512);
  CHECK(c.copied(c.d, "unpacked_bytes") == 200 * 4 * 1024);
}

TEST_CASE("TP 1 -> 4 with 2 KV heads: decode ranks 0,1 get head 0 and 2,3 head 1, byte-exact",
          "[e2e][geometry]") {
  cluster c(ranks(small(), 1), ranks(small(), 4));
  c.run(fragmented_room(14, 256));
  // Each decode rank's slice packed at the prefill into its staging, scattered on commit.
  CHECK(c.copied(c.p, "packed_bytes") == 4 * 256 * 4 * 512);
  CHECK(c.copied(c.d, "unpacked_bytes") == 4 * 256 * 4 * 512);
  SECTION("without staging: one write per token, same bytes") {
    // A second instance with staging disabled on both sides exercises the direct path.
    auto s = small();
    s.staging_bytes = 0;
    cluster direct(ranks(s, 1), ranks(s, 2));
    direct.run(fragmented_room(15, 64));
  }
}

namespace {

/// A room of 24 pages, a slot and a row between every pair of TP 1, 2 and 4 of shape `s` (a
/// new cluster each), byte-exact; rooms numbered from `first_room` + 1.
void every_tp_pair_up_to_4(const shape& s, uint64_t first_room) {
  uint64_t id = first_room;
  for (uint32_t ps : {1u, 2u, 4u})
    for (uint32_t pd : {1u, 2u, 4u}) {
      INFO("prefill TP " << ps << " -> decode TP " << pd);
      cluster c(ranks(s, ps), ranks(s, pd));
      room_spec r;
      r.room = ++id;
      r.src_pages = range(10, 24);
      r.dst_pages = range(200, 24);
      r.src_slot = 1, r.dst_slot = 3;
      r.src_row = 4, r.dst_row = 5;
      c.run(r);
    }
}

}  // namespace

TEST_CASE(
    "Mamba2 with n_groups 1: B and C held whole on every rank reach every decode rank once, "
    "byte-exact, over every TP pair up to 4",
    "[e2e][geometry]") {
  // conv [x | B | C] = [512 | 16 | 16] in units [8 heads, 1, 1] (shard_units): every rank holds
  // the whole B and C. Every decode rank's conv must equal its own share of x plus the one B and
  // C (client::verify_room checks each channel against its global index), and no byte may be
  // written twice or missed (the property test proves that of the plans; this, of the daemons).
  shape s;
  s.pages = 512;
  s.kv_layers = 1;
  s.mamba_layers = 2;
  s.slots = 4;
  s.conv_dim = 512;
  s.temporal_dim = 16;
  s.conv_n_groups = 1;
  s.staging_bytes = 4ull << 20;
  every_tp_pair_up_to_4(s, 900);
}

TEST_CASE(
    "Kimi-Linear from the model catalogue: KDA's [K-1, q|k|v] conv and MLA KV, byte-exact, over "
    "every TP pair up to 4",
    "[e2e][geometry][catalogue]") {
  // The daemons' pools come from a config.json (model.config_json): layers 1-3 KDA, layer 4 MLA
  // (numbered from 1), 4 KDA heads of 8, so the fused conv is [3, 96 / TP] sliced on its second
  // axis with q, k and v each sliced on its own, the temporal state [4 / TP, 8, 8] fp32, and the
  // MLA KV one 24-element latent on every rank.
  temp_dir model_dir;
  const auto json = model_dir.path / "config.json";
  std::ofstream(json) << R"({"architectures": ["KimiLinearForCausalLM"], "torch_dtype": "bfloat16",
    "num_hidden_layers": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
    "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 4,
      "head_dim": 8, "short_conv_kernel_size": 4}})";
  shape s;
  s.model_yaml = "model:\n  config_json: " + json.string() + "\n  state_covers: n\n";
  s.pools_yaml =
      "pools:\n  kv: {page_tokens: 1, pages: 512}\n  mamba: {slots: 4}\n"
      "  aux: {rows: 64, row_bytes: 5632}\n";
  s.staging_bytes = 4ull << 20;
  every_tp_pair_up_to_4(s, 950);
}

TEST_CASE("the state contract: a decode never resumes from a state that means something else",
          "[e2e][geometry]") {
  // Both sides declare the model; the decode's engine counts N - 1 prompt tokens into its state
  // where the prefill's counts N. The handshake refuses the pair, naming the field; the same
  // declaration on both sides moves the room byte-exact.
  auto s = small();
  s.model_yaml =
      "model:\n  architecture: Qwen3NextForCausalLM\n  state_covers: n\n"
      "  fields: {linear_num_value_heads: 32, linear_conv_kernel_dim: 4}\n";
  auto other = s;
  other.model_yaml =
      "model:\n  architecture: Qwen3NextForCausalLM\n  state_covers: n_minus_1\n"
      "  fields: {linear_num_value_heads: 32, linear_conv_kernel_dim: 4}\n";
  room_spec r;
  r.room = 61;
  r.src_pages = range(10, 16);
  r.dst_pages = range(100, 16);
  r.src_slot = 1, r.dst_slot = 2;
  r.src_row = 3, r.dst_row = 4;
  SECTION("different contracts are refused at the handshake, named") {
    cluster c({s}, {other});
    c.stage(r);
    const auto failed = wait_done(*c.d[0], r.room);
    REQUIRE(failed.status == room_status::failed);
    CHECK(failed.code == errc::peer_incompatible);
    CHECK_THAT(failed.reason,
               Catch::Contains("model.state_covers differs: prefill has n, decode has n_minus_1"));
  }
  SECTION("a contract declared on one side only is refused too") {
    auto none = s;
    none.model_yaml.clear();
    cluster c({s}, {none});
    c.stage(r);
    const auto failed = wait_done(*c.d[0], r.room);
    REQUIRE(failed.status == room_status::failed);
    CHECK(failed.code == errc::peer_incompatible);
    CHECK_THAT(failed.reason, Catch::Contains("model differs: the prefill declares "
                                              "Qwen3NextForCausalLM (model section), the decode "
                                              "declares none"));
  }
  SECTION("the same contract on both sides moves the room byte-exact") {
    cluster c({s}, {s});
    c.run(r);
  }
}

TEST_CASE("PP 2 -> 1: layers paired by global id from both prefill stages, byte-exact",
          "[e2e][geometry]") {
  cluster c = pp2_to_1();
  c.run(fragmented_room(21, 150));

  SECTION("a decode layer no named stage holds fails the room, naming the layer") {
    auto ok = c.d[0]->prepare({22, {c.prefill[0]->control()}, {1}, 0, 0});
    REQUIRE(ok);
    auto e = wait_done(*c.d[0], 22);
    CHECK(e.status == room_status::failed);
    CHECK(e.reason ==
          "decode TP rank 0 of 1 needs prefill TP rank 0 of 1 in PP stage 1 of 2, but no usable "
          "named peer is that rank");
  }
}

TEST_CASE("a decode rank naming too few prefill ranks fails with the missing rank",
          "[e2e][geometry]") {
  cluster c(ranks(small(), 2), ranks(small(), 1));
  auto ok = c.d[0]->prepare({31, {c.prefill[0]->control()}, {1, 2}, 0, 0});
  REQUIRE(ok);
  auto e = wait_done(*c.d[0], 31);
  CHECK(e.status == room_status::failed);
  CHECK(
      e.reason ==
      "decode TP rank 0 of 1 needs prefill TP rank 1 of 2 in PP stage 0 of 1, but no usable named "
      "peer is that rank");
  // A peer that is not an address at all is refused at once, naming it.
  auto bad = c.d[0]->prepare({33, {c.prefill[0]->control(), "notanaddress"}, {1}, 0, 0});
  CHECK(bad.message ==
        "room 33: prefill peer 1 'notanaddress' is not host:port (a port in 1..65535)");
  // The daemons keep serving: the full set of peers works.
  c.run(fragmented_room(32, 60));
}

TEST_CASE("rooms larger than the staging area wait for it instead of failing", "[e2e][geometry]") {
  // 1 MiB of staging (the minimum). Packing (TP 1 -> 2) goes out in 128 KiB slices; landing
  // (TP 2 -> 1) needs one block per room, so concurrent rooms take turns.
  auto s = small();
  s.staging_bytes = 1 << 20;
  auto room = [](uint64_t id, uint32_t pages, uint32_t slot, uint32_t dst_first) {
    room_spec r;
    r.room = id;
    r.src_pages = range(slot * 1100, pages);  // disjoint sources: rooms are filled up front
    r.dst_pages = range(dst_first, pages);
    r.src_slot = r.dst_slot = r.src_row = r.dst_row = slot;
    return r;
  };
  SECTION("pack: 2 MiB of sliced KV per decode rank through 1 MiB") {
    cluster c(ranks(s, 1), ranks(s, 2));
    c.run_many({room(51, 1024, 1, 2000), room(52, 1024, 2, 3050)});
    const auto staging = status_of(*c.p[0])["staging"];
    CHECK(staging["in_use"] == 0);
    CHECK(staging["waits"] > 0);
  }
  SECTION("unpack: three rooms of 0.75 MiB each through 1 MiB") {
    cluster c(ranks(s, 2), ranks(s, 1));
    c.run_many({room(61, 192, 1, 2000), room(62, 192, 2, 2300), room(63, 192, 3, 2600)});
    const auto staging = status_of(*c.d[0])["staging"];
    CHECK(staging["in_use"] == 0);
    CHECK(staging["waits"] > 0);
  }
  SECTION("unpack: 30 rooms wait together and are woken as blocks free, in turn") {
    // Two 0.5 MiB blocks fit at once: the other rooms queue for staging and are woken in turn
    // (core/waiter_queue.hpp); a lost wake-up would leave a room to time out.
    s.slots = 32;
    s.conv_dim = 512;
    s.temporal_dim = 16;
    cluster c(ranks(s, 2), ranks(s, 1));
    std::vector<room_spec> rooms;
    for (uint32_t i = 0; i < 30; ++i) {
      room_spec r;
      r.room = 70 + i;
      r.src_pages = r.dst_pages = range(i * 128, 128);
      r.src_slot = r.dst_slot = r.src_row = r.dst_row = i;
      rooms.push_back(r);
    }
    c.run_many(rooms);
    const auto staging = status_of(*c.d[0])["staging"];
    CHECK(staging["in_use"] == 0);
    CHECK(staging["waits"] > 0);
  }
}

TEST_CASE(
    "a decode reserves staging when a room's writes start, and a room that waits for it says "
    "why",
    "[e2e][geometry]") {
  // TP 2 -> 1: each room's KV lands in one 0.75 MiB block of the decode's 1 MiB of staging.
  auto s = small();
  s.staging_bytes = 1 << 20;
  cluster c(ranks(s, 2), ranks(s, 1));
  auto room = [](uint64_t id, uint32_t slot, uint32_t dst_first) {
    room_spec r;
    r.room = id;
    r.src_pages = range(slot * 200, 192);
    r.dst_pages = range(dst_first, 192);
    r.src_slot = r.dst_slot = r.src_row = r.dst_row = slot;
    return r;
  };
  const auto a = room(81, 1, 2000), b = room(82, 2, 2300);
  auto& d = *c.d[0];
  c.stage(a);
  c.stage(b);
  // Both rooms are accepted and wait for their engine, holding no staging (at prepare, the
  // second would have waited in Bootstrapping for the first one's block).
  wait_status(d, a.room, room_status::waiting_for_input);
  wait_status(d, b.room, room_status::waiting_for_input);
  CHECK(status_of(d)["staging"]["in_use"] == 0);

  // Room 81's first half: its writes start, so its block is reserved.
  const std::vector<uint32_t> first(a.src_pages.begin(), a.src_pages.begin() + 96),
      rest(a.src_pages.begin() + 96, a.src_pages.end());
  for (auto& p : c.p) REQUIRE(p->send({a.room, first, false, no_index, no_index, 0, 0}));
  bool held = false;  // (nothing to wait on but the daemon's status: bounded, 10 s)
  for (int i = 0; i < 400 && !held; ++i) {
    held = status_of(d)["staging"]["in_use"].get<uint64_t>() > 0;
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  REQUIRE(held);

  // Room 82, whole: it queues for staging, still waiting for its first write, and its event
  // and poll say why.
  d.discard_events(b.room);
  REQUIRE(d.subscribe(b.room));
  for (auto& p : c.p) REQUIRE(p->send({b.room, b.src_pages, true, b.src_slot, b.src_row, 0, 0}));
  proto::event waiting;
  for (int i = 0; i < 10 && waiting.reason.empty(); ++i) {
    auto e = d.next_event(30s);
    REQUIRE(e);
    REQUIRE(e.value.status != room_status::failed);
    if (e.value.room == b.room) waiting = e.value;
  }
  CHECK(waiting.status == room_status::waiting_for_input);
  CHECK_THAT(waiting.reason, Catch::StartsWith("waiting for ") &&
                                 Catch::Contains(" bytes of staging (fabric.staging_bytes "
                                                 "1048576, ") &&
                                 Catch::EndsWith(" in use by other rooms)"));
  // Answered on the gateway's thread, from the status board, note and all.
  const auto at_once = status_of(d)["polls_answered_at_once"].get<uint64_t>();
  auto polled = d.poll(b.room);
  REQUIRE(polled);
  CHECK(status_of(d)["polls_answered_at_once"] == at_once + 1);
  CHECK(polled.value.status == room_status::waiting_for_input);
  CHECK(polled.value.reason == waiting.reason);

  // Room 81's rest: it commits and frees its block, which room 82 then gets.
  for (auto& p : c.p) REQUIRE(p->send({a.room, rest, true, a.src_slot, a.src_row, 0, 0}));
  c.expect_success(a);
  c.expect_success(b);
  const auto staging = status_of(d)["staging"];
  CHECK(staging["in_use"] == 0);
  CHECK(staging["waits"] > 0);
}

TEST_CASE(
    "with a prefill of peer protocol 9 the decode reserves staging at prepare, and the room is "
    "byte-exact",
    "[e2e][geometry]") {
  // A rolling upgrade: the new decode meets an old prefill, which reads its staging offset in
  // the prepare and knows no grant.
  auto old = ranks(small(), 2);
  for (auto& x : old) x.env.push_back({"FERRY_FAILPOINTS", "peer_protocol_9"});
  cluster c(old, ranks(small(), 1));
  room_spec r;
  r.room = 91;
  r.src_pages = range(0, 64);
  r.dst_pages = range(100, 64);
  auto& d = *c.d[0];
  c.stage(r);
  wait_status(d, r.room, room_status::waiting_for_input);
  CHECK(status_of(d)["staging"]["in_use"].get<uint64_t>() > 0);  // held since the prepare
  for (auto& p : c.p) REQUIRE(p->send({r.room, r.src_pages, true, r.src_slot, r.src_row, 0, 0}));
  c.expect_success(r);
  CHECK(status_of(d)["staging"]["in_use"] == 0);
  CHECK(cluster::copied(c.d, "unpacked_bytes") > 0);  // it did land in staging
}

TEST_CASE("a decode that checks refuses a prefill of an older peer protocol, naming the versions",
          "[e2e][geometry][checksums]") {
  // A prefill built before checksums could not send digests: the room fails before anything
  // is prepared, instead of waiting for digests that never come.
  auto old = ranks(small(), 1);
  old[0].env.push_back({"FERRY_FAILPOINTS", "peer_protocol_9"});
  auto decode = small();
  room_spec r;
  r.room = 95;
  r.src_pages = range(0, 8);
  r.dst_pages = range(100, 8);
  SECTION("the daemon checks every room (integrity.checksums)") { decode.checksums = true; }
  SECTION("the room asks for its check (prepare's checksum, protocol 10)") { r.checksum = true; }
  cluster c(old, ranks(decode, 1));
  c.stage(r);
  auto e = wait_done(*c.d[0], r.room);
  CHECK(e.status == room_status::failed);
  CHECK(e.code == errc::peer_incompatible);
  CHECK_THAT(e.reason, Catch::EndsWith("could not use peer " + c.prefill[0]->control() +
                                       ": a checked room needs peer protocol 11; it speaks 9"));
}

TEST_CASE("a named peer the geometry does not need may be unreachable", "[e2e][geometry]") {
  cluster c(ranks(small(), 2), ranks(small(), 2));
  const auto dead = "127.0.0.1:" + std::to_string(free_port());
  auto peers = c.prefill_controls();
  peers.push_back(dead);
  c.run(fragmented_room(71, 40), peers);  // each decode rank needs one prefill rank only

  SECTION("but a needed one fails the room, naming it") {
    // Depending on whether the decode has noticed the stop yet, the room fails at selection
    // ("needs prefill TP rank 1 ... (could not use peer ...)") or when the connection drops
    // ("peer ... lost"); both name the peer.
    c.prefill[1]->stop();
    REQUIRE(c.d[1]->prepare({72, c.prefill_controls(), {1}, 0, 0}));
    auto e = wait_done(*c.d[1], 72);
    CHECK(e.status == room_status::failed);
    CHECK_THAT(e.reason, Catch::Contains(c.prefill[1]->control()));
  }
}

TEST_CASE("decode ranks that prepare different page counts fail the room on every rank",
          "[e2e][geometry]") {
  cluster c(ranks(small(), 1), ranks(small(), 2));
  const auto peers = c.prefill_controls();
  REQUIRE(c.d[0]->prepare({81, peers, range(10, 64), 0, 0}));
  REQUIRE(c.d[1]->prepare({81, peers, range(10, 63), 0, 0}));
  for (auto* cl : {c.d[0].get(), c.d[1].get(), c.p[0].get()}) {
    auto e = wait_done(*cl, 81);
    CHECK(e.status == room_status::failed);
    CHECK_THAT(e.reason,
               Catch::Contains("room 81: decode ranks prepared different page counts: ") &&
                   Catch::Contains("prepared 64") && Catch::Contains("prepared 63"));
  }
  c.run(fragmented_room(82, 30));  // and the next room is fine
}

TEST_CASE("layer-wise sends under TP and PP mismatches land byte-exact", "[e2e][geometry]") {
  SECTION("TP 1 -> 2: packed head slices, one layer at a time") {
    cluster c(ranks(small(), 1), ranks(small(), 2));
    c.layer_wise = true;
    c.run(fragmented_room(51, 90));
  }
  SECTION("TP 2 -> 1: whole rows into the decode's staging, one layer at a time") {
    cluster c(ranks(small(), 2), ranks(small(), 1));
    c.layer_wise = true;
    c.run(fragmented_room(52, 90));
  }
  SECTION("PP 2 -> 1: each stage sends its own layers") {
    cluster c = pp2_to_1();
    c.layer_wise = true;
    c.run(fragmented_room(53, 90));
    // A stage refuses a layer it does not hold.
    auto e = c.p[1]->send({54, {1}, false, no_index, no_index, 3, 1});
    CHECK(e.message == "room 54: layers [3, 4) reach outside this rank's layers 8..15");
  }
}
