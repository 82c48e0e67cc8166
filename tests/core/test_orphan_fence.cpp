// A decode room whose actor ended abnormally (core/orphan_fence.hpp): it fails only once every
// link still open has been fenced, and at once when none is.
#include <catch2/catch.hpp>

#include "core/orphan_fence.hpp"

using namespace ferry;

TEST_CASE("an orphaned decode room fails only after every open link is fenced",
          "[unit][orphan_fence]") {
  orphan_fence<int> f;
  CHECK_FALSE(f.waiting());
  const auto fence = f.ended({3, 5}, "internal error: room actor ended: boom");
  CHECK(fence == std::vector<int>{3, 5});
  CHECK(f.waiting());
  CHECK(f.reason() == "internal error: room actor ended: boom; its prefill links were fenced");
  CHECK_FALSE(f.fenced(7));  // a link the room never used
  CHECK_FALSE(f.fenced(3));  // one of two
  CHECK_FALSE(f.fenced(3));  // the same link again changes nothing
  CHECK(f.waiting());
  CHECK(f.fenced(5));  // the last: the room fails now
  CHECK_FALSE(f.waiting());
  CHECK_FALSE(f.fenced(5));  // and only once
}

TEST_CASE("an orphaned decode room with no open link fails at once with its own reason",
          "[unit][orphan_fence]") {
  orphan_fence<int> f;
  CHECK(f.ended({}, "internal error: room actor ended: boom").empty());
  CHECK_FALSE(f.waiting());
  CHECK(f.reason() == "internal error: room actor ended: boom");
  CHECK_FALSE(f.fenced(1));
}
