#include <catch2/catch.hpp>

#include "core/errors.hpp"
#include "core/pattern.hpp"
#include "core/protocol.hpp"

using namespace ferry;
using namespace ferry::proto;

namespace {
decoded roundtrip(const message& m, uint32_t seq = 7) {
  auto bytes = encode(m, seq);
  frame_reader r;
  r.feed(bytes);
  auto d = r.next();
  REQUIRE(d);
  REQUIRE(r.buffered() == 0);
  return *d;
}
}  // namespace

TEST_CASE("every message round-trips", "[unit][protocol]") {
  prepare p{42, {"127.0.0.1:7401", "127.0.0.1:7411"}, {7, 8, 9}, 3, 5};
  auto d = roundtrip(p);
  REQUIRE(d.error.empty());
  CHECK(d.seq == 7);
  auto q = std::get<prepare>(*d.msg);
  CHECK(q.room == 42);
  CHECK(q.prefill_peers == std::vector<std::string>{"127.0.0.1:7401", "127.0.0.1:7411"});
  CHECK(q.dst_pages == std::vector<uint32_t>{7, 8, 9});
  CHECK(q.state_slot == 3);
  CHECK(q.aux_row == 5);

  send s{42, {1, 2}, true, 0, 1, 12, 3};
  auto sd = std::get<send>(*roundtrip(s).msg);
  CHECK(sd.last);
  CHECK(sd.src_pages == std::vector<uint32_t>{1, 2});
  CHECK(sd.first_layer == 12);
  CHECK(sd.layer_count == 3);

  hello_reply h;
  h.node = "decode-0";
  h.pools[1].present = true;
  h.pools[1].shm_name = "/ferry.x.state";
  h.pools[1].layout.buffers.push_back({4096, 49152, 8, 5, 1, buffer_kind::state});
  auto hd = std::get<hello_reply>(*roundtrip(h).msg);
  CHECK(hd.node == "decode-0");
  CHECK(hd.pools[1].layout.buffers.at(0).item_bytes == 49152);
  CHECK(hd.pools[1].layout.buffers.at(0).kind == buffer_kind::state);

  auto ev = std::get<event>(*roundtrip(event{9, room_status::success, ""}, 0).msg);
  CHECK(ev.status == room_status::success);
  auto er = std::get<error>(*roundtrip(error{errc::unknown_room, "no room 9"}).msg);
  CHECK(er.code == errc::unknown_room);
  CHECK(er.message == "no room 9");
}

TEST_CASE("frames split across reads are reassembled", "[unit][protocol]") {
  auto a = encode(poll{1}, 1);
  auto b = encode(poll{2}, 2);
  std::vector<uint8_t> all(a);
  all.insert(all.end(), b.begin(), b.end());
  frame_reader r;
  for (size_t i = 0; i < all.size(); ++i) {
    r.feed(std::span<const uint8_t>(&all[i], 1));
  }
  CHECK(std::get<poll>(*r.next()->msg).room == 1);
  CHECK(std::get<poll>(*r.next()->msg).room == 2);
  CHECK_FALSE(r.next());
}

TEST_CASE("a second state slot in a send frame is rejected, not read as a list",
          "[unit][protocol]") {
  auto bytes = encode(send{5, {}, true, 1, 0}, 3);
  // Append a second u32 "slot" to the body and fix the length: what a batched caller would send.
  for (int i = 0; i < 4; ++i) bytes.push_back(2);
  uint32_t len = static_cast<uint32_t>(bytes.size() - 4);
  std::memcpy(bytes.data(), &len, 4);
  frame_reader r;
  r.feed(bytes);
  auto d = r.next();
  REQUIRE(d);
  CHECK_FALSE(d->msg);
  CHECK(d->code == errc::malformed_frame);
  CHECK(d->error == "malformed send frame: 4 unexpected bytes after the last field");
}

