// ferry-soak: a bounded soak of one prefill ferryd and one decode ferryd, driven through their
// client sockets (docs/reliability.md, section 11).
//
// Rooms start at a target rate, up to `--concurrency` in flight. Each room takes random free
// source pages, slot and row on the prefill and random free destination pages, slot and row on
// the decode (never shared by two rooms in flight), fills the source with a pattern keyed by a
// key unique to this room incarnation, prepares on the decode, and sends 1-3 chunks on the
// prefill once the decode shows WaitingForInput. Room ids come from a small pool and are reused
// as soon as a room is terminal on both sides, so epochs are exercised all the time. Some rooms
// are cancelled, from either side, at a random phase.
//
// Every room must reach a terminal state on both sides within a bound (the daemons' timeouts
// plus a margin); one that does not is LOST. A Success on the decode is verified byte-exact at
// once (a mismatch is CORRUPTED), and each side's pages, slot and row go back to the free lists
// the moment that side is terminal: terminal means reusable, so a late write of an old room
// would land in a new room's pages and fail its verification.
//
// A daemon may be killed and restarted under the soak (scripts/soak.sh does it): the broken
// connection is re-made with bounded retries, the rooms in flight on the dead daemon count as
// failed by restart (its state died with it), and the surviving side must still report its
// terminal state for each of them within the bound.
//
// Single-threaded: one event loop polls both client sockets. The only timed waits are the
// pacing of the start rate, the retry interval of a reconnect, and the bounded re-reading of the
// daemons' status at the end.

#include "tools/soak/options.hpp"
#include "tools/soak/soak.hpp"

int main(int argc, char** argv) {
  ferry::soak::options o;
  if (auto rc = ferry::soak::parse_options(argc, argv, o)) return *rc;
  ferry::soak::soak s(o);
  return s.run();
}
