#pragma once
/// The checks a client's prepare and send pass before any room sees them (pure: the config, the
/// layout and the request). Each refusal is invalid_request and names the room, the field and
/// the value; the Scheduler (actors/scheduler_rooms.cpp) answers with it.

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/layout.hpp"
#include "core/protocol.hpp"

namespace ferry {

/// The state index and the aux row: exactly one state slot for a Mamba pool (no state pages),
/// a list of state pages (each inside the pool, each once; no slot) for a paged one, and one aux
/// row when that pool exists; none when a pool does not. `side` is "src" or "dst".
result<> check_state_and_row(const ferry_config& cfg, const node_layout& layout, uint64_t room,
                             const char* side, uint32_t slot,
                             const std::vector<uint32_t>& state_pages, uint32_t row);

/// `pages` inside the kv pool, each once (`what`: "src page", "dst page").
result<> check_pages(const ferry_config& cfg, uint64_t room, const std::vector<uint32_t>& pages,
                     const char* what);

/// A prepare's own fields: the prefill peers (at least one, each host:port, each once), the
/// prefix (whole pages), the pages, the slot and the row.
result<> check_prepare(const ferry_config& cfg, const node_layout& layout, const proto::prepare& p);

/// A send's own fields: its pages; its layer range within this rank's layers
/// (core/layer_ranges.hpp); the slot and row with the last chunk only (with each of its layer
/// ranges).
result<> check_send(const ferry_config& cfg, const node_layout& layout, const proto::send& s);

/// A last chunk's aux row against the room it is sent for, where the aux pool names a buffer
/// that carries each row's room id (`pools.aux.room_id_buffer`): the u64 the engine stored at
/// row `s.aux_row` of that buffer, read from the pool at `aux_base`, must be the room's, or a
/// wrong row would deliver another request's metadata. Nothing to check otherwise.
result<> check_aux_room_id(const ferry_config& cfg, const node_layout& layout,
                           const uint8_t* aux_base, const proto::send& s);

}  // namespace ferry
