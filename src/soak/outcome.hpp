#pragma once
/// What the end of a room counts as: the kinds the soak tallies, and how a daemon's Failed reason
/// maps to one (or to a line of the failure-reason table).

#include <string>

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

/// The kind of a Failed reason (the daemons' texts; docs/reliability.md).
kind classify(const std::string& reason);

/// A reason with its numbers and instance ids blanked, so equal causes count together.
std::string normalize(const std::string& reason);

}  // namespace ferry::soak
