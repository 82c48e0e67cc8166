#pragma once
/// Deterministic request payloads: fill a room's source pages, state slot and aux row on the
/// prefill side, and check every destination byte on the decode side. The content of each item
/// depends on (room, buffer, position in the request), never on which pages were used.

#include <cstdint>
#include <span>
#include <string>

#include "ferry/client.hpp"
#include "tools/workload/daemon_config.hpp"

namespace ferry::client {

/// Pattern `key` is usually the room id; a benchmark may fill once per slot and reuse the key.
/// Every function checks all indices against the pools first and fails (invalid_request) naming
/// the first bad index; nothing is touched then.

/// Fill KV pages `pages` (request positions starting at `first_position`) of every KV buffer.
result<> fill_kv(client& c, uint64_t key, std::span<const uint32_t> pages, uint32_t first_position);
/// Fill the state slot (every tensor × layer buffer) and the aux row, whose first 8 bytes carry
/// `room` (as ferryd checks on send).
result<> fill_state_and_aux(client& c, uint64_t key, uint32_t state_slot, uint32_t aux_row,
                            uint64_t room);
inline result<> fill_state_and_aux(client& c, uint64_t room, uint32_t state_slot,
                                   uint32_t aux_row) {
  return fill_state_and_aux(c, room, state_slot, aux_row, room);
}

/// Check the destination of a whole room: ok when every byte matches, else an error (internal)
/// describing the first mismatch (pool, buffer, item, byte offset).
result<> verify_room(const client& c, uint64_t key, uint64_t room, std::span<const uint32_t> pages,
                     uint32_t state_slot, uint32_t aux_row);
inline result<> verify_room(const client& c, uint64_t room, std::span<const uint32_t> pages,
                            uint32_t state_slot, uint32_t aux_row) {
  return verify_room(c, room, room, pages, state_slot, aux_row);
}

/// Zero the destination of a room (so a later verify proves the bytes were written).
result<> clear_room(client& c, std::span<const uint32_t> pages, uint32_t state_slot,
                    uint32_t aux_row);

}  // namespace ferry::client
