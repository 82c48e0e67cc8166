// to_yaml (core/config.hpp), the effective config that ferryd prints for --check-config and
// that peers see: it parses back to the same config, defaults and awkward strings included.
#include <catch2/catch.hpp>
#include <string>

#include "config_yaml.hpp"
#include "core/config.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

// The header declares no operator== for the config structs, so compare field by field.
void require_equal(const state_tensor_config& a, const state_tensor_config& b) {
  REQUIRE(a.name == b.name);
  REQUIRE(a.shape == b.shape);
  REQUIRE(a.dtype_bytes == b.dtype_bytes);
  REQUIRE(a.slice_axis == b.slice_axis);
  REQUIRE(a.shard_groups == b.shard_groups);
  REQUIRE(a.shard_units == b.shard_units);
}

void require_equal(const ferry_config& a, const ferry_config& b) {
  REQUIRE(a.node_name == b.node_name);
  REQUIRE(a.instance == b.instance);
  REQUIRE(a.role == b.role);
  REQUIRE(a.control_listen == b.control_listen);
  REQUIRE(a.client_listen == b.client_listen);
  REQUIRE(a.metrics_listen == b.metrics_listen);
  REQUIRE(a.fabric.provider == b.fabric.provider);
  REQUIRE(a.fabric.address == b.fabric.address);
  REQUIRE(a.fabric.max_inflight_writes == b.fabric.max_inflight_writes);
  REQUIRE(a.fabric.write_piece_bytes == b.fabric.write_piece_bytes);
  REQUIRE(a.fabric.rails == b.fabric.rails);
  REQUIRE(a.fabric.express_bytes == b.fabric.express_bytes);
  REQUIRE(a.timeouts.handshake_ms == b.timeouts.handshake_ms);
  REQUIRE(a.timeouts.bootstrapping_ms == b.timeouts.bootstrapping_ms);
  REQUIRE(a.timeouts.drain_ms == b.timeouts.drain_ms);
  REQUIRE(a.timeouts.heartbeat_ms == b.timeouts.heartbeat_ms);
  REQUIRE(a.timeouts.transfer_ms == b.timeouts.transfer_ms);
  REQUIRE(a.timeouts.stop_ms == b.timeouts.stop_ms);
  REQUIRE(a.tp.size == b.tp.size);
  REQUIRE(a.tp.rank == b.tp.rank);
  REQUIRE(a.pp.size == b.pp.size);
  REQUIRE(a.pp.rank == b.pp.rank);
  REQUIRE(a.dp.size == b.dp.size);
  REQUIRE(a.dp.rank == b.dp.rank);
  REQUIRE(a.runtime.workers == b.runtime.workers);
  REQUIRE(a.log.level == b.log.level);
  REQUIRE(a.log.format == b.log.format);
  REQUIRE(a.log.levels == b.log.levels);
  REQUIRE(a.log.summary_ms == b.log.summary_ms);
  REQUIRE(a.log.burst == b.log.burst);

  REQUIRE(a.pools.kv.has_value() == b.pools.kv.has_value());
  if (a.pools.kv) {
    const auto &x = *a.pools.kv, &y = *b.pools.kv;
    REQUIRE(x.layer_ids == y.layer_ids);
    REQUIRE(x.page_tokens == y.page_tokens);
    REQUIRE(x.kv_heads == y.kv_heads);
    REQUIRE(x.head_dim == y.head_dim);
    REQUIRE(x.dtype_bytes == y.dtype_bytes);
    REQUIRE(x.mla == y.mla);
    REQUIRE(x.pages == y.pages);
  }
  REQUIRE(a.pools.mamba.has_value() == b.pools.mamba.has_value());
  if (a.pools.mamba) {
    const auto &x = *a.pools.mamba, &y = *b.pools.mamba;
    REQUIRE(x.slots == y.slots);
    REQUIRE(x.layer_ids == y.layer_ids);
    REQUIRE(x.tensors.size() == y.tensors.size());
    for (size_t i = 0; i < x.tensors.size(); ++i) require_equal(x.tensors[i], y.tensors[i]);
  }
  REQUIRE(a.pools.aux.has_value() == b.pools.aux.has_value());
  if (a.pools.aux) {
    REQUIRE(a.pools.aux->rows == b.pools.aux->rows);
    REQUIRE(a.pools.aux->row_bytes == b.pools.aux->row_bytes);
  }
}

}  // namespace

