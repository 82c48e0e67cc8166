#pragma once
/// What a Sender checks in a decode rank's messages before it plans a write from them: the
/// indices of its prepare and the staging offset of its prepare or grant, against the layout and
/// staging region that rank declared at handshake. A buggy or hostile peer gets a refusal that
/// names the field, never a write outside its pools.

#include <cstdint>
#include <vector>

#include "actors/context.hpp"
#include "actors/messages.hpp"
#include "core/errors.hpp"

namespace ferry {

/// The prepare's pages, state slot or pages, aux row and staging offset.
result<> check_named_indices(const daemon_context& ctx, const peer_info& from,
                             const peer_prepare& p, const std::vector<uint32_t>& state_pages);

/// A staging offset for `pages` pages of room `room`: the landing block of this link must lie
/// inside the decode's staging region. `staging_on_request` passes only where `from` speaks
/// version 10 (it will grant the offset later).
result<> check_staging_offset(const peer_info& from, uint64_t room, uint64_t offset, size_t pages);

}  // namespace ferry
