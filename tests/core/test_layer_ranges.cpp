// core/layer_ranges.hpp: a send's layer range against the rank's layers, and the record of which
// layers of the open chunk were sent (each once, the chunk named by its pages, complete once
// every layer was sent), with the exact texts of each refusal.

#include <catch2/catch.hpp>

#include "core/layer_ranges.hpp"
#include "core/layout.hpp"

using namespace ferry;

namespace {

/// The test daemons' layers: KV at 3, 7, 11, 15 and GDN state at 0, 4, 8.
const std::vector<uint32_t> rank_layers{0, 3, 4, 7, 8, 11, 15};

proto::send layers_of(std::vector<uint32_t> pages, uint32_t first, uint32_t count,
                      bool last = false) {
  proto::send s;
  s.room = 5;
  s.src_pages = std::move(pages);
  s.last = last;
  if (last) s.state_slot = s.aux_row = 1;
  s.first_layer = first;
  s.layer_count = count;
  return s;
}

std::string refusal(const result<>& r) {
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::invalid_request);
  return r.message;
}

}  // namespace

TEST_CASE("layer ranges: a rank's layers are its KV and state layer ids, ascending, once",
          "[unit][layer_ranges]") {
  pools_config c;
  c.kv = kv_pool_config{{11, 3, 7}, 1, 2, 256, 2, false, 4};
  mamba_pool_config m;
  m.slots = 2;
  m.layer_ids = {4, 0, 8};
  m.tensors = {{"conv", {8, 3}, 2, 0u, {}}, {"temporal", {2, 4, 4}, 4, 0u, {}}};
  c.mamba = m;
  c.aux = aux_pool_config{2, 64};
  CHECK(layer_ids(make_layout(c)) == std::vector<uint32_t>{0, 3, 4, 7, 8, 11});
  c.kv.reset();
  c.mamba.reset();
  CHECK(layer_ids(make_layout(c)).empty());  // an aux pool holds no layer
}

TEST_CASE("layer ranges: a range lies within the rank's layers and names one of them",
          "[unit][layer_ranges]") {
  CHECK(check_layer_range(rank_layers, 5, {}));       // whole
  CHECK(check_layer_range(rank_layers, 5, {0, 16}));  // every layer as one range
  CHECK(check_layer_range(rank_layers, 5, {15, 1}));  // the last
  CHECK(check_layer_range(rank_layers, 5, {1, 3}));   // [1, 4) holds 3
  CHECK(refusal(check_layer_range(rank_layers, 5, {3, 0})) ==
        "room 5: first_layer 3 given with layer_count 0 (a layer_count of 0 sends every layer)");
  CHECK(refusal(check_layer_range(rank_layers, 5, {12, 8})) ==
        "room 5: layers [12, 20) reach outside this rank's layers 0..15");
  CHECK(refusal(check_layer_range({24, 30, 47}, 5, {0, 24})) ==
        "room 5: layers [0, 24) reach outside this rank's layers 24..47");
  CHECK(refusal(check_layer_range(rank_layers, 5, {5, 2})) ==
        "room 5: layers [5, 7) name none of this rank's 7 layers (0..15)");
  CHECK(refusal(check_layer_range({}, 5, {0, 1})) ==
        "room 5: layers [0, 1) named, but this daemon's pools hold no layers");
  // first + count beyond u32: no wrap-around.
  CHECK(refusal(check_layer_range(rank_layers, 5, {0xFFFFFFF0u, 0x20})) ==
        "room 5: layers [4294967280, 4294967312) reach outside this rank's layers 0..15");
}

TEST_CASE("layer ranges: a chunk is complete once each of its layers was sent once",
          "[unit][layer_ranges]") {
  chunk_layers c(rank_layers);
  auto s = c.check(layers_of({1, 2}, 0, 4));  // 0 and 3
  REQUIRE(s);
  CHECK(s.value.opens);
  CHECK_FALSE(s.value.completes);
  CHECK(s.value.chunk == 0);
  c.take(layers_of({1, 2}, 0, 4));
  CHECK(c.open());
  // Out of order: the end first, then the middle.
  REQUIRE(c.check(layers_of({1, 2}, 11, 5)));
  c.take(layers_of({1, 2}, 11, 5));
  CHECK(c.check(layers_of({1, 2}, 3, 1)).message == "layer 3 of chunk 0 was already sent");
  CHECK(c.check(layers_of({1, 2}, 0, 16)).message == "layer 0 of chunk 0 was already sent");
  CHECK(c.check(layers_of({1, 2}, 0, 0)).message == "layer 0 of chunk 0 was already sent");
  CHECK(c.check(layers_of({9}, 4, 1)).message ==
        "chunk 0 is still open (3 of its 7 layers to send, layer 4 first): send them, naming the "
        "same pages, before another chunk");
  CHECK(c.check(layers_of({1, 2}, 4, 1, true)).message ==
        "chunk 0 was opened with last=0; a layer range of it cannot say last=1");
  auto end = c.check(layers_of({1, 2}, 4, 5));  // 4, 7, 8
  REQUIRE(end);
  CHECK_FALSE(end.value.opens);
  CHECK(end.value.completes);
  const auto st = c.take(layers_of({1, 2}, 4, 5));
  CHECK(st.completes);
  CHECK_FALSE(c.open());
  // The next chunk: a whole send opens and completes it at once.
  auto whole = c.check(layers_of({3}, 0, 0, true));
  REQUIRE(whole);
  CHECK(whole.value.opens);
  CHECK(whole.value.completes);
  CHECK(whole.value.chunk == 1);
}

TEST_CASE("layer ranges: the last chunk's ranges name the same slot and row",
          "[unit][layer_ranges]") {
  chunk_layers c(rank_layers);
  c.take(layers_of({}, 0, 1, true));  // a last chunk of no pages: state only
  auto other = layers_of({}, 3, 1, true);
  other.aux_row = 2;
  CHECK(c.check(other).message ==
        "chunk 0 named state slot 1 and aux row 1 with its first layers; this layer range names "
        "slot 1 and row 2");
  other.aux_row = no_index;
  CHECK(c.check(other).message ==
        "chunk 0 named state slot 1 and aux row 1 with its first layers; this layer range names "
        "slot 1 and row none");
  CHECK(c.check(layers_of({}, 1, 2, true)).message ==
        "layers [1, 3) name none of this rank's layers");
  CHECK(c.check(layers_of({}, 3, 13, true)).value.completes);
}

TEST_CASE("layer ranges: a rank without layers takes whole sends only", "[unit][layer_ranges]") {
  chunk_layers c;
  auto s = c.check(layers_of({}, 0, 0, true));
  REQUIRE(s);
  CHECK(s.value.opens);
  CHECK(s.value.completes);
  CHECK(c.check(layers_of({}, 0, 1, true)).message ==
        "layers [0, 1) name none of this rank's layers");
}
