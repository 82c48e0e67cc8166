// validate_config (core/config.hpp): a config that parses but breaks a rule is refused with an
// error naming the key and the value seen. Each section breaks one thing in the base config of
// config_yaml.hpp.
#include <catch2/catch.hpp>
#include <string>

#include "config_yaml.hpp"
#include "core/config.hpp"

using namespace ferry;
using namespace ferry::test;

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
            "holds an equal share of every group), got 2047 (a group held whole by several ranks "
            "is described with shard_units)");
  }
  SECTION("shard units: a group replicated on every rank (Mamba2, n_groups 1 at TP 2)") {
    // conv [x | B | C] = [8192 | 128 | 128] in units [64 heads, 1 group, 1 group]: at TP 2 a
    // rank holds 4096 + 128 + 128.
    std::string yaml = replace(base_yaml, "size: 1", "size: 2");
    yaml = replace(yaml, "[8192, 3]", "[4352, 3]");
    yaml = replace(yaml, "[32, 128, 128]", "[16, 128, 128]");
    yaml = replace(yaml, "shard_groups: [2048, 2048, 4096]",
                   "shard_groups: [8192, 128, 128]\n        shard_units: [64, 1, 1]");
    const ferry_config cfg = parse_ok(yaml);
    REQUIRE(validate_config(cfg));
    REQUIRE(cfg.pools.mamba->tensors[0].shard_units == std::vector<uint64_t>{64, 1, 1});
    SECTION("a shape that is not the groups' shares") {
      REQUIRE(validate_error(replace(yaml, "[4352, 3]", "[4160, 3]")) ==
              "pools.mamba.tensors[0].shard_groups: expected the groups' shares at tp.size 2 to "
              "sum to shape[0] = 4160, got 4352 (groups summing to 8448)");
    }
    SECTION("one entry per group") {
      REQUIRE(validate_error(replace(yaml, "[64, 1, 1]", "[64, 1]")) ==
              "pools.mamba.tensors[0].shard_units: expected one entry per shard group (3), got 2");
    }
    SECTION("units divide their group") {
      REQUIRE(validate_error(replace(yaml, "[64, 1, 1]", "[64, 3, 1]")) ==
              "pools.mamba.tensors[0].shard_units[1]: expected a divisor of shard_groups[1] = 128 "
              "(units are equal), got 3");
    }
    SECTION("units and tp.size: one divides the other") {
      std::string three = replace(yaml, "[8192, 128, 128]", "[8192, 96, 96]");
      three = replace(three, "[64, 1, 1]", "[64, 3, 3]");
      REQUIRE(validate_error(three) ==
              "pools.mamba.tensors[0].shard_units[1]: expected a multiple or a divisor of tp.size "
              "2 (each rank holds an equal share of the group's units, or one whole unit that "
              "tp.size / units ranks hold alike), got 3");
    }
    SECTION("a unit count of 0") {
      REQUIRE(validate_error(replace(yaml, "[64, 1, 1]", "[64, 0, 1]")) ==
              "pools.mamba.tensors[0].shard_units[1]: expected a positive integer, got 0");
    }
  }
  SECTION("the model contract and dtype names") {
    const std::string model =
        "model:\n  architecture: Qwen3NextForCausalLM\n  state_covers: n\n"
        "  fields: {linear_num_value_heads: 32, linear_conv_kernel_dim: 4}\n";
    const ferry_config cfg = parse_ok(base_yaml + model);
    REQUIRE(validate_config(cfg));
    REQUIRE(cfg.model);
    CHECK(cfg.model->architecture == "Qwen3NextForCausalLM");
    CHECK(cfg.model->state_covers == "n");
    // sorted by key, values as written
    CHECK(cfg.model->fields ==
          std::vector<std::pair<std::string, std::string>>{{"linear_conv_kernel_dim", "4"},
                                                           {"linear_num_value_heads", "32"}});
    CHECK(validate_error(base_yaml + replace(model, "state_covers: n", "state_covers: all")) ==
          "model.state_covers: expected n (the state covers all N prompt tokens) or n_minus_1 (all "
          "but the last), got \"all\"");
    CHECK(validate_error(replace(base_yaml, "        dtype_bytes: 4\n        slice_axis: 0\n",
                                 "        dtype_bytes: 4\n        dtype: bf16\n        "
                                 "slice_axis: 0\n")) ==
          "pools.mamba.tensors[1].dtype: expected a type 4 bytes wide (dtype_bytes), got bf16 (2 "
          "bytes)");
    CHECK_THAT(validate_error(replace(base_yaml, "        dtype_bytes: 4\n        slice_axis: 0\n",
                                      "        dtype_bytes: 4\n        dtype: float\n        "
                                      "slice_axis: 0\n")),
               Catch::Matchers::StartsWith("pools.mamba.tensors[1].dtype: expected one of bf16, "
                                           "fp16, fp32") &&
                   Catch::Matchers::EndsWith("got \"float\""));
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
  SECTION("metrics address") {
    REQUIRE(validate_error(replace(base_yaml, "listen:\n", "listen:\n  metrics: 9464\n")) ==
            "listen.metrics: expected host:port with a port in 1..65535 (or nothing: no metrics "
            "endpoint), got \"9464\"");
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
  SECTION("inflight bytes") {
    REQUIRE(validate_error(base_yaml + "fabric: {max_inflight_bytes: 10}\n") ==
            "fabric.max_inflight_bytes: expected an integer in 4096..1099511627776, got 10");
  }
  SECTION("pack threshold") {
    REQUIRE(validate_error(base_yaml + "fabric: {pack_threshold_bytes: 2147483648}\n") ==
            "fabric.pack_threshold_bytes: expected an integer in 0..1073741824, got 2147483648");
  }
  SECTION("rails") {
    REQUIRE(validate_error(base_yaml + "fabric: {rails: 0}\n") ==
            "fabric.rails: expected an integer in 1..16, got 0");
    REQUIRE(validate_error(base_yaml + "fabric: {rails: 17}\n") ==
            "fabric.rails: expected an integer in 1..16, got 17");
    REQUIRE(validate_error(base_yaml + "fabric: {express_bytes: 100}\n") ==
            "fabric.express_bytes: expected an integer in 4096..1073741824, got 100");
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
            "log.level: expected trace, debug, info, warn, error or off, got verbose");
    REQUIRE(validate_error(base_yaml + "log: {levels: {peer: loud}}\n") ==
            "log.levels.peer: expected trace, debug, info, warn, error or off, got loud");
    REQUIRE(validate_error(base_yaml + "log: {format: xml}\n") ==
            "log.format: expected text or json, got xml");
    REQUIRE(parse_error(base_yaml + "log: {levels: {fabric: debug}}\n") ==
            "log.levels.fabric: unknown key");
    REQUIRE(validate_error(base_yaml + "log: {summary_ms: 50}\n") ==
            "log.summary_ms: expected an integer in 100..86400000, got 50");
    REQUIRE(validate_error(base_yaml + "log: {burst: 2000000}\n") ==
            "log.burst: expected an integer in 0..1000000, got 2000000");
    const auto limits = parse_ok(base_yaml + "log: {summary_ms: 5000, burst: 0}\n");
    REQUIRE(validate_config(limits));
    REQUIRE(limits.log.summary_ms == 5000);
    REQUIRE(limits.log.burst == 0);
    REQUIRE(parse_ok(base_yaml).log.summary_ms == 60000);
    REQUIRE(parse_ok(base_yaml).log.burst == 20);
    const auto cfg =
        parse_ok(base_yaml + "log: {format: json, levels: {transport: warn, peer: debug}}\n");
    REQUIRE(validate_config(cfg));
    REQUIRE(cfg.log.format == "json");
    // In logger_names order, whatever order the file says them in.
    REQUIRE(cfg.log.levels == std::vector<std::pair<std::string, std::string>>{
                                  {"peer", "debug"}, {"transport", "warn"}});
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
    REQUIRE(validate_error(replace(base_yaml, "shape: [32, 128, 128]",
                                   "shape: [32, 128, 18446744073709551615]")) ==
            "pools.mamba: expected at most 1099511627776 bytes (1 TiB) in total, got more than "
            "2^64");
  }
  SECTION("more items than a u32 index names") {
    REQUIRE(validate_error(replace(base_yaml, "slots: 4", "slots: 18446744073709551615")) ==
            "pools.mamba.slots: expected fewer than 4294967295 (a request names one by a u32 "
            "index), got 18446744073709551615");
  }
  SECTION("a plan of too many segments") {
    REQUIRE(validate_error(replace(base_yaml,
                                   "shape: [8192, 3]\n        dtype_bytes: 2\n        slice_axis: "
                                   "0\n        shard_groups: [2048, 2048, 4096]",
                                   "shape: [70000, 3]\n        dtype_bytes: 2\n        "
                                   "slice_axis: 1")) ==
            "pools.mamba.tensors[0].shape: expected at most 65536 dims before the sliced axis "
            "times its shard groups, got 70000 x 1");
  }
}
