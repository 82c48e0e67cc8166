// Loading and parsing a ferryd config (core/config.hpp): the example configs, the defaults of
// every optional key, parse errors that name the key and the value seen, YAML syntax errors and
// unreadable files, who owns a pool's memory, and the size helpers of the pool sections.
// validate_config is test_config_validation.cpp's subject, to_yaml test_config_yaml.cpp's.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "config_yaml.hpp"
#include "core/config.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

void check_qwen3_next_pools(const ferry_config& cfg) {
  REQUIRE(cfg.pools.kv);
  const kv_pool_config& kv = *cfg.pools.kv;
  REQUIRE(kv.layer_ids == std::vector<uint32_t>{3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47});
  REQUIRE(kv.page_bytes() == 1024);
  REQUIRE(kv.buffer_count() == 24);
  REQUIRE(kv.pages == 20480);
  // 24 KiB of KV per token across all attention layers.
  REQUIRE(kv.page_bytes() * kv.buffer_count() == 24 * 1024);

  REQUIRE(cfg.pools.mamba);
  const mamba_pool_config& mamba = *cfg.pools.mamba;
  REQUIRE(mamba.slots == 8);
  REQUIRE(mamba.layer_ids.size() == 36);
  std::vector<bool> covered(48, false);
  for (uint32_t id : kv.layer_ids) covered.at(id) = true;
  for (uint32_t id : mamba.layer_ids) {
    REQUIRE_FALSE(covered.at(id));
    covered.at(id) = true;
  }
  for (bool c : covered) REQUIRE(c);

  REQUIRE(mamba.tensors.size() == 2);
  REQUIRE(mamba.tensors[0].name == "conv");
  REQUIRE(mamba.tensors[0].slot_bytes() == 49152);
  REQUIRE(mamba.tensors[0].shard_groups == std::vector<uint64_t>{2048, 2048, 4096});
  REQUIRE(mamba.tensors[1].name == "temporal");
  REQUIRE(mamba.tensors[1].slot_bytes() == 2097152);
  uint64_t slot = 0;
  for (const auto& t : mamba.tensors) slot += t.slot_bytes() * mamba.layer_ids.size();
  REQUIRE(slot == 77266944);  // ~74 MiB per slot

  REQUIRE(cfg.pools.aux);
  REQUIRE(cfg.pools.aux->rows == 64);
  REQUIRE(cfg.pools.aux->row_bytes == 5632);
}

}  // namespace

TEST_CASE("example prefill config loads and validates", "[unit][config]") {
  const auto r = load_config_file(source_dir() + "/configs/prefill.yaml");
  INFO(r.message);
  REQUIRE(r);
  const ferry_config& cfg = r.value;
  REQUIRE(cfg.node_name == "prefill-0");
  REQUIRE(cfg.instance == "auto");
  REQUIRE(cfg.role == node_role::prefill);
  REQUIRE(cfg.control_listen == "127.0.0.1:7401");
  REQUIRE(cfg.client_listen == "/tmp/ferry-prefill.sock");
  REQUIRE(cfg.fabric.provider == "tcp");
  REQUIRE(cfg.tp.size == 1);
  check_qwen3_next_pools(cfg);
}

TEST_CASE("example decode config loads and validates", "[unit][config]") {
  const auto r = load_config_file(source_dir() + "/configs/decode.yaml");
  INFO(r.message);
  REQUIRE(r);
  const ferry_config& cfg = r.value;
  REQUIRE(cfg.node_name == "decode-0");
  REQUIRE(cfg.role == node_role::decode);
  REQUIRE(cfg.control_listen == "127.0.0.1:7402");
  REQUIRE(cfg.client_listen == "/tmp/ferry-decode.sock");
  check_qwen3_next_pools(cfg);
}

