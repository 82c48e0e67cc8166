// The peer channel's frames (core/peer_wire.hpp) without sockets: every message round-trips,
// and every frame that was forged, replayed, reordered, reflected, truncated or inflated is
// refused before its body is decoded, with a reason that names what is wrong.

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "core/peer_wire.hpp"

using namespace ferry;
using namespace ferry::peer_wire;

namespace {

const link_keys keys_a = derive_keys("a secret of the cluster", "a secret of the cluster",
                                     bytes(32, 1), bytes(32, 2), true);
const link_keys keys_c = derive_keys("a secret of the cluster", "a secret of the cluster",
                                     bytes(32, 1), bytes(32, 2), false);

/// One message of every kind, each field set to something other than its default.
std::vector<message> every_message() {
  peer_hello h;
  h.version = 9;
  h.min_version = 5;
  h.node = "decode-0";
  h.instance = "0a1b";
  h.role = "decode";
  h.tp_size = 4, h.tp_rank = 3, h.pp_size = 2, h.pp_rank = 1;
  h.config_yaml = "node_name: decode-0\n";
  h.compat_hash = 0x0123456789abcdefull;
  h.fabric_address = {1, 2, 3, 4};
  h.regions = {{true, 10, 11, 12}, {false, 0, 0, 0}, {true, 20, 21, 22}};
  h.staging = {true, 30, 31, 32};
  h.nonce = bytes(32, 7);
  h.proof = bytes(32, 8);
  peer_prepare p{5, 6, {1, 2, 3}, 4, 5, 4096, 17};
  return {h,
          peer_auth{bytes(32, 9)},
          peer_refused{"no"},
          p,
          peer_prepare_paged{p, {9, 8, 7}},
          peer_prepare_ack{5, 6, false, "refused", 406},
          peer_announce{5, 6, 29, 1 << 20},
          peer_outcome{5, 6, true, false, "cancelled", 402},
          peer_drained{5, 6, 3, 1},
          peer_leaving{"stopping"},
          peer_leaving_ack{},
          peer_rails{{{{1, 2}, false}, {{3}, true}}},
          peer_heartbeat{},
          peer_staging_request{5, 6},
          peer_staging_grant{5, 6, 8192},
          peer_prepare_checked{p, {4, 2}},
          peer_announce_checked{{5, 6, 29, 1 << 20}, {0x0123456789abcdefull, 7, 0}}};
}

/// Feed `bytes` to `r` and take every message out.
std::vector<message> read_all(frame_reader& r, const std::vector<uint8_t>& bytes,
                              std::string& error, size_t slice = 0) {
  std::vector<message> out;
  size_t pos = 0;
  do {
    const size_t n = slice ? std::min(slice, bytes.size() - pos) : bytes.size() - pos;
    r.feed(bytes.data() + pos, n);
    pos += n;
    message m;
    for (;;) {
      const auto k = r.next(m, error);
      if (k != frame_reader::result_kind::message) break;
      out.push_back(std::move(m));
    }
  } while (pos < bytes.size() && error.empty());
  return out;
}

std::vector<uint8_t> seal_all(frame_writer& w, const std::vector<message>& ms) {
  std::vector<uint8_t> out;
  for (const auto& m : ms) w.seal(m, out);
  return out;
}

}  // namespace

TEST_CASE("every peer message round-trips through a frame, whole or a byte at a time",
          "[peer_wire]") {
  const auto ms = every_message();
  REQUIRE(ms.size() == max_kind);
  for (size_t slice : {size_t{0}, size_t{1}, size_t{7}}) {
    INFO("slice " << slice);
    frame_writer w(keys_c.send);
    frame_reader r(keys_a.recv);
    std::string error;
    auto got = read_all(r, seal_all(w, ms), error, slice);
    CHECK(error == "");
    REQUIRE(got.size() == ms.size());
    for (size_t i = 0; i < ms.size(); ++i) {
      INFO(name(kind_of(ms[i])));
      CHECK(got[i].index() == ms[i].index());
      CHECK(encode_body(got[i]) == encode_body(ms[i]));
    }
    CHECK(r.buffered() == 0);
  }
  // The hello's fields land where they were.
  frame_writer w(keys_c.send);
  frame_reader r(keys_a.recv);
  std::string error;
  auto got = read_all(r, seal_all(w, {ms[0]}), error);
  REQUIRE(got.size() == 1);
  const auto& h = std::get<peer_hello>(got[0]);
  CHECK(h.node == "decode-0");
  CHECK(h.tp_rank == 3);
  CHECK(h.compat_hash == 0x0123456789abcdefull);
  CHECK(h.regions.size() == 3);
  CHECK(h.regions[2].key == 21);
  CHECK(h.staging.length == 32);
}

