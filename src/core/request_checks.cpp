#include "core/request_checks.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/layer_ranges.hpp"
#include "core/plan.hpp"

namespace ferry {

result<> check_state_and_row(const ferry_config& cfg, const node_layout& l, uint64_t room,
                             const char* side, uint32_t slot,
                             const std::vector<uint32_t>& state_pages, uint32_t row) {
  if (!l[pool_kind::state].present) {
    if (slot != no_index)
      return error{errc::invalid_request,
                   fmt::format("room {}: {} state slot {} given but this daemon has no mamba pool",
                               room, side, slot)};
    if (!state_pages.empty())
      return error{errc::invalid_request,
                   fmt::format("room {}: {} state pages given but this daemon has no mamba pool",
                               room, side)};
  } else if (const auto& m = *cfg.pools.mamba; paged(m.type)) {
    // A page-indexed component: its own page list (any length, the window's pages for swa).
    if (slot != no_index)
      return error{errc::invalid_request,
                   fmt::format("room {}: {} state slot {} given, but the {} state pool is indexed "
                               "by pages (state_pages), not by a slot",
                               room, side, slot, to_string(m.type))};
    const auto what = fmt::format("{} {} state page", side, to_string(m.type));
    if (auto e = check_indices(state_pages, m.slots, what.c_str(), "pages"); !e)
      return error{e.code, fmt::format("room {}: {}", room, e.message)};
  } else {
    if (!state_pages.empty())
      return error{errc::invalid_request,
                   fmt::format("mamba requires single state index: room {} got {} {} state "
                               "pages (exactly one {} state slot, as state_slot)",
                               room, state_pages.size(), side, side)};
    if (slot == no_index)
      return error{errc::invalid_request, fmt::format("mamba requires single state index: room {} "
                                                      "got {}=none (exactly one {} state slot is "
                                                      "required)",
                                                      room, side, side)};
    if (slot >= m.slots)
      return error{errc::invalid_request,
                   fmt::format("room {}: {} state slot {} is outside the pool of {} slots", room,
                               side, slot, m.slots)};
  }
  if (l[pool_kind::aux].present) {
    const auto rows = cfg.pools.aux->rows;
    if (row == no_index)
      return error{errc::invalid_request,
                   fmt::format("room {}: exactly one {} aux row is required", room, side)};
    if (row >= rows)
      return error{errc::invalid_request,
                   fmt::format("room {}: {} aux row {} is outside the pool of {} rows", room, side,
                               row, rows)};
  } else if (row != no_index) {
    return error{errc::invalid_request,
                 fmt::format("room {}: {} aux row {} given but this daemon has no aux pool", room,
                             side, row)};
  }
  return {};
}

result<> check_pages(const ferry_config& cfg, uint64_t room, const std::vector<uint32_t>& pages,
                     const char* what) {
  if (pages.empty()) return {};
  if (!cfg.pools.kv)
    return error{errc::invalid_request,
                 fmt::format("room {}: {}s given but this daemon has no kv pool", room, what)};
  if (auto e = check_indices(pages, cfg.pools.kv->pages, what, "pages"); !e)
    return error{e.code, fmt::format("room {}: {}", room, e.message)};
  return {};
}

result<> check_prepare(const ferry_config& cfg, const node_layout& layout,
                       const proto::prepare& p) {
  if (p.prefill_peers.empty())
    return error{errc::invalid_request, fmt::format("room {}: no prefill peer named", p.room)};
  if (const uint32_t page = cfg.pools.kv ? cfg.pools.kv->page_tokens : 0;
      p.prefix_tokens && (page == 0 || p.prefix_tokens % page != 0))
    return error{errc::invalid_request,
                 page == 0 ? fmt::format("room {}: prefix_tokens {} named, but this daemon has no "
                                         "kv pool",
                                         p.room, p.prefix_tokens)
                           : fmt::format("room {}: prefix_tokens {} is not a multiple of the page "
                                         "size {} (pools.kv.page_tokens)",
                                         p.room, p.prefix_tokens, page)};
  for (size_t i = 0; i < p.prefill_peers.size(); ++i) {
    if (p.prefill_peers[i].empty())
      return error{errc::invalid_request,
                   fmt::format("room {}: prefill peer {} is empty", p.room, i)};
    if (!valid_host_port(p.prefill_peers[i]))
      return error{errc::invalid_request,
                   fmt::format("room {}: prefill peer {} '{}' is not host:port (a port in "
                               "1..65535)",
                               p.room, i, p.prefill_peers[i])};
    for (size_t j = 0; j < i; ++j)
      if (p.prefill_peers[j] == p.prefill_peers[i])
        return error{errc::invalid_request, fmt::format("room {}: prefill peer {} is named twice",
                                                        p.room, p.prefill_peers[i])};
  }
  if (auto e = check_pages(cfg, p.room, p.dst_pages, "dst page"); !e) return e;
  return check_state_and_row(cfg, layout, p.room, "dst", p.state_slot, p.state_pages, p.aux_row);
}

result<> check_send(const ferry_config& cfg, const node_layout& layout, const proto::send& s) {
  if (auto e = check_pages(cfg, s.room, s.src_pages, "src page"); !e) return e;
  if (s.layer_count != 0 || s.first_layer != 0)
    if (auto e = check_layer_range(layer_ids(layout), s.room, layer_range::of(s)); !e) return e;
  if (s.last)
    return check_state_and_row(cfg, layout, s.room, "src", s.state_slot, s.state_pages, s.aux_row);
  if (s.state_slot != no_index || s.aux_row != no_index || !s.state_pages.empty())
    return error{errc::invalid_request,
                 fmt::format("room {}: state slot, state pages and aux row go only with the last "
                             "chunk",
                             s.room)};
  return {};
}

result<> check_aux_room_id(const ferry_config& cfg, const node_layout& layout,
                           const uint8_t* aux_base, const proto::send& s) {
  if (!s.last || !layout[pool_kind::aux].present || !cfg.pools.aux ||
      cfg.pools.aux->room_id_buffer == aux_pool_config::no_room_id)
    return {};
  const auto& rooms = layout[pool_kind::aux].buffers.at(cfg.pools.aux->room_id_buffer);
  uint64_t stored = 0;
  std::memcpy(&stored, aux_base + rooms.offset + uint64_t{s.aux_row} * rooms.item_bytes,
              sizeof(stored));
  if (stored != s.room)
    return error{errc::invalid_request,
                 fmt::format("room {}: src aux row {} carries room id {}, expected {}", s.room,
                             s.aux_row, stored, s.room)};
  return {};
}

}  // namespace ferry
