// Pool layouts (src/core/layout.hpp) of the shipped Qwen3-Next-shaped decode config: buffer
// order, alignment, sizes, and the compatibility hash both daemons compare.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "core/config.hpp"
#include "core/layout.hpp"

using namespace ferry;

namespace {

pools_config decode_pools() {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  const auto r =
      load_config_file(std::string(dir ? dir : FERRY_DEFAULT_SOURCE_DIR) + "/configs/decode.yaml");
  INFO(r.message);
  REQUIRE(r);
  return r.value.pools;
}

}  // namespace

TEST_CASE("layout: buffers in order, 4 KiB aligned, inside their pool, never overlapping",
          "[unit][layout]") {
  const auto cfg = decode_pools();
  const auto l = make_layout(cfg);
  const auto& kv = *cfg.kv;
  const auto& k = l[pool_kind::kv];
  REQUIRE(k.present);
  // K of every layer, then V of every layer, each a page per item.
  REQUIRE(k.buffers.size() == 2 * kv.layer_ids.size());
  for (size_t i = 0; i < k.buffers.size(); ++i) {
    const auto& b = k.buffers[i];
    const bool first_half = i < kv.layer_ids.size();
    CHECK(b.kind == (first_half ? buffer_kind::k : buffer_kind::v));
    CHECK(b.layer_id == kv.layer_ids[i % kv.layer_ids.size()]);
    CHECK(b.items == kv.pages);
    CHECK(b.item_bytes == kv.page_bytes());
  }
  for (const auto* pool : {&l[pool_kind::kv], &l[pool_kind::state], &l[pool_kind::aux]}) {
    if (!pool->present) continue;
    uint64_t end = 0;
    for (const auto& b : pool->buffers) {
      CHECK(b.offset % 4096 == 0);
      CHECK(b.offset >= end);  // after the previous buffer
      end = b.offset + b.item_bytes * b.items;
    }
    CHECK(end <= pool->total_bytes);
  }
  const auto& aux = l[pool_kind::aux];
  REQUIRE(aux.present);
  REQUIRE(aux.buffers.size() == 1);
  CHECK(aux.buffers[0].kind == buffer_kind::aux);
  CHECK(aux.buffers[0].items == cfg.aux->rows);
}

TEST_CASE("layout: the compatibility hash is stable and sees a schema change", "[unit][layout]") {
  const auto a = decode_pools();
  auto b = decode_pools();
  CHECK(compatibility_hash(a) == compatibility_hash(b));
  b.kv->page_tokens *= 2;
  CHECK(compatibility_hash(a) != compatibility_hash(b));
  CHECK(std::string(to_string(pool_kind::state)) == "state");
  CHECK(std::string(to_string(buffer_kind::kv)) == "KV");
}
