// ThreadSanitizer canary for scripts/tsan.sh: does TSan see races between CAF actors, and only
// real ones, with the libcaf this process loads?
//   caf_canary own N     one actor updates its own state for N messages: no race by the actor
//                        model; any report is a false positive (uninstrumented libcaf)
//   caf_canary shared N  two actors increment one global without a lock: a real race, which
//                        must be reported (else TSan is blind to races between actors)
#include <caf/all.hpp>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using bump_atom = caf::atom_constant<caf::atom("bump")>;

long unlocked_counter = 0;  // the race of mode "shared"

struct own_state {
  std::vector<long> hits = std::vector<long>(4, 0);
};

caf::behavior own_actor(caf::stateful_actor<own_state>* self) {
  return {[=](bump_atom, int i) { self->state.hits[i % 4] += 1; }};
}

caf::behavior shared_actor(caf::event_based_actor*) {
  return {[=](bump_atom, int) { unlocked_counter += 1; }};  // tsan-canary-race
}

}  // namespace

int main(int argc, char** argv) {
  const bool shared = argc > 1 && std::strcmp(argv[1], "shared") == 0;
  const int n = argc > 2 ? std::atoi(argv[2]) : 2000;
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);  // as ferryd
  cfg.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys{cfg};
  if (shared) {
    auto a = sys.spawn(shared_actor);
    auto b = sys.spawn(shared_actor);
    for (int i = 0; i < n; ++i) {
      caf::anon_send(a, bump_atom::value, i);
      caf::anon_send(b, bump_atom::value, i);
    }
  } else {
    auto a = sys.spawn(own_actor);
    for (int i = 0; i < n; ++i) caf::anon_send(a, bump_atom::value, i);
  }
  return 0;
}
