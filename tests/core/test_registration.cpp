// A pool the engine's registration describes (core/registration.hpp): the config section and the
// placement ferryd makes of a register_memory table, and what it refuses, by name.

#include <catch2/catch.hpp>

#include "core/config.hpp"
#include "core/protocol.hpp"
#include "core/registration.hpp"

using namespace ferry;

namespace {

proto::memory_buffer buf(uint64_t offset, uint64_t item, uint64_t items, uint32_t layer,
                         buffer_kind kind, uint32_t tensor = 0, uint32_t dim = 0,
                         uint32_t total = 0, std::vector<uint64_t> groups = {}) {
  return {0, offset, item, items, layer, tensor, kind, dim, total, 1, std::move(groups)};
}

/// A daemon at TP `tp` whose pools are `pools` (what ferryd validates a registration with).
ferry_config daemon_with(const pools_config& pools, uint32_t tp) {
  ferry_config cfg;
  cfg.node_name = "n";
  cfg.client_listen = "/tmp/ferry-n.sock";
  cfg.tp.size = tp;
  cfg.pools = pools;
  return cfg;
}

proto::register_memory kv_table() {
  proto::register_memory r;
  r.pool = pool_kind::kv;
  r.fd_count = 1;
  r.page_tokens = 1;
  // SGLang's per-layer tensors at an allocator's offsets: 512-byte steps plus a header
  r.buffers = {buf(704, 256, 65, 3, buffer_kind::k, 0, 2, 2),
               buf(17600, 256, 65, 7, buffer_kind::k, 0, 2, 2),
               buf(34496, 256, 65, 3, buffer_kind::v, 0, 2, 2),
               buf(51392, 256, 65, 7, buffer_kind::v, 0, 2, 2)};
  return r;
}

}  // namespace

TEST_CASE("a registered kv pool keeps the engine's offsets and says its heads in bytes",
          "[registration]") {
  auto d = describe_registration(kv_table(), {69632});
  REQUIRE(d);
  REQUIRE(d.value.spans == std::vector<fd_span>{{0, 0, 69632, 0}});
  const auto& kv = *d.value.section.kv;
  CHECK(kv.placement.registered);
  CHECK(kv.layer_ids == std::vector<uint32_t>{3, 7});
  CHECK(kv.page_tokens == 1);
  CHECK(kv.kv_heads == 2);
  CHECK(kv.total_heads == 2);
  CHECK(kv.head_dim * kv.dtype_bytes == 128);  // 256-byte pages of 1 token x 2 heads
  CHECK(kv.pages == 65);
  CHECK(kv.placement.offsets == std::vector<uint64_t>{704, 17600, 34496, 51392});
  const auto layout = make_layout(d.value.section)[pool_kind::kv];
  CHECK(layout.buffers[1].offset == 17600);
  CHECK(layout.total_bytes == 69632);
  ferry_config cfg;
  cfg.node_name = "n";
  cfg.client_listen = "/tmp/ferry-n.sock";
  cfg.role = node_role::decode;
  cfg.pools = d.value.section;
  auto valid = validate_config(cfg);
  INFO(valid.message);
  CHECK(valid);
}

TEST_CASE("a descriptor's span covers only its buffers' pages", "[registration]") {
  auto r = kv_table();
  for (auto& b : r.buffers) b.fd_offset += 1 << 20;  // far into a larger memfd
  auto d = describe_registration(r, {4 << 20});
  REQUIRE(d);
  CHECK(d.value.spans == std::vector<fd_span>{{0, 1 << 20, (1 << 20) + 69632, 0}});
  CHECK(d.value.section.kv->placement.offsets.front() == 704);
  CHECK(d.value.bytes == 69632);
}

