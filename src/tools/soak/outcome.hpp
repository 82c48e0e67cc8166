#pragma once
/// What the end of a room counts as: the kinds the soak tallies, how the code of a daemon's
/// Failed status maps to one, and how its reason makes a line of the failure-reason table.

#include <string>

#include "core/errors.hpp"

namespace ferry::soak {

enum kind : int {
  k_success,
  k_cancelled,
  k_peer_failed,
  k_restarted,
  k_timed_out,
  k_other,
  k_lost
};
inline constexpr int kind_count = 7;
inline constexpr const char* kind_names[kind_count] = {
    "success", "cancelled", "peer_failed", "restarted", "timed_out", "other", "lost"};

/// The kind of a Failed status, by the code its poll reply or event carries (docs/protocol.md,
/// "Error codes": a room failed because of a peer carries a peer_* code, or the peer's own).
kind classify(errc code);

/// A reason with its numbers and instance ids blanked, so equal causes count together.
std::string normalize(const std::string& reason);

}  // namespace ferry::soak
