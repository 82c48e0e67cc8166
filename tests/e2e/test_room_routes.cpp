// What reaches a room's actor, or answers a client, without the Scheduler: the routes of peer
// messages and landed writes (actors/room_routes.hpp) -- what is routed, what is left to the
// Scheduler, and that an ended incarnation never removes the route of the next one -- and the
// status board the client gateway answers polls from (transport/channels/status_board.hpp). In the
// process, with real actors of a real actor system (the e2e executable links the actors).
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "actors/room_routes.hpp"
#include "transport/channels/status_board.hpp"

using namespace ferry;

namespace {

/// An actor system with two actors that stand for room actors (they do nothing).
struct two_rooms {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::actor one = idle(), two = idle();
  ~two_rooms() {
    anon_send_exit(one, caf::exit_reason::user_shutdown);
    anon_send_exit(two, caf::exit_reason::user_shutdown);
  }
  caf::actor idle() {
    return sys.spawn([]() -> caf::behavior { return {[](int) {}}; });
  }
};

}  // namespace

TEST_CASE("a decode room's tokens route its prefill ranks' messages, until the room ends",
          "[routes]") {
  two_rooms actors;
  const auto &room = actors.one, &other = actors.two;
  room_routes routes;
  routes.add_decode(10, 2, room);
  const caf::actor_id link = 77;  // any link: the room checks which one spoke
  CHECK(routes.of(peer_prepare_ack{5, 10, true, {}, 0}, link) == room);
  CHECK(routes.of(peer_announce{5, 11, 3, 300}, link) == room);
  CHECK(routes.of(peer_drained{5, 11, 1, 0}, link) == room);
  CHECK(routes.of(peer_outcome{5, 10, true, false, "cancelled", 0}, link) == room);
  CHECK(routes.decode(11) == room);
  // Not its tokens, and a prefill-side outcome of the same room id: the Scheduler's.
  CHECK(!routes.of(peer_announce{5, 12, 3, 300}, link));
  CHECK(!routes.of(peer_outcome{5, 10, false, true, {}, 0}, link));
  // Removal names the actor: another one's removal leaves the routes.
  routes.remove_decode(10, 2, other);
  CHECK(routes.decode(10) == room);
  routes.remove_decode(10, 2, room);
  CHECK(!routes.decode(10));
  CHECK(!routes.of(peer_announce{5, 11, 3, 300}, link));
  CHECK(routes.size() == 0);
}

TEST_CASE("a prefill room routes a link's outcome only once it took that link's prepare",
          "[routes]") {
  two_rooms actors;
  const auto &first = actors.one, &second = actors.two;
  room_routes routes;
  const caf::actor_id a = 1, b = 2;
  const peer_outcome committed{7, 40, false, true, {}, 0};
  // No prepare taken yet: the outcome goes through the Scheduler, behind the prepare.
  CHECK(!routes.of(committed, a));
  routes.add_prefill(7, first, a);
  CHECK(routes.of(committed, a) == first);
  // Another link of the same room whose prepare is still on its way through the Scheduler.
  CHECK(!routes.of(committed, b));
  routes.add_prefill(7, first, b);
  CHECK(routes.of(committed, b) == first);
  // Prepares always go to the Scheduler, which opens and admits rooms.
  CHECK(!routes.of(peer_prepare{}, a));
  // A new incarnation under the same id replaces the route; the old one's removal keeps it.
  routes.add_prefill(7, second, b);
  CHECK(routes.of(committed, b) == second);
  CHECK(!routes.of(committed, a));
  routes.remove_prefill(7, first);
  CHECK(routes.of(committed, b) == second);
  routes.remove_prefill(7, second);
  CHECK(!routes.of(committed, b));
}

TEST_CASE("polls of rooms in progress are answered from the status board, terminal ones are not",
          "[routes]") {
  status_board board;
  board.set(9, true, room_status::bootstrapping, 0);
  auto p = board.poll(9);
  REQUIRE(p);
  CHECK((p->room == 9 && p->status == room_status::bootstrapping && p->code == errc::ok));
  board.set(9, true, room_status::transferring, 0);
  CHECK(board.poll(9)->status == room_status::transferring);
  // A daemon of both roles with the room on each side answers the decode's, as the Scheduler.
  board.set(9, false, room_status::waiting_for_input, 12);
  CHECK(board.poll(9)->status == room_status::transferring);
  // A terminal status is never answered here: the Scheduler answers it with its reason.
  board.set(9, true, room_status::success, 0);
  p = board.poll(9);
  REQUIRE(p);
  CHECK((p->status == room_status::waiting_for_input && p->prefix_tokens == 12));
  board.erase(9, false);
  CHECK(!board.poll(9));
  CHECK(board.size() == 0);
  // poll_many: every room here, or the Scheduler answers all of them.
  board.set(1, true, room_status::transferring, 0);
  board.set(2, false, room_status::bootstrapping, 0);
  auto many = board.poll_many({2, 1});
  REQUIRE(many);
  REQUIRE(many->rooms.size() == 2);
  CHECK((many->rooms[0].room == 2 && many->rooms[1].status == room_status::transferring));
  CHECK(!board.poll_many({1, 3}));
  board.set(1, true, room_status::failed, 0);
  CHECK(!board.poll(1));
  CHECK(board.answered() == 5);  // the polls and poll_many answered here, no others
  // Why a room waits is its reason, until its side's next set.
  board.set(4, true, room_status::waiting_for_input, 0, "waiting for 64 bytes of staging");
  CHECK(board.poll(4)->reason == "waiting for 64 bytes of staging");
  board.set(4, true, room_status::transferring, 0);
  CHECK(board.poll(4)->reason == "");
}