TEST_CASE("defaults fill every optional key", "[unit][config]") {
  const ferry_config cfg = parse_ok(R"(node: {name: solo}
listen: {client: /tmp/solo.sock}
pools:
  aux: {rows: 4, row_bytes: 64}
)");
  REQUIRE(validate_config(cfg));
  REQUIRE(cfg.node_name == "solo");
  REQUIRE(cfg.instance == "auto");
  REQUIRE(cfg.role == node_role::both);
  REQUIRE(cfg.control_listen == "127.0.0.1:7400");
  REQUIRE(cfg.fabric.provider == "tcp");
  REQUIRE(cfg.fabric.address == "127.0.0.1");
  REQUIRE(cfg.fabric.max_inflight_writes == 64);
  REQUIRE(cfg.fabric.write_piece_bytes == 1048576);
  REQUIRE(cfg.timeouts.handshake_ms == 10000);
  REQUIRE(cfg.timeouts.bootstrapping_ms == 30000);
  REQUIRE(cfg.timeouts.transfer_ms == 120000);
  REQUIRE(cfg.limits.peer_preamble_ms == 3000);
  REQUIRE(cfg.limits.max_pending_peers == 64);
  REQUIRE(cfg.limits.max_pending_peers_per_source == 8);
  REQUIRE(cfg.tp.size == 1);
  REQUIRE(cfg.tp.rank == 0);
  REQUIRE(cfg.dp.size == 1);
  REQUIRE(cfg.dp.rank == 0);
  REQUIRE(cfg.runtime.workers == 0);
  REQUIRE(cfg.log.level == "info");
  REQUIRE_FALSE(cfg.pools.kv);
  REQUIRE_FALSE(cfg.pools.mamba);
  REQUIRE(cfg.pools.aux);

  const ferry_config with_kv = parse_ok(R"(node: {name: solo}
listen: {client: /tmp/solo.sock}
pools:
  kv: {layer_ids: [0], kv_heads: 1, head_dim: 64, pages: 2}
  mamba:
    slots: 1
    layer_ids: [1]
    tensors: [{name: s, shape: [4], dtype_bytes: 4}]
)");
  REQUIRE(validate_config(with_kv));
  REQUIRE(with_kv.pools.kv->page_tokens == 1);
  REQUIRE(with_kv.pools.kv->dtype_bytes == 2);
  REQUIRE_FALSE(with_kv.pools.kv->mla);
  // Without slice_axis the slicing is unknown: only equal-TP transfers may use the tensor.
  REQUIRE_FALSE(with_kv.pools.mamba->tensors[0].slice_axis.has_value());
  REQUIRE(with_kv.pools.mamba->tensors[0].shard_groups.empty());
}

TEST_CASE("pack_threshold_bytes defaults by provider, and the effective config says so",
          "[unit][config][pack]") {
  auto cfg = parse_ok(base_yaml);
  CHECK_FALSE(cfg.fabric.pack_threshold_bytes.has_value());
  CHECK(cfg.fabric.pack_threshold() == 65536);  // tcp: every write is a socket send
  CHECK_THAT(to_yaml(cfg),
             Catch::Contains("# pack_threshold_bytes not set: 65536 for provider tcp"));
  cfg.fabric.provider = "shm";
  CHECK(cfg.fabric.pack_threshold() == 8192);
  const auto set = parse_ok(base_yaml + "fabric: {provider: shm, pack_threshold_bytes: 0}\n");
  CHECK(set.fabric.pack_threshold() == 0);
  const auto again = parse_ok(to_yaml(set));
  CHECK(again.fabric.pack_threshold_bytes == uint64_t{0});
}

TEST_CASE("base test config is valid", "[unit][config]") {
  const ferry_config cfg = parse_ok(base_yaml);
  const auto valid = validate_config(cfg);
  INFO(valid.message);
  REQUIRE(valid);
}

TEST_CASE("unknown keys are errors naming the full path", "[unit][config]") {
  SECTION("top level") { REQUIRE(parse_error(base_yaml + "bogus: 1\n") == "bogus: unknown key"); }
  SECTION("in a section") {
    REQUIRE(parse_error(base_yaml + "fabric:\n  bogus: 1\n") == "fabric.bogus: unknown key");
  }
  SECTION("in a pool") {
    REQUIRE(parse_error(replace(base_yaml, "    page_tokens: 1\n", "    pagez: 1\n")) ==
            "pools.kv.pagez: unknown key");
  }
  SECTION("in a tensor list item") {
    REQUIRE(parse_error(replace(base_yaml, "        dtype_bytes: 4\n",
                                "        dtype_bytes: 4\n        bogus: x\n")) ==
            "pools.mamba.tensors[1].bogus: unknown key");
  }
  SECTION("repeated key") {
    REQUIRE(parse_error(replace(base_yaml, "  size: 1\n", "  size: 1\n  size: 2\n")) ==
            "tp.size: duplicate key");
  }
}

