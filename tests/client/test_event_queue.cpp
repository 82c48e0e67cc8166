// ferry/event_queue.hpp (the C++ client's): the client's kept events, in order and by room.

#include <catch2/catch.hpp>

#include "ferry/event_queue.hpp"

using namespace ferry;
using proto::event;

namespace {

event ev(uint64_t room, room_status s, std::string reason = {}) {
  return event{room, s, std::move(reason), s == room_status::failed ? errc::peer_lost : errc::ok,
               0};
}

}  // namespace

TEST_CASE("kept events come out in arrival order", "[unit]") {
  client::event_queue q;
  CHECK(q.empty());
  CHECK_FALSE(q.pop_front());
  q.push(ev(1, room_status::waiting_for_input));
  q.push(ev(2, room_status::success));
  q.push(ev(1, room_status::success));
  CHECK(q.size() == 3);
  CHECK(q.pop_front()->room == 1);
  auto second = q.pop_front();
  CHECK(second->room == 2);
  CHECK(second->status == room_status::success);
  CHECK(q.pop_front()->status == room_status::success);
  CHECK(q.empty());
  CHECK(q.rooms_with_terminal() == 0);
}

TEST_CASE("a room's terminal event is taken out of the middle, once", "[unit]") {
  client::event_queue q;
  q.push(ev(1, room_status::transferring));
  q.push(ev(2, room_status::failed, "first"));
  q.push(ev(3, room_status::success));
  q.push(ev(2, room_status::success, "second"));  // a reused id's next incarnation
  CHECK_FALSE(q.take_terminal(1));                // only a non-terminal event of room 1
  auto t = q.take_terminal(2);
  REQUIRE(t);
  CHECK(t->reason == "first");  // the oldest
  CHECK(q.take_terminal(2)->reason == "second");
  CHECK_FALSE(q.take_terminal(2));
  // What next_event still hands out: the rest, in order.
  CHECK(q.pop_front()->room == 1);
  CHECK(q.pop_front()->room == 3);
  CHECK(q.empty());
  CHECK(q.rooms_with_terminal() == 0);
}

TEST_CASE("a terminal event handed out in order is no longer kept for its room", "[unit]") {
  client::event_queue q;
  q.push(ev(5, room_status::success));
  CHECK(q.pop_front()->room == 5);
  CHECK_FALSE(q.take_terminal(5));
}

TEST_CASE("dropping a room's events drops its terminal places too", "[unit]") {
  client::event_queue q;
  q.push(ev(7, room_status::failed, "lost"));
  q.push(ev(8, room_status::success));
  q.push(ev(7, room_status::bootstrapping));
  q.erase_room(7, [](const event& e) { return e.status == room_status::failed; });
  CHECK(q.size() == 2);
  CHECK_FALSE(q.take_terminal(7));
  q.erase_room(7, [](const event&) { return true; });
  CHECK(q.size() == 1);
  CHECK(q.take_terminal(8)->room == 8);
  CHECK(q.empty());
}

TEST_CASE("thousands of rooms waited for in any order", "[unit]") {
  constexpr uint64_t rooms = 10000;
  client::event_queue q;
  for (uint64_t r = 0; r < rooms; ++r) {
    q.push(ev(r, room_status::bootstrapping));
    q.push(ev(r, room_status::waiting_for_input));
  }
  for (uint64_t r = 0; r < rooms; ++r) q.push(ev(r, room_status::success));
  for (uint64_t r = rooms; r-- > 0;) {  // the last to arrive first
    auto t = q.take_terminal(r);
    REQUIRE(t);
    REQUIRE(t->room == r);
  }
  CHECK(q.size() == 2 * rooms);
  CHECK(q.rooms_with_terminal() == 0);
  for (uint64_t r = 0; r < rooms; ++r) {
    REQUIRE(q.pop_front()->status == room_status::bootstrapping);
    REQUIRE(q.pop_front()->status == room_status::waiting_for_input);
  }
  CHECK(q.empty());
}
