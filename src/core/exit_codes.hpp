#pragma once
/// The exit codes of every Ferry tool (ferryd, ferryctl, ferry-bench, ferry-soak), defined once
/// here and tabled in docs/cli.md. A script tells "the operation failed" from "the command line
/// was wrong", "ferryd is not there" and "it took too long" by the code alone.

#include <cstdint>

#include "core/errors.hpp"

namespace ferry::exit_code {

inline constexpr int ok = 0;
/// The operation failed: a room ended Failed, verify found wrong bytes, ferryd refused a
/// request, a benchmark or soak found failed, lost or corrupted rooms.
inline constexpr int failed = 1;
/// Usage: an option CLI11 refused (unknown, missing, out of range), a value ferryctl cannot
/// read (a page list), a ferryd config that does not parse or validate (`--set` included).
inline constexpr int usage = 2;
/// Cannot reach the daemon: its socket is missing or refuses, it is not a ferryd, or the
/// connection to it was lost before the operation's answer.
inline constexpr int unreachable = 3;
/// A bounded wait expired: `ferryctl wait --timeout-ms`, `wait-ready`, a reply that never came.
inline constexpr int timed_out = 4;
/// ferryd could not start: a second instance of the config, the pools (/dev/shm), the fabric,
/// memory registrations, the sockets, the locks.
inline constexpr int could_not_start = 5;
/// ferryd stopped without finishing its drain: a second stop signal, or timeouts.stop_ms
/// expiring, while rooms accepted before the stop were still active (their peers see them
/// fail). A drain that finished, or had nothing to wait for, exits `ok`.
inline constexpr int forced_stop = 6;

struct entry {
  int code;
  const char* name;
};
/// Every code, for docs and tests.
inline constexpr entry all[] = {{ok, "ok"},
                                {failed, "failed"},
                                {usage, "usage"},
                                {unreachable, "unreachable"},
                                {timed_out, "timed_out"},
                                {could_not_start, "could_not_start"},
                                {forced_stop, "forced_stop"}};

/// The exit code of a client operation that returned `code`: `connection_lost` when the
/// connection to ferryd broke (or never was made), which is `unreachable` whatever the code;
/// otherwise a timeout is `timed_out` and anything else ferryd answered is `failed`.
constexpr int for_error(errc code, bool connection_lost) {
  if (code == errc::ok) return ok;
  if (connection_lost) return unreachable;
  return code == errc::timed_out ? timed_out : failed;
}

}  // namespace ferry::exit_code