TEST_CASE("parse errors name the key and the value seen", "[unit][config]") {
  SECTION("role") {
    REQUIRE(parse_error(base_yaml + "role: sender\n") ==
            "role: expected prefill, decode or both, got sender");
  }
  SECTION("string where an integer belongs") {
    REQUIRE(parse_error(replace(base_yaml, "size: 1", "size: four")) ==
            "tp.size: expected an integer, got \"four\"");
  }
  SECTION("quoted number is a string") {
    REQUIRE(parse_error(replace(base_yaml, "size: 1", "size: \"4\"")) ==
            "tp.size: expected an integer, got \"4\"");
  }
  SECTION("fraction") {
    REQUIRE(parse_error(replace(base_yaml, "size: 1", "size: 1.5")) ==
            "tp.size: expected an integer, got 1.5");
  }
  SECTION("negative number for an unsigned field") {
    REQUIRE(parse_error(replace(base_yaml, "size: 1", "size: -1")) ==
            "tp.size: expected a non-negative integer, got -1");
  }
  SECTION("too large for 32 bits") {
    REQUIRE(parse_error(replace(base_yaml, "size: 1", "size: 4294967296")) ==
            "tp.size: expected an integer at most 4294967295, got 4294967296");
  }
  SECTION("list element") {
    REQUIRE(parse_error(replace(base_yaml, "[3, 7]", "[3, x]")) ==
            "pools.kv.layer_ids[1]: expected an integer, got \"x\"");
  }
  SECTION("scalar where a list belongs") {
    REQUIRE(parse_error(replace(base_yaml, "[3, 7]", "3")) ==
            "pools.kv.layer_ids: expected a list, got 3");
  }
  SECTION("scalar where a section belongs") {
    REQUIRE(parse_error(base_yaml + "fabric: tcp\n") == "fabric: expected a map, got \"tcp\"");
  }
  SECTION("boolean") {
    REQUIRE(parse_error(replace(base_yaml, "    pages: 16\n", "    pages: 16\n    mla: 1\n")) ==
            "pools.kv.mla: expected true or false, got 1");
  }
  SECTION("missing required key") {
    REQUIRE(parse_error(replace(base_yaml, "  name: n0\n", "  instance: auto\n")) ==
            "node.name: required key is missing");
    REQUIRE(parse_error(replace(base_yaml, "listen:\n  client: /tmp/ferry-test.sock\n", "")) ==
            "listen.client: required key is missing");
  }
  SECTION("top level is not a map") {
    REQUIRE(parse_error("- a\n- b\n") == "config: expected a map, got a list");
  }
}

TEST_CASE("YAML syntax errors report position", "[unit][config]") {
  REQUIRE(parse_error("node:\n  name: x: y\n") ==
          "config: YAML syntax error at line 2, column 10: illegal map value");
  // yaml-cpp marks an unclosed flow list where it gave up: the end of the text.
  REQUIRE(parse_error("node:\n  name: [a, b\n") ==
          "config: YAML syntax error at line 3, column 1: end of sequence flow not found");

  // A file's errors are prefixed with its path instead of "config".
  char path[] = "/tmp/ferry-test-config-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << "a: b: c\n";
  const auto r = parse_config_file(path);
  ::unlink(path);
  REQUIRE_FALSE(r);
  REQUIRE(r.message ==
          std::string(path) + ": YAML syntax error at line 1, column 5: illegal map value");
}

TEST_CASE("missing config file is reported with its path", "[unit][config]") {
  const auto r = load_config_file("/nonexistent/ferry.yaml");
  REQUIRE_FALSE(r);
  REQUIRE(r.message ==
          "cannot read config file '/nonexistent/ferry.yaml': No such file or directory");
}

TEST_CASE("size helpers", "[unit][config]") {
  const state_tensor_config conv{"conv", {8192, 3}, 2, 0, {2048, 2048, 4096}};
  REQUIRE(conv.slot_bytes() == 49152);
  REQUIRE(conv.sliced_dim() == 8192);
  REQUIRE(conv.outer_count() == 1);

  const state_tensor_config temporal{"temporal", {32, 128, 128}, 4, 0, {}};
  REQUIRE(temporal.slot_bytes() == 2097152);
  REQUIRE(temporal.sliced_dim() == 32);
  REQUIRE(temporal.outer_count() == 1);

  // Kimi-style conv state [K-1, dim] sliced on its second axis.
  const state_tensor_config kimi{"conv", {3, 4096}, 2, 1, {}};
  REQUIRE(kimi.sliced_dim() == 4096);
  REQUIRE(kimi.outer_count() == 3);

  kv_pool_config kv;
  kv.layer_ids = {3, 7, 11};
  kv.kv_heads = 2;
  kv.head_dim = 256;
  REQUIRE(kv.page_bytes() == 1024);
  REQUIRE(kv.buffer_count() == 6);
  kv.mla = true;
  REQUIRE(kv.buffer_count() == 3);
  kv.page_tokens = 16;
  REQUIRE(kv.page_bytes() == 16384);

  REQUIRE(std::string(to_string(node_role::prefill)) == "prefill");
  REQUIRE(std::string(to_string(node_role::decode)) == "decode");
  REQUIRE(std::string(to_string(node_role::both)) == "both");
}

TEST_CASE("pools say who owns their memory: daemon by default, or client", "[unit][config]") {
  const auto plain = parse_ok(base_yaml);
  CHECK(plain.pools.kv->memory == pool_memory::daemon);
  CHECK(plain.pools.mamba->memory == pool_memory::daemon);
  const auto lent = parse_ok(
      replace(base_yaml, "    page_tokens: 1\n", "    page_tokens: 1\n    memory: client\n"));
  CHECK(lent.pools.kv->memory == pool_memory::client);
  CHECK(lent.pools.mamba->memory == pool_memory::daemon);
  // The effective config keeps it (peers and --check-config see it).
  CHECK(parse_ok(to_yaml(lent)).pools.kv->memory == pool_memory::client);
  CHECK(parse_error(
            replace(base_yaml, "    page_tokens: 1\n", "    page_tokens: 1\n    memory: gpu\n")) ==
        "pools.kv.memory: expected daemon or client, got gpu");
}
