// How a daemon judges a peer's hello and its fabric endpoints (core/peer_checks.hpp): a valid
// hello gives the pair's version, layout and link plan; each refusal names the first problem.
#include <fmt/format.h>

#include <catch2/catch.hpp>

#include "config_yaml.hpp"
#include "core/peer_checks.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

ferry_config with_role(const std::string& role) {
  return parse_ok(base_yaml + "role: " + role + "\n");
}

/// The hello a valid prefill `cfg` sends: its config for peers, its hash, one region per pool
/// as long as its layout, a fabric address.
peer_hello hello_of(const ferry_config& cfg) {
  peer_hello h;
  h.node = cfg.node_name;
  h.instance = "i1";
  h.role = to_string(cfg.role);
  h.tp_size = cfg.tp.size;
  h.tp_rank = cfg.tp.rank;
  h.config_yaml = to_yaml(cfg, yaml_for::peers);
  h.compat_hash = compatibility_hash(cfg.pools);
  const auto layout = make_layout(cfg.pools);
  for (const auto& p : layout.pools) h.regions.push_back({p.present, 0x1000, 7, p.total_bytes});
  h.fabric_address = {1, 2, 3};
  return h;
}

std::string refused(const ferry_config& mine, const peer_hello& h, uint32_t spoken = 11) {
  const auto r = check_peer_hello(mine, h, true, spoken);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::peer_incompatible);
  return r.message;
}

}  // namespace

TEST_CASE("a decode takes a valid prefill's hello: the pair's version, layout and plan",
          "[unit][peer_checks]") {
  const auto decode = with_role("decode"), prefill = with_role("prefill");
  auto h = hello_of(prefill);
  h.version = 9;
  const auto r = check_peer_hello(decode, h, true, 11);
  INFO(r.message);
  REQUIRE(r);
  CHECK(r.value.node == "n0");
  CHECK(r.value.version == 9);  // the highest both speak
  CHECK(r.value.pools.kv->kv_heads == 2);
  CHECK(r.value.layout.pools[0].total_bytes == h.regions[0].length);
  REQUIRE(r.value.link);
  CHECK(r.value.link->kv == kv_mode::whole_pages);
  CHECK(r.value.regions.size() == h.regions.size());
}

TEST_CASE("a peer's hello is refused naming its first problem", "[unit][peer_checks]") {
  const auto decode = with_role("decode"), prefill = with_role("prefill");
  const auto good = hello_of(prefill);
  auto h = good;

  SECTION("protocol versions that do not meet") {
    h.version = 4;
    h.min_version = 4;
    CHECK(refused(decode, h) == "peer speaks protocol versions 4..4, this daemon speaks 5..11");
    h = good;
    h.min_version = 12;
    h.version = 12;
    CHECK(refused(decode, h, 11) ==
          "peer speaks protocol versions 12..12, this daemon speaks 5..11");
  }
  SECTION("roles: a decode takes prefills, a prefill takes decodes") {
    h.role = "decode";
    CHECK(refused(decode, h) == "peer n0 has role decode; a prepare must name a prefill daemon");
    const auto r = check_peer_hello(prefill, good, false, 11);
    REQUIRE_FALSE(r);
    CHECK(r.message ==
          "peer n0 has role prefill; only a decode daemon may connect to send prepares");
  }
  SECTION("a config that does not parse or does not validate") {
    h.config_yaml = "node: [";
    CHECK_THAT(refused(decode, h), Catch::StartsWith("peer config could not be read: "));
    h.config_yaml = replace(good.config_yaml, "    pages: 16\n", "    pages: 0\n");
    CHECK_THAT(refused(decode, h), Catch::StartsWith("peer config is invalid: pools.kv.pages"));
  }
  SECTION("a hash, a position or regions that do not match its own config") {
    h.compat_hash ^= 1;
    CHECK(refused(decode, h) ==
          "peer compatibility hash does not match its own layout (corrupted handshake)");
    h = good;
    h.tp_rank = 1;
    CHECK(refused(decode, h) ==
          "peer declared a TP/PP position that differs from its config (corrupted handshake)");
    h = good;
    h.regions.pop_back();
    CHECK(refused(decode, h) == "peer sent 2 memory regions, expected 3");
    h = good;
    h.regions[0].length -= 1;
    CHECK(refused(decode, h) ==
          fmt::format("peer region for pool kv is {} bytes but its layout needs {}",
                      good.regions[0].length - 1, good.regions[0].length));
    h = good;
    h.fabric_address.clear();
    CHECK(refused(decode, h) == "peer sent an empty fabric address");
  }
  SECTION("layouts the planner cannot pair are named with both positions") {
    auto other = with_role("prefill");
    other.pools.kv->head_dim = 128;
    h = hello_of(other);
    CHECK_THAT(refused(decode, h), Catch::StartsWith("incompatible layouts: "));
  }
}

TEST_CASE("a peer's fabric endpoints: one to 64, addressed, the first bulk, one express at most",
          "[unit][peer_checks]") {
  auto rail = [](bool express, size_t bytes = 8) {
    return peer_rail_desc{std::vector<uint8_t>(bytes, 1), express};
  };
  peer_rails m;
  m.rails = {rail(false), rail(true), rail(false)};
  const auto ok = check_peer_rails(m);
  REQUIRE(ok);
  CHECK(ok.value.size() == 3);
  CHECK(ok.value[1].express);
  auto refused_rails = [](const peer_rails& r) {
    const auto e = check_peer_rails(r);
    REQUIRE_FALSE(e);
    CHECK(e.code == errc::peer_incompatible);
    return e.message;
  };
  const std::string head = "peer listed its fabric endpoints wrongly: ";
  CHECK(refused_rails(peer_rails{}) == head + "expected 1 to 64 endpoints, got 0");
  CHECK(refused_rails(peer_rails{{rail(true)}}) ==
        head + "endpoint 0 (its hello's) is an express endpoint");
  CHECK(refused_rails(peer_rails{{rail(false), rail(true), rail(true)}}) ==
        head + "more than one express endpoint");
  CHECK(refused_rails(peer_rails{{rail(false), rail(false, 0)}}) ==
        head + "endpoint 1 has an address of 0 bytes, expected 1 to 4096");
  CHECK(refused_rails(peer_rails{{rail(false, 4097)}}) ==
        head + "endpoint 0 has an address of 4097 bytes, expected 1 to 4096");
}

