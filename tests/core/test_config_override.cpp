// `ferryd --set key=value` (core/config.hpp, config_override.cpp): an override replaces or adds
// its key in the YAML tree before the typed parse, so its value meets the file's checks with
// the file's error texts, and a key that does not exist is refused naming it.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config_yaml.hpp"
#include "core/config.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

std::vector<config_override> sets(std::initializer_list<const char*> texts) {
  std::vector<config_override> out;
  for (const char* t : texts) {
    auto o = parse_override(t);
    INFO(t << ": " << o.message);
    REQUIRE(o);
    out.push_back(o.value);
  }
  return out;
}

ferry_config parse_with(std::initializer_list<const char*> texts) {
  auto r = parse_config_text(base_yaml, sets(texts));
  INFO(r.message);
  REQUIRE(r);
  return r.value;
}

std::string error_with(std::initializer_list<const char*> texts) {
  auto r = parse_config_text(base_yaml, sets(texts));
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::config_invalid);
  return r.message;
}

}  // namespace

TEST_CASE("a --set replaces a key of the file, adds an absent one, and the last one wins",
          "[unit][config]") {
  const auto plain = parse_ok(base_yaml);
  CHECK(plain.fabric.provider == "tcp");
  const auto cfg = parse_with({"fabric.provider=shm", "tp.size=2", "tp.rank=1", "runtime.workers=3",
                               "log.level=debug", "log.level=warn"});
  CHECK(cfg.fabric.provider == "shm");  // a section the file lacks is created
  CHECK(cfg.tp.size == 2);
  CHECK(cfg.tp.rank == 1);
  CHECK(cfg.runtime.workers == 3);
  CHECK(cfg.log.level == "warn");
  CHECK(cfg.node_name == plain.node_name);  // the rest is the file's
  CHECK(cfg.pools.kv->pages == plain.pools.kv->pages);
  CHECK(to_yaml(parse_with({})) == to_yaml(plain));
}

TEST_CASE("a --set takes YAML values: lists, list entries, and text after the first '='",
          "[unit][config]") {
  const auto cfg =
      parse_with({"pools.kv.layer_ids=[1, 5]", "pools.mamba.tensors[1].shape=[16, 128, 128]",
                  "listen.client=/tmp/a=b.sock"});
  CHECK(cfg.pools.kv->layer_ids == std::vector<uint32_t>{1, 5});
  CHECK(cfg.pools.mamba->tensors[1].shape == std::vector<uint64_t>{16, 128, 128});
  CHECK(cfg.pools.mamba->tensors[0].shape == std::vector<uint64_t>{8192, 3});
  CHECK(cfg.client_listen == "/tmp/a=b.sock");
}

TEST_CASE("a --set of a key that does not exist is refused naming it, as in the file",
          "[unit][config]") {
  CHECK(error_with({"fabric.providr=shm"}) == "fabric.providr: unknown key");
  CHECK(error_with({"fabric.providr=shm"}) ==
        parse_error(replace(base_yaml, "tp:\n", "fabric:\n  providr: shm\ntp:\n")));
  CHECK(error_with({"metricz.port=9"}) == "metricz: unknown key");
  CHECK(error_with({"pools.kv.page_tokenz=4"}) == "pools.kv.page_tokenz: unknown key");
  CHECK(error_with({"timeouts.prepare_wait_ms=5"}) ==
        "timeouts.prepare_wait_ms: unknown key (renamed to timeouts.bootstrapping_ms)");
}

TEST_CASE("values given with --set meet the file's type and range checks with the same texts",
          "[unit][config]") {
  CHECK(error_with({"tp.size=two"}) == parse_error(replace(base_yaml, "  size: 1", "  size: two")));
  CHECK(error_with({"tp.size='4'"}) == "tp.size: expected an integer, got \"4\"");
  CHECK(error_with({"role=x"}) == "role: expected prefill, decode or both, got x");
  CHECK(error_with({"role.x=1"}) == "role: expected a string, got a map");
  CHECK(error_with({"tp.size=[1"}).rfind("tp.size: --set value '[1' is not YAML: ", 0) == 0);
  CHECK(error_with({"pools.mamba.tensors[2].name=x"}) ==
        "pools.mamba.tensors: --set pools.mamba.tensors[2].name: no entry 2 in a list of 2");
  CHECK(error_with({"pools.kv[0]=x"}) ==
        "pools.kv: --set pools.kv[0]: expected a list to take entry 0 of, got a map");
  // Validation sees the overridden values as it sees the file's.
  const auto cfg = parse_with({"tp.rank=4"});
  const auto valid = validate_config(cfg);
  REQUIRE_FALSE(valid);
  CHECK(valid.message == "tp.rank: expected a rank below tp.size 1, got 4");
}

TEST_CASE("a --set text that is not key=value is refused naming it", "[unit][config]") {
  for (const char* bad : {"fabric.provider", "=shm", "tp..rank=1", ".tp=1", "tp.=1",
                          "pools.mamba.tensors[x].name=a", "pools.mamba.tensors[0.name=a"}) {
    INFO(bad);
    const auto o = parse_override(bad);
    REQUIRE_FALSE(o);
    CHECK(o.code == errc::config_invalid);
    CHECK(o.message.rfind(std::string("--set '") + bad + "': ", 0) == 0);
  }
  const auto empty = parse_override("security.cluster_secret_file=");
  REQUIRE(empty);
  CHECK(empty.value.value.empty());
}
