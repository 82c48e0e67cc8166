#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/config.hpp"

using namespace ferry;

namespace {

std::string source_dir() {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  return dir ? dir : FERRY_DEFAULT_SOURCE_DIR;
}

/// A small valid config; tests derive broken variants from it with `replace`.
const std::string base_yaml = R"(node:
  name: n0
listen:
  client: /tmp/ferry-test.sock
tp:
  size: 1
pools:
  kv:
    layer_ids: [3, 7]
    page_tokens: 1
    kv_heads: 2
    head_dim: 256
    dtype_bytes: 2
    pages: 16
  mamba:
    slots: 4
    layer_ids: [0, 1, 2]
    tensors:
      - name: conv
        shape: [8192, 3]
        dtype_bytes: 2
        slice_axis: 0
        shard_groups: [2048, 2048, 4096]
      - name: temporal
        shape: [32, 128, 128]
        dtype_bytes: 4
        slice_axis: 0
  aux:
    rows: 8
    row_bytes: 5632
)";

/// `text` with the single occurrence of `from` replaced by `to`.
std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  REQUIRE(text.find(from, at + 1) == std::string::npos);
  return text.replace(at, from.size(), to);
}

/// The parse error for `yaml`, which must fail to parse.
std::string parse_error(const std::string& yaml) {
  const auto r = parse_config_text(yaml);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::config_invalid);
  return r.message;
}

/// The validation error for `yaml`, which must parse but fail validation.
std::string validate_error(const std::string& yaml) {
  const auto r = parse_config_text(yaml);
  INFO(r.message);
  REQUIRE(r);
  const auto valid = validate_config(r.value);
  REQUIRE_FALSE(valid);
  CHECK(valid.code == errc::config_invalid);
  return valid.message;
}

ferry_config parse_ok(const std::string& yaml) {
  const auto r = parse_config_text(yaml);
  INFO(r.message);
  REQUIRE(r);
  return r.value;
}

// The header declares no operator== for the config structs, so compare field by field.
void require_equal(const state_tensor_config& a, const state_tensor_config& b) {
  REQUIRE(a.name == b.name);
  REQUIRE(a.shape == b.shape);
  REQUIRE(a.dtype_bytes == b.dtype_bytes);
  REQUIRE(a.slice_axis == b.slice_axis);
  REQUIRE(a.shard_groups == b.shard_groups);
}

