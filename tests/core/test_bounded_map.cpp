// core/bounded_map.hpp: the Scheduler's bounded histories keep the newest `limit` keys, oldest
// forgotten first, and stay bounded whatever the mix of insertions and erasures.

#include <catch2/catch.hpp>
#include <string>

#include "core/bounded_map.hpp"

using ferry::bounded_map;

TEST_CASE("bounded map: the oldest key goes first, an assignment keeps its place",
          "[unit][bounded_map]") {
  bounded_map<int, std::string> m(3);
  CHECK(m.put(1, "a"));
  CHECK(m.put(2, "b"));
  CHECK(m.put(3, "c"));
  CHECK_FALSE(m.put(1, "a2"));  // assigned, still the oldest
  CHECK(*m.find(1) == "a2");
  CHECK(m.put(4, "d"));
  CHECK_FALSE(m.contains(1));
  CHECK(m.contains(2));
  CHECK(m.contains(3));
  CHECK(m.contains(4));
  CHECK(m.size() == 3);
  CHECK(m.find(1) == nullptr);
}

TEST_CASE(
    "bounded map: a key erased and inserted again is young, its old place does not evict "
    "it",
    "[unit][bounded_map]") {
  bounded_map<int, int> m(2);
  m.put(1, 10);
  m.put(2, 20);
  m.erase(1);
  m.put(1, 11);  // now younger than 2
  m.put(3, 30);  // evicts 2, not the new 1
  CHECK(m.contains(1));
  CHECK(*m.find(1) == 11);
  CHECK_FALSE(m.contains(2));
  CHECK(m.contains(3));
}

TEST_CASE("bounded map: get_or_put keeps the first value", "[unit][bounded_map]") {
  bounded_map<int, int> m(4);
  CHECK(m.get_or_put(7, 1) == 1);
  CHECK(m.get_or_put(7, 2) == 1);
  CHECK(m.size() == 1);
}

TEST_CASE("bounded map: memory stays bounded under insertions and erasures",
          "[unit][bounded_map]") {
  bounded_map<int, int> m(16);
  m.put(-1, 0);  // a live key at the front, never erased
  for (int i = 0; i < 100000; ++i) {
    m.put(i, i);
    if (i % 2 == 0) m.erase(i);
  }
  CHECK(m.size() <= 16);
  CHECK(m.places() <= 2 * 16 + 64 + 1);
  bounded_map<int, int> e(16);
  e.put(-1, 0);
  for (int i = 0; i < 100000; ++i) {  // every key erased at once: nothing ever evicted
    e.put(i, i);
    e.erase(i);
  }
  CHECK(e.size() == 1);
  CHECK(e.places() <= 2 * 1 + 64 + 1);
}
