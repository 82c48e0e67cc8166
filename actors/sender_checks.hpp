#pragma once
/// A Sender's view of the core's prepare checks (core/peer_checks.hpp): what it hands them from
/// the daemon's context and the peer's handshake.

#include <cstdint>
#include <vector>

#include "actors/context.hpp"
#include "actors/messages.hpp"
#include "core/errors.hpp"
#include "core/peer_checks.hpp"

namespace ferry {

/// What this prefill holds of decode rank `from`, for the core's checks.
peer_terms terms_of(const peer_info& from);

/// The prepare's pages, state slot or pages, aux row and staging offset
/// (core/peer_checks.hpp's check_prepare_indices, against this daemon's pools).
result<> check_named_indices(const daemon_context& ctx, const peer_info& from,
                             const peer_prepare& p, const std::vector<uint32_t>& state_pages);

}  // namespace ferry