TEST_CASE("registered state tensors and MetadataBuffers", "[registration]") {
  proto::register_memory s;
  s.pool = pool_kind::state;
  s.fd_count = 1;
  // conv [layers, size + 1, 512/tp, 2] bf16 at TP 2; temporal [layers, size + 1, 2, 16, 16] fp32
  s.buffers = {buf(300, 1024, 5, 0, buffer_kind::state, 0, 256, 0, {128, 128, 256}),
               buf(300 + 5120, 1024, 5, 1, buffer_kind::state, 0, 256, 0, {128, 128, 256}),
               buf(20000, 2048, 5, 0, buffer_kind::state, 1, 2),
               buf(20000 + 10240, 2048, 5, 1, buffer_kind::state, 1, 2)};
  auto d = describe_registration(s, {40960});
  REQUIRE(d);
  const auto& m = *d.value.section.mamba;
  CHECK(m.slots == 5);
  CHECK(m.layer_ids == std::vector<uint32_t>{0, 1});
  REQUIRE(m.tensors.size() == 2);
  CHECK(m.tensors[0].shape == std::vector<uint64_t>{256, 4});
  CHECK(m.tensors[0].slice_axis == 0u);
  CHECK(m.tensors[0].shard_groups == std::vector<uint64_t>{128, 128, 256});
  CHECK(m.tensors[1].shape == std::vector<uint64_t>{2, 1024});
  ferry_config cfg = daemon_with(d.value.section, 2);
  auto valid = validate_config(cfg);
  INFO(valid.message);
  CHECK(valid);

  proto::register_memory a;
  a.pool = pool_kind::aux;
  a.fd_count = 1;
  a.buffers = {buf(0, 64, 8, 0, buffer_kind::aux), buf(1000, 4096, 8, 0, buffer_kind::aux),
               buf(40000, 8, 8, 0, buffer_kind::aux)};
  a.room_id_buffer = 2;
  auto x = describe_registration(a, {65536});
  REQUIRE(x);
  CHECK(x.value.section.aux->row_sizes() == std::vector<uint64_t>{64, 4096, 8});
  CHECK(x.value.section.aux->room_id_buffer == 2);
  CHECK(make_layout(x.value.section)[pool_kind::aux].buffers[2].offset == 40000);
}

TEST_CASE("a mis-shaped registration is refused naming the buffer", "[registration]") {
  auto uneven = kv_table();
  uneven.buffers[1].item_bytes = 512;
  uneven.buffers[1].items = 30;
  auto e = describe_registration(uneven, {69632});
  REQUIRE_FALSE(e);
  CHECK(e.code == errc::invalid_request);
  CHECK(e.message ==
        "pool kv: buffer 1 (K of layer 7) has page size 512, buffer 0 (K of layer 3) 256: they "
        "must be the same");

  auto order = kv_table();
  std::swap(order.buffers[1], order.buffers[2]);
  e = describe_registration(order, {69632});
  REQUIRE_FALSE(e);
  CHECK(e.message ==
        "pool kv: buffer 1 is V of layer 3, expected K: the table lists K of every layer, then V "
        "of the same layers in the same order (4 buffers)");

  auto overlap = kv_table();
  overlap.buffers[1].fd_offset = 800;
  e = describe_registration(overlap, {69632});
  REQUIRE_FALSE(e);
  CHECK(e.message == "pool kv: buffers 0 and 1 overlap in fd 0");

  e = describe_registration(kv_table(), {40000});
  REQUIRE_FALSE(e);
  CHECK(e.message ==
        "pool kv: buffer 2 (V of layer 3 with 65 items of 256 bytes) needs bytes up to fd 0 "
        "offset 34496 and beyond, but the fd has 40000");

  auto no_heads = kv_table();
  for (auto& b : no_heads.buffers) b.slice_dim = 0;
  e = describe_registration(no_heads, {69632});
  REQUIRE_FALSE(e);
  CHECK(e.message ==
        "pool kv: buffer 0 names no KV heads at this rank (slice_dim 0; SGLang's kv_head_num)");
}