TEST_CASE("a page list of megabytes fits one frame, and a list beyond the bound is refused",
          "[peer_wire]") {
  peer_prepare p;
  p.room = 1;
  p.dst_pages.resize(1u << 20);  // 4 MiB of page indices
  for (uint32_t i = 0; i < p.dst_pages.size(); ++i) p.dst_pages[i] = i * 3;
  frame_writer w(keys_c.send);
  frame_reader r(keys_a.recv);
  std::string error;
  auto got = read_all(r, seal_all(w, {p}), error, 65536);
  CHECK(error == "");
  REQUIRE(got.size() == 1);
  CHECK(std::get<peer_prepare>(got[0]).dst_pages == p.dst_pages);

  // A header claiming more than a prepare may hold is refused from the header alone.
  std::vector<uint8_t> header(header_bytes, 0);
  const uint32_t huge = max_list_body + 1;
  for (int i = 0; i < 4; ++i) header[size_t(i)] = uint8_t(huge >> (8 * i));
  header[4] = static_cast<uint8_t>(kind::prepare);
  frame_reader r2(keys_a.recv);
  r2.feed(header.data(), header.size());
  message m;
  CHECK(r2.next(m, error) == frame_reader::result_kind::failed);
  CHECK(error == "peer frame peer_prepare claims a body of " + std::to_string(huge) +
                     " bytes, above its limit of " + std::to_string(max_list_body));
}

TEST_CASE("an announcement with as many digests as a link may have fits one frame", "[peer_wire]") {
  peer_announce_checked a{{1, 2, 3, 4}, std::vector<uint64_t>(max_room_digests)};
  for (uint32_t i = 0; i < max_room_digests; ++i) a.digests[i] = 0x9e3779b97f4a7c15ull * i;
  frame_writer w(keys_c.send);
  frame_reader r(keys_a.recv);
  std::string error;
  auto got = read_all(r, seal_all(w, {a}), error);
  CHECK(error == "");
  REQUIRE(got.size() == 1);
  CHECK(std::get<peer_announce_checked>(got[0]).digests == a.digests);
}

TEST_CASE("a 4 GiB length, an unknown kind and nonzero flags are refused from the header",
          "[peer_wire]") {
  auto refuse = [](std::vector<uint8_t> header) {
    frame_reader r(keys_a.recv);
    r.feed(header.data(), header.size());
    message m;
    std::string error;
    CHECK(r.next(m, error) == frame_reader::result_kind::failed);
    // And stays refused: a failed stream never yields a message again.
    CHECK(r.next(m, error) == frame_reader::result_kind::failed);
    return error;
  };
  std::vector<uint8_t> h(header_bytes, 0);
  h[0] = h[1] = h[2] = h[3] = 0xff;
  h[4] = static_cast<uint8_t>(kind::heartbeat);
  CHECK(refuse(h) ==
        "peer frame peer_heartbeat claims a body of 4294967295 bytes, above its limit of 0");
  h.assign(header_bytes, 0);
  h[4] = 99;
  CHECK(refuse(h) == "peer frame of unknown kind 99");
  h[4] = 0;
  CHECK(refuse(h) == "peer frame of unknown kind 0");
  h[4] = static_cast<uint8_t>(kind::outcome);
  h[5] = 1;
  CHECK(refuse(h) == "peer frame peer_outcome has nonzero flags or reserved bytes");
}

TEST_CASE("a forged, corrupted, reflected or foreign-keyed frame fails its MAC", "[peer_wire]") {
  const peer_wire::message m = peer_outcome{5, 6, true, true, "", 0};
  frame_writer w(keys_c.send);
  std::vector<uint8_t> f;
  w.seal(m, f);
  auto fails = [](const link_keys& k, const std::vector<uint8_t>& bytes) {
    frame_reader r(k.recv);
    std::string error;
    auto got = read_all(r, bytes, error);
    CHECK(got.empty());
    return error;
  };
  const std::string mac = "peer frame peer_outcome failed its MAC check";
  // Every single bit flipped in the body or the MAC (the header's are refused by its checks or
  // by the MAC, never decoded).
  for (size_t i = header_bytes; i < f.size(); ++i) {
    auto g = f;
    g[i] ^= 0x10;
    CHECK_THAT(fails(keys_a, g), Catch::StartsWith(mac));
  }
  auto seq = f;
  seq[8] ^= 1;  // the sequence is under the MAC too
  CHECK_THAT(fails(keys_a, seq), Catch::StartsWith(mac));
  // Reflected: the connecting side's own frame sent back to it.
  CHECK_THAT(fails(keys_c, f), Catch::StartsWith(mac));
  // Another link's keys (other nonces), or another cluster's secret.
  CHECK_THAT(fails(derive_keys("a secret of the cluster", "a secret of the cluster", bytes(32, 1),
                               bytes(32, 3), true),
                   f),
             Catch::StartsWith(mac));
  CHECK_THAT(fails(derive_keys("another cluster's secret", "another cluster's secret", bytes(32, 1),
                               bytes(32, 2), true),
                   f),
             Catch::StartsWith(mac));
}

