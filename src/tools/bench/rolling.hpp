#pragma once
/// ferry-bench --rolling (rolling.cpp): a rolling restart's rehearsal. Each --prefill-socket is
/// an independent prefill instance (one daemon, its own node and control address); rooms go to
/// them in turn, --concurrency in flight, to the one decode instance (--decode-socket, its
/// ranks). A room refused because its prefill drains (407, from the prefill's `send` or as the
/// decode room's reason) or has gone (its connection to the bench closed) is sent again as a new
/// room to the next instance that still takes rooms; that instance gets no new room in the run.
/// Connections stay open until every room a daemon accepted has ended on it, so the bench's
/// exit cancels none of them. Every request is counted once, committed or failed (by code), and
/// every attempt refused and retried is counted by code.
///
/// `--pause-after N` gives a script (or an operator) the moment to drain a daemon: after N
/// requests ended, the bench lets the rooms in flight end, holds one room prepared on every
/// instance (accepted by it, not sent), says `ferry-bench: paused ...` on stderr and goes on at a
/// line on stdin (or its end). A daemon drained then keeps its held room, which is sent once
/// the bench goes on, and exits once it ended; the next room for it is refused with 407 and
/// retried elsewhere.

#include <CLI/CLI.hpp>
#include <cstdint>

#include "tools/bench/scale.hpp"

namespace ferry::bench::rolling {

struct options {
  bool on = false;           ///< --rolling
  uint32_t pause_after = 0;  ///< --pause-after: pause once this many requests ended (0: never)
};

/// Register --rolling and --pause-after on `app`.
void add_options(CLI::App& app, options& o);
/// Run the rehearsal; the process's exit code (core/exit_codes.hpp).
int run(const options& o, const scale::common& c);

}  // namespace ferry::bench::rolling