TEST_CASE("a send's layer range is on the wire from version 6 on", "[unit][protocol]") {
  const send s{42, {1, 2}, false, no_index, no_index, 8, 4};
  auto v6 = encode(s, 3, 6);
  auto v5 = encode(s, 3, 5);
  CHECK(v6.size() == v5.size() + 8);
  // A v5 connection cannot carry the range: it decodes as a whole send.
  auto d5 = decode(3, 3, std::span<const uint8_t>(v5).subspan(12), 5);
  REQUIRE(d5.msg);
  CHECK(std::get<send>(*d5.msg).layer_count == 0);
  CHECK(std::get<send>(*d5.msg).first_layer == 0);
  // A v5 frame read as v6 lacks the range, and a v6 frame read as v5 has 8 bytes too many.
  CHECK(decode(3, 3, std::span<const uint8_t>(v5).subspan(12), 6).error ==
        "malformed send frame: truncated at field 'first_layer': needs 4 bytes, 0 remain");
  CHECK(decode(3, 3, std::span<const uint8_t>(v6).subspan(12), 5).error ==
        "malformed send frame: 8 unexpected bytes after the last field");
}

TEST_CASE("malformed and oversized frames get errors naming the problem", "[unit][protocol]") {
  SECTION("oversized length") {
    std::vector<uint8_t> f{0xff, 0xff, 0xff, 0x7f};
    frame_reader r;
    r.feed(f);
    auto d = r.next();
    REQUIRE(d);
    CHECK(d->code == errc::frame_too_large);
    CHECK(d->error == "frame of 2147483647 bytes exceeds the limit of 16777216 bytes");
  }
  SECTION("truncated field") {
    auto bytes = encode(prepare{1, {"x"}, {1, 2, 3}, 0, 0}, 1);
    auto d = decode(2, 1, std::span<const uint8_t>(bytes).subspan(12, 24));
    CHECK(d.error ==
          "malformed prepare frame: field 'dst_pages' claims 3 entries but only 3 bytes remain");
  }
  SECTION("unknown type") { CHECK(decode(77, 1, {}).error == "unknown message type 77"); }
  SECTION("bad bool") {
    auto bytes = encode(send{5, {}, true, 1, 0}, 3);
    bytes[12 + 8 + 4] = 7;  // the 'last' byte
    auto d = decode(3, 3, std::span<const uint8_t>(bytes).subspan(12));
    CHECK(d.error == "malformed send frame: field 'last' must be 0 or 1, got 7");
    // v10's checksum byte, the prepare's last
    prepare checked{5, {"x"}, {1}, 0, 0};
    checked.checksum = true;
    auto p = encode(checked, 3, 10);
    p.back() = 2;
    CHECK(decode(2, 3, std::span<const uint8_t>(p).subspan(12), 10).error ==
          "malformed prepare frame: field 'checksum' must be 0 or 1, got 2");
    p.pop_back();
    CHECK_THAT(decode(2, 3, std::span<const uint8_t>(p).subspan(12), 10).error,
               Catch::StartsWith("malformed prepare frame: truncated at field 'checksum'"));
    CHECK(decode(2, 3, std::span<const uint8_t>(p).subspan(12), 9).error.empty());  // v9's frame
  }
  SECTION("garbage never crashes the decoder") {
    uint64_t x = 1;
    for (int t = 0; t < 2000; ++t) {
      std::vector<uint8_t> body(static_cast<size_t>(splitmix64(x++) % 64));
      for (auto& c : body) c = static_cast<uint8_t>(splitmix64(x++));
      auto d = decode(static_cast<uint16_t>(1 + t % 7), 0, body);
      CHECK((d.msg.has_value() || !d.error.empty()));
    }
  }
}

TEST_CASE("every error code has a name", "[unit][errors]") {
  for (auto e : all_errc) {
    REQUIRE(to_string(e) != nullptr);
    CHECK(std::string(to_string(e)).size() > 1);
  }
}

TEST_CASE("patterns detect the first wrong byte", "[unit][pattern]") {
  std::vector<uint8_t> buf(1027);
  fill_pattern(buf, pattern_seed(42, 0, 3, 17));
  CHECK(check_pattern(buf, pattern_seed(42, 0, 3, 17)) == -1);
  CHECK(check_pattern(buf, pattern_seed(42, 0, 3, 18)) == 0);
  buf[1026] ^= 1;
  CHECK(check_pattern(buf, pattern_seed(42, 0, 3, 17)) == 1026);
}