TEST_CASE("a decode rank's prepare names indices inside the pools it declared, one state slot",
          "[unit][peer_checks]") {
  const auto decode = with_role("decode"), prefill = with_role("prefill");
  const auto mine = make_layout(prefill.pools), theirs = make_layout(decode.pools);
  const auto link = make_link_plan(schema_of(prefill), schema_of(decode)).value;
  checked_peer from;  // what the decode rank's hello said
  from.layout = theirs;
  from.link = std::make_shared<link_plan>(link);
  from.version = 11;
  from.staging = {true, 0x1000, 7, 1u << 20};
  peer_prepare p;
  p.room = 7;
  p.dst_pages = {0, 1};
  p.dst_state_slot = 2;
  p.dst_aux_row = 3;
  auto refusal = [&](const peer_prepare& q, const std::vector<uint32_t>& state_pages = {}) {
    const auto r = check_prepare_indices(prefill.pools, mine, from, q, state_pages);
    REQUIRE_FALSE(r);
    CHECK(r.code == errc::invalid_request);
    return r.message;
  };
  CHECK(check_prepare_indices(prefill.pools, mine, from, p, {}));
  auto q = p;
  q.dst_pages = {0, 16};
  CHECK(refusal(q) == "room 7: decode dst page 16 (position 1) is outside the pool of 16 pages");
  q = p;
  q.dst_state_slot = 4;
  CHECK(refusal(q) == "room 7: decode dst state slot 4 is outside its mamba pool");
  q = p;
  q.dst_aux_row = 8;
  CHECK(refusal(q) == "room 7: decode dst aux row 8 is outside its aux pool");
  q = p;
  q.dst_state_slot = no_index;  // SGLang's batched or cancelled state index, refused by name
  CHECK(refusal(q) == "mamba requires single state index: room 7 got dst=none from the decode");
  CHECK(refusal(p, {1, 2}) ==
        "room 7: the decode named 2 state pages; this daemon's state pool takes one slot");
  q = p;
  q.dst_aux_row = no_index;
  CHECK(refusal(q) == "room 7: the decode named no aux row");

  SECTION("a staging offset lies inside the decode's staging region, or is granted later") {
    const uint64_t need = link.landing_bytes(2);
    REQUIRE(need > 0);
    CHECK(check_staging_offset(from, 7, (1u << 20) - need, 2));
    CHECK(check_staging_offset(from, 7, staging_on_request, 2));
    auto r = check_staging_offset(from, 7, (1u << 20) - need + 1, 2);
    REQUIRE_FALSE(r);
    CHECK(r.message == fmt::format("room 7: staging offset {} ({} bytes) is outside the decode's "
                                   "staging region of 1048576 bytes",
                                   (1u << 20) - need + 1, need));
    auto older = from;
    older.version = 9;
    r = check_staging_offset(older, 7, staging_on_request, 2);
    REQUIRE_FALSE(r);
    CHECK(r.message ==
          "room 7: the decode's prepare says it grants staging later, but this link "
          "speaks peer protocol 9 (grants need 10)");
  }
}

TEST_CASE(
    "the cluster secret: a challenge where we hold one, none where we do not, and a proof "
    "one of our secrets made",
    "[unit][peer_checks]") {
  peer_hello h;
  h.node = "p0";
  h.instance = "i1";
  CHECK(check_peer_challenge(false, h));
  const auto no_challenge = check_peer_challenge(true, h);
  REQUIRE_FALSE(no_challenge);
  CHECK(no_challenge.code == errc::peer_incompatible);
  CHECK(no_challenge.message ==
        "this daemon requires peers to prove the cluster secret, and the peer offered no "
        "challenge (set security.cluster_secret_file on both sides)");
  h.nonce = bytes(auth_nonce_bytes - 1, 5);
  CHECK_FALSE(check_peer_challenge(true, h));
  h.nonce = bytes(auth_nonce_bytes, 5);
  CHECK(check_peer_challenge(true, h));
  CHECK(check_peer_challenge(false, h).message ==
        "the peer requires a cluster secret but this daemon has none (set "
        "security.cluster_secret_file on both sides)");

  const bytes ours(auth_nonce_bytes, 9);
  const cluster_secrets secrets("the new cluster secret", "the old cluster secret");
  CHECK(check_peer_proof(secrets, ours, h).message ==
        "peer p0/i1 did not prove the cluster secret (is its security.cluster_secret_file set?)");
  h.proof = auth_proof("the old cluster secret", "ferry-accept", ours, h.nonce, "p0/i1");
  const auto old = check_peer_proof(secrets, ours, h);
  REQUIRE(old);
  CHECK(old.value == 1);  // proved with the secret being rotated out
  h.proof = auth_proof("another cluster secret", "ferry-accept", ours, h.nonce, "p0/i1");
  CHECK(check_peer_proof(secrets, ours, h).message ==
        "peer p0/i1 failed the cluster-secret challenge (different secrets?)");
  h.proof = auth_proof("the new cluster secret", "ferry-connect", ours, h.nonce, "p0/i1");
  CHECK_FALSE(check_peer_proof(secrets, ours, h));  // a proof for the other direction
}