TEST_CASE("a replayed or reordered frame is refused by its sequence number", "[peer_wire]") {
  frame_writer w(keys_c.send);
  std::vector<uint8_t> f0, f1;
  w.seal(peer_heartbeat{}, f0);
  w.seal(peer_leaving{"x"}, f1);
  {
    frame_reader r(keys_a.recv);
    std::string error;
    auto both = f0;
    both.insert(both.end(), f0.begin(), f0.end());  // replayed
    auto got = read_all(r, both, error);
    CHECK(got.size() == 1);
    CHECK(error ==
          "peer frame peer_heartbeat carries sequence 0, expected 1 (replayed or "
          "reordered)");
  }
  {
    frame_reader r(keys_a.recv);
    std::string error;
    auto got = read_all(r, f1, error);  // the second frame first
    CHECK(got.empty());
    CHECK(error ==
          "peer frame peer_leaving carries sequence 1, expected 0 (replayed or "
          "reordered)");
  }
}

TEST_CASE("a body is decoded bounds-checked and must be consumed exactly", "[peer_wire]") {
  auto body = encode_body(peer_prepare_ack{1, 2, true, "", 0});
  auto truncated = body;
  truncated.pop_back();
  auto r = decode_body(kind::prepare_ack, truncated);
  CHECK_FALSE(r);
  CHECK(r.message == "peer message peer_prepare_ack: field 'code' needs 2 bytes, 1 left");
  auto longer = body;
  longer.push_back(0);
  r = decode_body(kind::prepare_ack, longer);
  CHECK(r.message == "peer message peer_prepare_ack: 1 trailing bytes after the last field");
  auto not_bool = body;
  not_bool[16] = 2;
  r = decode_body(kind::prepare_ack, not_bool);
  CHECK(r.message == "peer message peer_prepare_ack: field 'ok' must be 0 or 1, got 2");
  // A list count the body cannot hold is refused before anything is allocated.
  auto prep = encode_body(peer_prepare{});
  prep[16] = prep[17] = prep[18] = prep[19] = 0xff;
  r = decode_body(kind::prepare, prep);
  CHECK_THAT(r.message, Catch::StartsWith("peer message peer_prepare: field 'dst_pages' has "
                                          "4294967295 entries, above the limit of"));
  // One entry more than the rest of the body holds (the bound is what follows the count).
  auto one_more = encode_body(peer_prepare{5, 6, {1, 2}, 3, 4, 7, 8});
  one_more[16] = 8;  // 2 pages, then 4 + 4 + 8 + 4 bytes: 28 bytes, 7 entries would fit
  r = decode_body(kind::prepare, one_more);
  CHECK(r.message ==
        "peer message peer_prepare: field 'dst_pages' has 8 entries, above the limit of 7");
  one_more[16] = 7;  // fits: then the fields after it are missing
  r = decode_body(kind::prepare, one_more);
  CHECK(r.message == "peer message peer_prepare: field 'dst_state_slot' needs 4 bytes, 0 left");
  // Too many digests for the bound, or more than the body holds.
  auto digests = encode_body(peer_announce_checked{{1, 2, 3, 4}, {5}});
  digests[32] = 0x01, digests[33] = 0x40;  // 16385
  r = decode_body(kind::announce_checked, digests);
  CHECK(r.message ==
        "peer message peer_announce_checked: field 'digests' has 16385 entries, above the limit "
        "of 16384");
  digests[32] = 2, digests[33] = 0;
  r = decode_body(kind::announce_checked, digests);
  CHECK(r.message == "peer message peer_announce_checked: field 'digests' needs 16 bytes, 8 left");
  // Too many rails, too long a reason.
  auto rails = encode_body(peer_rails{});
  rails[0] = 65;
  r = decode_body(kind::rails, rails);
  CHECK(r.message ==
        "peer message peer_rails: field 'rails' has 65 entries, above the limit of 64");
  std::vector<uint8_t> reason = {0, 0, 2, 0};  // 128 KiB
  r = decode_body(kind::refused, reason);
  CHECK(r.message ==
        "peer message peer_refused: field 'reason' has 131072 bytes, above the limit of 65536");
}