TEST_CASE("a later registration must describe the first one's pool", "[registration]") {
  auto first = describe_registration(kv_table(), {69632});
  REQUIRE(first);
  CHECK_FALSE(registration_difference(pool_kind::kv, first.value, first.value));
  auto moved = kv_table();
  moved.buffers[3].fd_offset += 64;
  auto now = describe_registration(moved, {69632});
  REQUIRE(now);
  auto diff = registration_difference(pool_kind::kv, first.value, now.value);
  REQUIRE(diff);
  CHECK(*diff ==
        "buffer 3 is V of layer 7 (tensor 0) with 65 items of 256 bytes at pool offset 51456; the "
        "first registration had V of layer 7 (tensor 0) with 65 items of 256 bytes at 51392");
}

TEST_CASE("a client pool with nothing else in its config waits for its registration",
          "[registration][config]") {
  auto cfg = parse_config_text(
      "node: {name: d}\nrole: decode\nlisten: {control: \"127.0.0.1:7400\", client: /tmp/x.sock}\n"
      "pools:\n  kv: {memory: client}\n  aux: {memory: client}\n");
  REQUIRE(cfg);
  REQUIRE(cfg.value.pools.kv);
  CHECK(cfg.value.pools.kv->placement.registered);
  CHECK(cfg.value.pools.aux->placement.registered);
  CHECK(validate_config(cfg.value));
  CHECK_FALSE(described_yet(cfg.value.pools));
  const auto yaml = to_yaml(cfg.value);
  CHECK(yaml.find("described by the engine's register_memory") != std::string::npos);
  // a shaped client pool is described by its config, as before
  auto shaped = parse_config_text(
      "node: {name: d}\nrole: decode\nlisten: {control: \"127.0.0.1:7400\", client: /tmp/x.sock}\n"
      "pools:\n  aux: {rows: 4, row_bytes: 64, memory: client}\n");
  REQUIRE(shaped);
  CHECK_FALSE(shaped.value.pools.aux->placement.registered);
  CHECK(described_yet(shaped.value.pools));
}

TEST_CASE("a registration's numbers cannot overflow or map what lies between its buffers",
          "[registration]") {
  proto::register_memory s;
  s.pool = pool_kind::state;
  s.fd_count = 1;
  s.buffers = {buf(0, 1024, 5, 0, buffer_kind::state, 0, 2)};
  s.buffers[0].outer = uint64_t{1} << 63;  // outer x slice_dim wraps to 0
  auto e = describe_registration(s, {8192});
  REQUIRE_FALSE(e);
  CHECK(e.message ==
        "pool state: buffer 0 (state tensor 0 of layer 0): slots of 1024 bytes cannot hold "
        "9223372036854775808 x 2 (outer dims x sliced axis)");

  // Two buffers far apart in one memfd: only the pages they touch are mapped, one run each.
  auto r = kv_table();
  r.buffers[2].fd_offset += 1 << 30;
  r.buffers[3].fd_offset += 1 << 30;
  auto d = describe_registration(r, {(1 << 30) + 69632});
  REQUIRE(d);
  REQUIRE(d.value.spans.size() == 2);
  CHECK(d.value.spans[0] == fd_span{0, 0, 36864, 0});
  CHECK(d.value.spans[1] == fd_span{0, (1 << 30) + 32768, (1 << 30) + 69632, 36864});
  CHECK(d.value.bytes == 36864 + 36864);
  CHECK(d.value.section.kv->placement.offsets ==
        std::vector<uint64_t>{704, 17600, 36864 + 34496 - 32768, 36864 + 51392 - 32768});
}