TEST_CASE("to_yaml round-trips through the parser", "[unit][config]") {
  SECTION("example config") {
    const auto r = load_config_file(source_dir() + "/configs/prefill.yaml");
    REQUIRE(r);
    const std::string text = to_yaml(r.value);
    INFO(text);
    const ferry_config again = parse_ok(text);
    require_equal(r.value, again);
    REQUIRE(validate_config(again));
    REQUIRE(to_yaml(again) == text);
  }
  SECTION("defaults are written out") {
    const ferry_config cfg = parse_ok("node: {name: a}\nlisten: {client: /tmp/a.sock}\n");
    const std::string text = to_yaml(cfg);
    INFO(text);
    REQUIRE(text.find("instance: auto") != std::string::npos);
    REQUIRE(text.find("control: 127.0.0.1:7400") != std::string::npos);
    REQUIRE(text.find("write_piece_bytes: 1048576") != std::string::npos);
    REQUIRE(text.find("transfer_ms: 120000") != std::string::npos);
    REQUIRE(text.find("level: info") != std::string::npos);
    require_equal(cfg, parse_ok(text));
  }
  SECTION("the metrics endpoint survives, and is left out when not served") {
    ferry_config cfg = parse_ok(base_yaml);
    REQUIRE(to_yaml(cfg).find("metrics") == std::string::npos);
    cfg.metrics_listen = "127.0.0.1:9464";
    const std::string text = to_yaml(cfg);
    REQUIRE(text.find("metrics: 127.0.0.1:9464") != std::string::npos);
    require_equal(cfg, parse_ok(text));
  }
  SECTION("the model contract and dtype names survive") {
    ferry_config cfg = parse_ok(base_yaml);
    cfg.model = model_contract{"KimiLinearForCausalLM", "n_minus_1", {{"num_heads", "32"}}};
    cfg.pools.mamba->tensors[0].dtype = "bf16";
    const std::string text = to_yaml(cfg, yaml_for::peers);  // what a peer compares
    INFO(text);
    const ferry_config again = parse_ok(text);
    REQUIRE(again.model == cfg.model);
    REQUIRE(again.pools.mamba->tensors[0].dtype == "bf16");
  }
  SECTION("shard units survive") {
    ferry_config cfg = parse_ok(base_yaml);
    auto& conv = cfg.pools.mamba->tensors[0];
    conv.shard_groups = {8192, 128, 128};
    conv.shard_units = {64, 1, 1};
    const std::string text = to_yaml(cfg);
    INFO(text);
    REQUIRE(text.find("shard_units: [64, 1, 1]") != std::string::npos);
    require_equal(cfg, parse_ok(text));
  }
  SECTION("awkward strings survive") {
    ferry_config cfg = parse_ok(base_yaml);
    cfg.node_name = "null";
    cfg.instance = "123";
    cfg.fabric.provider = "true";
    cfg.fabric.address = "a: b # c";
    cfg.pools.kv->mla = true;
    require_equal(cfg, parse_ok(to_yaml(cfg)));
  }
  SECTION("rails survive, and a peer's copy leaves them out") {
    ferry_config cfg = parse_ok(base_yaml);
    cfg.fabric.rails = 3;
    cfg.fabric.express_bytes = 2 << 20;
    require_equal(cfg, parse_ok(to_yaml(cfg)));
    // A peer of protocol version 6 refuses unknown keys: what a hello carries has none of
    // these, and parses to the same config with the rail settings at their defaults.
    const std::string peers = to_yaml(cfg, yaml_for::peers);
    INFO(peers);
    CHECK(peers.find("rails") == std::string::npos);
    CHECK(peers.find("express_bytes") == std::string::npos);
    ferry_config seen = parse_ok(peers);
    CHECK(seen.fabric.rails == 1);
    CHECK(seen.fabric.express_bytes == default_express_bytes("tcp"));  // unset: the provider's
    seen.fabric.rails = cfg.fabric.rails;
    seen.fabric.express_bytes = cfg.fabric.express_bytes;
    require_equal(cfg, seen);
  }
  SECTION("an unset express rail takes the provider's default, an explicit 0 turns it off") {
    CHECK(parse_ok(base_yaml).fabric.express_bytes == (1u << 20));
    CHECK(parse_ok(base_yaml + "fabric:\n  express_bytes: 0\n").fabric.express_bytes == 0);
    CHECK(parse_ok(base_yaml + "fabric:\n  provider: verbs\n").fabric.express_bytes == 0);
    CHECK(default_express_bytes("shm") == (1u << 20));
    CHECK(default_express_bytes("verbs") == 0);
  }
  SECTION("parallel positions survive") {
    ferry_config cfg = parse_ok(base_yaml);
    cfg.pp = {2, 1};
    cfg.dp = {4, 3};
    require_equal(cfg, parse_ok(to_yaml(cfg)));
  }
}
