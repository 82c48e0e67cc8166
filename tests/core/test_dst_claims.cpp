#include <catch2/catch.hpp>

#include "core/dst_claims.hpp"
#include "core/status.hpp"

using namespace ferry;

TEST_CASE("destination claims: whole or nothing, named conflicts, released by their room",
          "[unit][claims]") {
  dst_claims c(16, 4, 4);
  const std::vector<uint32_t> a{0, 1, 2}, b{3, 2}, d{3, 4};
  REQUIRE(c.claim(10, a, 1, 1));
  CHECK(c.held() == 5);
  auto e = c.claim(11, b, 2, 2);
  REQUIRE_FALSE(e);
  CHECK(e.code == errc::invalid_request);
  CHECK(e.message == "room 11: dst page 2 (position 1) is held by active room 10");
  CHECK(c.held() == 5);  // nothing of room 11 was claimed, page 3 included
  e = c.claim(12, d, 1, 3);
  REQUIRE_FALSE(e);
  CHECK(e.code == errc::invalid_request);
  CHECK(e.message == "room 12: dst state slot 1 is held by active room 10");
  e = c.claim(13, d, 3, 1);
  REQUIRE_FALSE(e);
  CHECK(e.code == errc::invalid_request);
  CHECK(e.message == "room 13: dst aux row 1 is held by active room 10");
  REQUIRE(c.claim(14, d, no_index, no_index));  // no slot, no row: pages only
  CHECK(c.held() == 7);
  CHECK(c.pages_held() == 5);
  CHECK(c.slots_held() == 1);
  CHECK(c.rows_held() == 1);
  c.release(99, a, 1, 1);  // not the holder: nothing changes
  CHECK(c.held() == 7);
  c.release(10, a, 1, 1);
  CHECK(c.held() == 2);
  CHECK(c.pages_held() == 2);
  CHECK(c.slots_held() == 0);
  CHECK(c.rows_held() == 0);
  REQUIRE(c.claim(11, std::vector<uint32_t>{2}, 2, 2));
  c.release(11, std::vector<uint32_t>{2}, 2, 2);
  c.release(14, d, no_index, no_index);
  CHECK(c.held() == 0);
  CHECK(c.pages_held() + c.slots_held() + c.rows_held() == 0);
}
