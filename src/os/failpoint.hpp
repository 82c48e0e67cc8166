#pragma once
/// Failpoints: named places where a test can make the daemon fail on purpose, to prove a path
/// that no outside input can reach (an actor that dies of an exception). Off unless the
/// environment variable FERRY_FAILPOINTS names them when the process starts:
///
///   FERRY_FAILPOINTS=receiver_throw_on_accepted      fires every time
///   FERRY_FAILPOINTS=receiver_throw_on_accepted=1    fires once
///
/// Items are separated by commas; a name is lower-case letters, digits and '_', a count a whole
/// number. Anything else is refused (`failpoints_invalid`), and sets none.
///
/// A daemon with failpoints set logs each of them at start (see `active_failpoints`). Costs one
/// relaxed atomic load per check when none is set.

#include <string>
#include <string_view>

namespace ferry::os {

/// True when failpoint `name` is set and has firings left (each true answer uses one).
bool failpoint(std::string_view name);

/// The failpoints set in the environment, as given ("" when none), for the start-up log.
std::string active_failpoints();

/// Why FERRY_FAILPOINTS is refused, naming the item ("" when it is well formed or unset). A
/// refused setting sets no failpoint, and ferryd does not start with one.
std::string failpoints_invalid();

}  // namespace ferry::os
