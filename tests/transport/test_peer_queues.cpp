// Per-peer posting queues: one write per turn across peers; within a peer, fewest bytes left
// first, with every oldest_every-th write to the oldest item. Pure, no fabric.

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>

#include "transport/peer_queues.hpp"

namespace {

/// An item: its name and the writes it has left (one unit of size each).
using item = std::pair<std::string, int>;
struct writes_left {
  uint64_t operator()(const item* i) const { return static_cast<uint64_t>(i->second); }
};
using queues = ferry::transport::peer_queues<item*, writes_left>;

/// Simulate the progress loop: post one write per turn and record the order in which items
/// finish posting, and (if asked) the name of the item of every write.
std::vector<std::string> drain(queues& q, std::vector<std::string>* writes = nullptr) {
  std::vector<std::string> finished;
  for (int guard = 0; guard < 100000 && !q.empty(); ++guard) {
    auto* it = q.front();
    if (it->second == 0) {
      finished.push_back(it->first);
      q.pop_front();
      continue;
    }
    --it->second;
    if (writes) writes->push_back(it->first);
    q.next_turn();
  }
  return finished;
}

}  // namespace

TEST_CASE("fabric: a small batch to one peer is not stuck behind a large batch to another",
          "[unit][fabric]") {
  queues q;
  item big{"big to A", 1000}, small{"small to B", 1};
  q.push(1, &big);
  q.push(2, &small);
  CHECK(drain(q) == std::vector<std::string>{"small to B", "big to A"});
}

TEST_CASE("fabric: a small batch to a peer goes before the rest of a large one to that peer",
          "[unit][fabric]") {
  queues q;
  item big{"big", 100}, small{"small", 3};
  q.push(1, &big);
  std::vector<std::string> writes;
  // Two writes of the large batch are posted; then the small one comes.
  for (int i = 0; i < 2; ++i) {
    --q.front()->second;
    q.next_turn();
  }
  q.push(1, &small);
  CHECK(drain(q, &writes) == std::vector<std::string>{"small", "big"});
  CHECK(std::vector<std::string>(writes.begin(), writes.begin() + 3) ==
        std::vector<std::string>{"small", "small", "small"});
  CHECK(big.second == 0);
}

TEST_CASE("fabric: equal batches to one peer finish in the order they came", "[unit][fabric]") {
  queues q;
  item a1{"A1", 5}, a2{"A2", 5}, a3{"A3", 5};
  q.push(1, &a1);
  q.push(1, &a2);
  q.push(1, &a3);
  CHECK(drain(q) == std::vector<std::string>{"A1", "A2", "A3"});
}

TEST_CASE("fabric: a stream of small batches leaves the oldest batch every eighth write",
          "[unit][fabric]") {
  queues q;
  item big{"big", 10};
  q.push(1, &big);
  std::vector<item> smalls(200);
  std::vector<std::string> writes;
  // A new 1-write batch arrives before every write: shortest first alone would starve "big".
  for (size_t i = 0; i < smalls.size() && big.second > 0; ++i) {
    smalls[i] = {"small", 1};
    q.push(1, &smalls[i]);
    auto* it = q.front();
    if (it->second == 0) {  // a finished small batch: leave the queue, no write
      q.pop_front();
      it = q.front();
    }
    --it->second;
    writes.push_back(it->first);
    q.next_turn();
  }
  CHECK(big.second == 0);
  const auto big_writes = std::count(writes.begin(), writes.end(), std::string("big"));
  CHECK(big_writes == 10);
  // It had at least every eighth write of the peer (more once it became the shortest).
  for (size_t i = 0; i + queues::oldest_every <= writes.size(); i += queues::oldest_every)
    CHECK(std::count(writes.begin() + i, writes.begin() + i + queues::oldest_every,
                     std::string("big")) >= 1);
  CHECK(writes.size() < 10 * queues::oldest_every);
}

TEST_CASE("fabric: the item chosen for a turn stays the front until the turn ends",
          "[unit][fabric]") {
  queues q;
  item big{"big", 10}, small{"small", 1};
  q.push(1, &big);
  auto* chosen = q.front();
  q.push(1, &small);  // shorter, but the turn (a split commit's data and marker) is big's
  CHECK(q.front() == chosen);
  --big.second;
  q.next_turn();
  CHECK(q.front() == &small);
}

TEST_CASE("fabric: a peer passed over keeps its items and its choice", "[unit][fabric]") {
  queues q;
  item a{"A", 2}, b{"B", 2};
  q.push(1, &a);
  q.push(2, &b);
  CHECK(q.peers() == 2);
  CHECK(q.front() == &a);
  q.skip_peer();  // A's bytes in flight are at their bound
  CHECK(q.front() == &b);
  q.skip_peer();
  CHECK(q.front() == &a);
}

TEST_CASE("fabric: erase_if and take_all leave consistent turns", "[unit][fabric]") {
  queues q;
  item a10{"10", 1}, b20{"20", 1}, a11{"11", 2};
  q.push(1, &a10);
  q.push(2, &b20);
  q.push(1, &a11);
  q.erase_if([](const item* x) { return x->first == "20"; });
  CHECK(q.front() == &a10);
  q.next_turn();  // only peer 1 is left: its turn again
  CHECK(q.front() == &a10);
  q.pop_front();
  CHECK(q.front() == &a11);
  q.erase_if([](const item* x) { return x->first == "11"; });  // the chosen one
  CHECK(q.empty());
  q.push(1, &a11);
  auto all = q.take_all();
  CHECK(all == std::vector<item*>{&a11});
  CHECK(q.empty());
}

TEST_CASE("fabric: an item whose size shrank outside its turn goes first once the queues refresh",
          "[unit][fabric]") {
  queues q;
  item big{"big", 50}, mid{"mid", 20};
  q.push(1, &big);
  q.push(1, &mid);
  big.second = 1;  // cancelled: only its marker is left
  q.refresh();
  std::vector<std::string> writes;
  drain(q, &writes);
  REQUIRE(!writes.empty());
  CHECK(writes.front() == "big");
}
