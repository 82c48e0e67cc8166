// Per-peer posting queues: FIFO within a peer, one write per turn across peers. Pure, no fabric.

#include <catch2/catch.hpp>
#include <string>

#include "transport/peer_queues.hpp"

using ferry::transport::peer_queues;

namespace {

/// Simulate the progress loop: each item is (name, writes left); post one write per turn and
/// record the order in which items finish posting.
std::vector<std::string> drain(peer_queues<std::pair<std::string, int>*>& q) {
  std::vector<std::string> finished;
  while (!q.empty()) {
    auto* item = q.front();
    if (item->second == 0) {
      finished.push_back(item->first);
      q.pop_front();
      continue;
    }
    --item->second;
    q.next_turn();
  }
  return finished;
}

}  // namespace

TEST_CASE("fabric: a small batch to one peer is not stuck behind a large batch to another",
          "[unit][fabric]") {
  peer_queues<std::pair<std::string, int>*> q;
  std::pair<std::string, int> big{"big to A", 1000}, small{"small to B", 1};
  q.push(1, &big);
  q.push(2, &small);
  CHECK(drain(q) == std::vector<std::string>{"small to B", "big to A"});
}

TEST_CASE("fabric: batches to the same peer stay first in, first out", "[unit][fabric]") {
  peer_queues<std::pair<std::string, int>*> q;
  std::pair<std::string, int> a1{"A1", 5}, a2{"A2", 1}, b1{"B1", 3};
  q.push(1, &a1);
  q.push(1, &a2);
  q.push(2, &b1);
  // A1 (5 writes) and B1 (3 writes) alternate; A2 waits for A1 although it is shorter.
  CHECK(drain(q) == std::vector<std::string>{"B1", "A1", "A2"});
}

TEST_CASE("fabric: erase_if and take_all leave consistent turns", "[unit][fabric]") {
  peer_queues<int> q;
  q.push(1, 10);
  q.push(2, 20);
  q.push(1, 11);
  q.erase_if([](int x) { return x == 20; });
  CHECK(q.front() == 10);
  q.next_turn();  // only peer 1 is left: its turn again
  CHECK(q.front() == 10);
  q.pop_front();
  CHECK(q.front() == 11);
  auto all = q.take_all();
  CHECK(all == std::vector<int>{11});
  CHECK(q.empty());
}