void require_equal(const ferry_config& a, const ferry_config& b) {
  REQUIRE(a.node_name == b.node_name);
  REQUIRE(a.instance == b.instance);
  REQUIRE(a.role == b.role);
  REQUIRE(a.control_listen == b.control_listen);
  REQUIRE(a.client_listen == b.client_listen);
  REQUIRE(a.fabric.provider == b.fabric.provider);
  REQUIRE(a.fabric.address == b.fabric.address);
  REQUIRE(a.fabric.max_inflight_writes == b.fabric.max_inflight_writes);
  REQUIRE(a.fabric.write_piece_bytes == b.fabric.write_piece_bytes);
  REQUIRE(a.timeouts.handshake_ms == b.timeouts.handshake_ms);
  REQUIRE(a.timeouts.bootstrapping_ms == b.timeouts.bootstrapping_ms);
  REQUIRE(a.timeouts.drain_ms == b.timeouts.drain_ms);
  REQUIRE(a.timeouts.heartbeat_ms == b.timeouts.heartbeat_ms);
  REQUIRE(a.timeouts.transfer_ms == b.timeouts.transfer_ms);
  REQUIRE(a.tp.size == b.tp.size);
  REQUIRE(a.tp.rank == b.tp.rank);
  REQUIRE(a.pp.size == b.pp.size);
  REQUIRE(a.pp.rank == b.pp.rank);
  REQUIRE(a.dp.size == b.dp.size);
  REQUIRE(a.dp.rank == b.dp.rank);
  REQUIRE(a.runtime.workers == b.runtime.workers);
  REQUIRE(a.log.level == b.log.level);

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

TEST_CASE("validation errors name the key and the value seen", "[unit][config]") {
  SECTION("page_tokens") {
    REQUIRE(validate_error(replace(base_yaml, "page_tokens: 1", "page_tokens: 0")) ==
            "pools.kv.page_tokens: expected a positive integer, got 0");
  }
  SECTION("kv dtype_bytes") {
    REQUIRE(validate_error(replace(base_yaml, "    dtype_bytes: 2\n    pages",
                                   "    dtype_bytes: 3\n    pages")) ==
            "pools.kv.dtype_bytes: expected 1, 2, 4 or 8, got 3");
  }
  SECTION("slice_axis") {
    REQUIRE(validate_error(replace(base_yaml, "        dtype_bytes: 4\n        slice_axis: 0\n",
                                   "        dtype_bytes: 4\n        slice_axis: 5\n")) ==
            "pools.mamba.tensors[1].slice_axis: expected an axis index below 3 (shape has 3 "
            "dims), got 5");
  }
  SECTION("shard group sum") {
    REQUIRE(validate_error(replace(base_yaml, "[2048, 2048, 4096]", "[2048, 2048, 2048]")) ==
            "pools.mamba.tensors[0].shard_groups: expected entries summing to shape[0] x "
            "tp.size = 8192 x 1 = 8192, got a sum of 6144");
  }
  SECTION("shard groups are unsharded sizes") {
    // At TP2 the per-rank conv shape halves while the groups keep their full sizes.
    std::string yaml = replace(base_yaml, "size: 1", "size: 2");
    yaml = replace(yaml, "[8192, 3]", "[4096, 3]");
    yaml = replace(yaml, "[32, 128, 128]", "[16, 128, 128]");
    const ferry_config cfg = parse_ok(yaml);
    REQUIRE(validate_config(cfg));
  }
  SECTION("shard groups must split evenly over this rank's TP size") {
    std::string yaml = replace(base_yaml, "size: 1", "size: 2");
    yaml = replace(yaml, "[8192, 3]", "[4096, 3]");
    yaml = replace(yaml, "[32, 128, 128]", "[16, 128, 128]");
    yaml = replace(yaml, "[2048, 2048, 4096]", "[2047, 2049, 4096]");
    REQUIRE(validate_error(yaml) ==
            "pools.mamba.tensors[0].shard_groups[0]: expected a multiple of tp.size 2 (each rank "
            "holds an equal share of every group), got 2047");
  }
  SECTION("shard group entry") {
    REQUIRE(validate_error(replace(base_yaml, "[2048, 2048, 4096]", "[2048, 0, 4096]")) ==
            "pools.mamba.tensors[0].shard_groups[1]: expected a positive integer, got 0");
  }
  SECTION("shape dim") {
    REQUIRE(validate_error(replace(base_yaml, "[32, 128, 128]", "[32, 0, 128]")) ==
            "pools.mamba.tensors[1].shape[1]: expected a positive integer, got 0");
  }
  SECTION("duplicate tensor name") {
    REQUIRE(validate_error(replace(base_yaml, "name: temporal", "name: conv")) ==
            "pools.mamba.tensors[1].name: expected a name unique within pools.mamba.tensors, "
            "got \"conv\" again");
  }
  SECTION("duplicate layer id") {
    REQUIRE(validate_error(replace(base_yaml, "[3, 7]", "[3, 7, 3]")) ==
            "pools.kv.layer_ids: expected unique layer ids, got 3 twice");
  }
  SECTION("empty layer ids") {
    REQUIRE(validate_error(replace(base_yaml, "[0, 1, 2]", "[]")) ==
            "pools.mamba.layer_ids: expected a non-empty list, got []");
  }
  SECTION("mamba and kv layers overlap") {
    REQUIRE(validate_error(replace(base_yaml, "[0, 1, 2]", "[0, 1, 7]")) ==
            "pools.mamba.layer_ids: expected ids disjoint from pools.kv.layer_ids, got 7 in both");
  }
  SECTION("node name") {
    REQUIRE(validate_error(replace(base_yaml, "name: n0", "name: n 0")) ==
            "node.name: expected a non-empty name of [A-Za-z0-9._-], got \"n 0\"");
  }
  SECTION("node name too long for the shared-memory object names it makes") {
    const std::string long_name(300, 'n');
    REQUIRE(validate_error(replace(base_yaml, "name: n0", "name: " + long_name)) ==
            "node.name: expected at most 128 characters (it names the daemon's shared-memory "
            "objects), got 300");
    REQUIRE(validate_error(replace(base_yaml, "  name: n0\n",
                                   "  name: n0\n  instance: " + std::string(65, 'i') + "\n")) ==
            "node.instance: expected at most 64 characters (it names the daemon's shared-memory "
            "objects), got 65");
  }
  SECTION("instance") {
    REQUIRE(validate_error(replace(base_yaml, "  name: n0\n", "  name: n0\n  instance: a/b\n")) ==
            "node.instance: expected \"auto\" or a name of [A-Za-z0-9._-], got \"a/b\"");
  }
  SECTION("control port") {
    REQUIRE(validate_error(replace(base_yaml, "listen:\n", "listen:\n  control: 127.0.0.1:0\n")) ==
            "listen.control: expected host:port with a port in 1..65535, got \"127.0.0.1:0\"");
  }
  SECTION("client path relative") {
    REQUIRE(validate_error(replace(base_yaml, "/tmp/ferry-test.sock", "ferry.sock")) ==
            "listen.client: expected an absolute path, got \"ferry.sock\"");
  }
  SECTION("client path too long") {
    REQUIRE(
        validate_error(replace(base_yaml, "/tmp/ferry-test.sock", "/" + std::string(107, 'a'))) ==
        "listen.client: expected a path shorter than 108 bytes (unix socket limit), got a "
        "108-byte path");
  }
  SECTION("inflight writes") {
    REQUIRE(validate_error(base_yaml + "fabric: {max_inflight_writes: 0}\n") ==
            "fabric.max_inflight_writes: expected an integer in 1..65536, got 0");
  }
  SECTION("write piece") {
    REQUIRE(validate_error(base_yaml + "fabric: {write_piece_bytes: 1024}\n") ==
            "fabric.write_piece_bytes: expected an integer in 4096..1073741824, got 1024");
  }
  SECTION("timeout") {
    REQUIRE(validate_error(base_yaml + "timeouts: {transfer_ms: 3600001}\n") ==
            "timeouts.transfer_ms: expected an integer in 1..3600000, got 3600001");
    REQUIRE(validate_error(base_yaml + "timeouts: {waiting_for_input_ms: 0}\n") ==
            "timeouts.waiting_for_input_ms: expected an integer in 1..3600000, got 0");
    REQUIRE(validate_error(base_yaml + "timeouts: {heartbeat_ms: 5}\n") ==
            "timeouts.heartbeat_ms: expected an integer in 10..600000, got 5");
    REQUIRE(validate_error(base_yaml + "timeouts: {heartbeat_misses: 0}\n") ==
            "timeouts.heartbeat_misses: expected an integer in 1..1000, got 0");
    REQUIRE(validate_error(base_yaml + "timeouts: {drain_ms: 0}\n") ==
            "timeouts.drain_ms: expected an integer in 1..600000, got 0");
  }
  SECTION("a renamed timeout names its new key") {
    REQUIRE(parse_error(base_yaml + "timeouts: {prepare_wait_ms: 100}\n") ==
            "timeouts.prepare_wait_ms: unknown key (renamed to timeouts.bootstrapping_ms)");
  }
  SECTION("tp rank") {
    REQUIRE(validate_error(replace(base_yaml, "size: 1", "size: 2\n  rank: 2")) ==
            "tp.rank: expected a rank below tp.size 2, got 2");
  }
  SECTION("actor workers") {
    REQUIRE(validate_error(base_yaml + "runtime: {workers: 257}\n") ==
            "runtime.workers: expected an integer in 0..256, got 257");
    REQUIRE(validate_config(parse_ok(base_yaml + "runtime: {workers: 1}\n")));
    REQUIRE(auto_workers(0) == 1);
    REQUIRE(auto_workers(2) == 2);
  }
  SECTION("dp rank and size") {
    REQUIRE(validate_error(base_yaml + "dp: {size: 2, rank: 2}\n") ==
            "dp.rank: expected a rank below dp.size 2, got 2");
    REQUIRE(validate_error(base_yaml + "dp: {size: 0}\n") ==
            "dp.size: expected an integer in 1..1024, got 0");
    REQUIRE(parse_error(base_yaml + "dp: {size: 2, group: 1}\n") == "dp.group: unknown key");
  }
  SECTION("log level") {
    REQUIRE(validate_error(base_yaml + "log: {level: verbose}\n") ==
            "log.level: expected trace, debug, info, warn or error, got verbose");
  }
  SECTION("aux row bytes") {
    REQUIRE(validate_error(replace(base_yaml, "row_bytes: 5632", "row_bytes: 100")) ==
            "pools.aux.row_bytes: expected a multiple of 8 that is at least 64, got 100");
  }
  SECTION("no pools") {
    REQUIRE(validate_error("node: {name: a}\nlisten: {client: /tmp/a.sock}\nrole: decode\n") ==
            "pools: expected at least one of kv, mamba or aux for role decode, got none");
  }
  SECTION("pool larger than 1 TiB") {
    // 1 KiB pages x 2^29 pages x 4 buffers = 2^41 bytes.
    REQUIRE(validate_error(replace(base_yaml, "pages: 16", "pages: 536870912")) ==
            "pools.kv: expected at most 1099511627776 bytes (1 TiB) in total, got "
            "2199023255552");
  }
  SECTION("pending peers per source above the total") {
    REQUIRE(validate_error(base_yaml +
                           "limits: {max_pending_peers: 4, max_pending_peers_per_source: 5}\n") ==
            "limits.max_pending_peers_per_source: expected an integer in 1..4, got 5");
  }
  SECTION("peer preamble deadline") {
    REQUIRE(validate_error(base_yaml + "limits: {peer_preamble_ms: 5}\n") ==
            "limits.peer_preamble_ms: expected an integer in 10..600000, got 5");
  }
  SECTION("pool size overflowing 64 bits") {
    REQUIRE(validate_error(replace(base_yaml, "slots: 4", "slots: 18446744073709551615")) ==
            "pools.mamba: expected at most 1099511627776 bytes (1 TiB) in total, got more than "
            "2^64");
  }
}

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
  SECTION("awkward strings survive") {
    ferry_config cfg = parse_ok(base_yaml);
    cfg.node_name = "null";
    cfg.instance = "123";
    cfg.fabric.provider = "true";
    cfg.fabric.address = "a: b # c";
    cfg.pools.kv->mla = true;
    require_equal(cfg, parse_ok(to_yaml(cfg)));
  }
  SECTION("parallel positions survive") {
    ferry_config cfg = parse_ok(base_yaml);
    cfg.pp = {2, 1};
    cfg.dp = {4, 3};
    require_equal(cfg, parse_ok(to_yaml(cfg)));
  }
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