TEST_CASE("a config's text is printable UTF-8, so it reads back the same when printed",
          "[config]") {
  auto cfg = parse_config_text(
      "node: {name: d}\nrole: decode\nlisten: {control: \"127.0.0.1:7400\", client: "
      "\"/tmp\\x0fx.sock\"}\npools:\n  kv: {memory: client}\n");
  REQUIRE_FALSE(cfg);
  CHECK(cfg.message == "listen.client: expected printable UTF-8 text, got byte 0x0f at offset 4");
  cfg = parse_config_text(
      "node: {name: d}\nrole: decode\nlisten: {control: \"127.0.0.1:7400\", client: "
      "/tmp/d\xc3\xa9"
      "code.sock}\npools:\n  kv: {memory: client}\n");
  CHECK(cfg);  // UTF-8 is text
}

TEST_CASE("a registered state buffer's shard units (v9) describe groups held whole",
          "[registration]") {
  // Mamba2 n_groups 1 at TP 2: conv [x | B | C] = 4096 + 128 + 128 channels of 6 bytes.
  proto::register_memory req;
  req.pool = pool_kind::state;
  req.fd_count = 1;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    auto b = buf(layer * 4352 * 6 * 4, 4352 * 6, 4, layer, buffer_kind::state, 0, 4352, 0,
                 {8192, 128, 128});
    b.units = {128, 1, 1};
    req.buffers.push_back(b);
  }
  auto d = describe_registration(req, {4352 * 6 * 8});
  INFO(d.message);
  REQUIRE(d);
  const auto& conv = d.value.section.mamba->tensors.at(0);
  CHECK(conv.shard_groups == std::vector<uint64_t>{8192, 128, 128});
  CHECK(conv.shard_units == std::vector<uint64_t>{128, 1, 1});
  ferry_config cfg = daemon_with(d.value.section, 2);
  auto valid = validate_config(cfg);
  INFO(valid.message);
  CHECK(valid);
  SECTION("at TP 4 the same shares do not add up, and the daemon says so") {
    cfg.tp.size = 4;
    auto bad = validate_config(cfg);
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.message, Catch::Matchers::Contains("expected the groups' shares at tp.size 4"));
  }
  SECTION("layers that disagree on the units are refused, naming them") {
    req.buffers[1].units = {128, 2, 2};
    auto bad = describe_registration(req, {4352 * 6 * 8});
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.message, Catch::Matchers::Contains("shard units"));
  }
  SECTION("units without a sliced axis are refused") {
    for (auto& b : req.buffers) b.slice_dim = 0, b.groups.clear();
    auto bad = describe_registration(req, {4352 * 6 * 8});
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.message, Catch::Matchers::Contains("has shard groups but no sliced axis"));
  }
}

namespace {

proto::decoded decode_frame(const std::vector<uint8_t>& frame, uint16_t version) {
  return proto::decode(static_cast<uint16_t>(proto::msg_type::register_memory), 3,
                       std::span<const uint8_t>(frame.data() + proto::header_bytes,
                                                frame.size() - proto::header_bytes),
                       version);
}

}  // namespace

TEST_CASE("protocol v9: a register_memory buffer's units are one per group or none", "[protocol]") {
  proto::register_memory req;
  req.pool = pool_kind::state;
  req.buffers = {buf(0, 64, 1, 0, buffer_kind::state, 0, 8, 0, {8, 4, 4})};
  req.buffers[0].units = {8, 1, 1};
  auto back = decode_frame(proto::encode(req, 3, 9), 9);
  INFO(back.error);
  REQUIRE(back.msg);
  CHECK(std::get<proto::register_memory>(*back.msg).buffers == req.buffers);
  // At version 8 the units are not on the wire (the clients refuse to send them there).
  auto v8 = decode_frame(proto::encode(req, 3, 8), 8);
  REQUIRE(v8.msg);
  CHECK(std::get<proto::register_memory>(*v8.msg).buffers[0].units.empty());
  // Two units for three groups: refused, naming the field.
  req.buffers[0].units = {8, 1};
  auto refused = decode_frame(proto::encode(req, 3, 9), 9);
  REQUIRE_FALSE(refused.msg);
  CHECK_THAT(refused.error,
             Catch::Matchers::Contains("field 'buffer.units' has 2 entries for 3 shard groups"));
}