TEST_CASE("without a secret both sides still derive mirrored keys, per link", "[peer_wire]") {
  const auto a = derive_keys("", "", bytes(32, 1), bytes(32, 2), true);
  const auto c = derive_keys("", "", bytes(32, 1), bytes(32, 2), false);
  CHECK(a.send == c.recv);
  CHECK(a.recv == c.send);
  const auto other = derive_keys("", "", bytes(32, 4), bytes(32, 2), true);
  CHECK(other.send != a.send);
  // With a secret the keys differ from those without: the secret is in them.
  CHECK(keys_a.send != a.send);
}

TEST_CASE("a link awaiting its first message refuses any kind but a hello from the header",
          "[peer_wire]") {
  frame_writer w(keys_c.send);
  std::vector<uint8_t> f;
  peer_prepare p;
  p.dst_pages.resize(1u << 20);  // 4 MiB that must never be awaited
  w.seal(p, f);
  frame_reader r(keys_a.recv);
  r.only(kind::hello);
  r.feed(f.data(), header_bytes);  // the header alone
  message m;
  std::string error;
  CHECK(r.next(m, error) == frame_reader::result_kind::failed);
  CHECK(error == "peer frame peer_prepare where only peer_hello may come");
  // A hello passes, and once the restriction is lifted every kind does.
  frame_writer w2(keys_c.send);
  std::vector<uint8_t> g;
  w2.seal(peer_hello{}, g);
  w2.seal(peer_heartbeat{}, g);
  frame_reader r2(keys_a.recv);
  r2.only(kind::hello);
  r2.feed(g.data(), g.size());
  CHECK(r2.next(m, error) == frame_reader::result_kind::message);
  r2.only(std::nullopt);
  CHECK(r2.next(m, error) == frame_reader::result_kind::message);
  CHECK(std::holds_alternative<peer_heartbeat>(m));
}

TEST_CASE("a reason longer than a reader takes arrives shortened, not refused", "[peer_wire]") {
  frame_writer w(keys_c.send);
  std::vector<uint8_t> f;
  w.seal(peer_refused{std::string(100000, 'x')}, f);
  frame_reader r(keys_a.recv);
  std::string error;
  auto got = read_all(r, f, error);
  CHECK(error == "");
  REQUIRE(got.size() == 1);
  CHECK(std::get<peer_refused>(got[0]).reason == std::string(max_text_bytes, 'x'));
}

TEST_CASE("every peer kind has the name, body limit and first version wire.yaml gives it",
          "[peer_wire]") {
  // Generated from src/core/wire.yaml (scripts/gen_wire.py): these pin what the daemon relies on.
  CHECK(std::string(name(kind::hello)) == "peer_hello");
  CHECK(std::string(name(kind::announce_checked)) == "peer_announce_checked");
  CHECK(std::string(name(static_cast<kind>(max_kind + 1))) == "unknown");
  CHECK(max_body(kind::hello) == max_hello_body);
  CHECK(max_body(kind::prepare) == max_list_body);
  CHECK(max_body(kind::heartbeat) == 0);
  CHECK(max_body(kind::leaving_ack) == 0);
  CHECK(max_body(kind::outcome) == max_small_body);
  CHECK(max_body(kind::announce_checked) == 32 + 4 + 8 * max_room_digests);
  CHECK(first_version(kind::hello) == peer_protocol_min_version);
  CHECK(first_version(kind::prepare_paged) == peer_paged_state_version);
  CHECK(first_version(kind::leaving) == peer_leaving_version);
  CHECK(first_version(kind::leaving_ack) == peer_leaving_ack_version);
  CHECK(first_version(kind::rails) == peer_rails_version);
  CHECK(first_version(kind::staging_grant) == peer_late_staging_version);
  CHECK(first_version(kind::prepare_checked) == peer_checksums_version);
  // Every kind 1..max_kind names a message, and its alternative's index is the kind minus one.
  for (uint8_t k = 1; k <= max_kind; ++k)
    CHECK(std::string(name(static_cast<kind>(k))) != "unknown");
  std::set<kind> seen;
  for (const auto& m : every_message()) {
    const auto decoded = decode_body(kind_of(m), encode_body(m));
    REQUIRE(decoded);
    CHECK(decoded.value.index() == m.index());
    seen.insert(kind_of(m));
  }
  CHECK(seen.size() == max_kind);
}
