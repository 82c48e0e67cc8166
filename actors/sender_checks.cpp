#include "actors/sender_checks.hpp"

#include <fmt/format.h>

#include "core/plan.hpp"

namespace ferry {

result<> check_named_indices(const daemon_context& ctx, const peer_info& from,
                             const peer_prepare& p, const std::vector<uint32_t>& state_pages) {
  const auto& dl = from.layout;
  if (!p.dst_pages.empty()) {
    if (!dl[pool_kind::kv].present)
      return error{errc::invalid_request,
                   fmt::format("room {}: pages named but the decode has no kv pool", p.room)};
    if (auto e = check_indices(p.dst_pages, dl[pool_kind::kv].buffers[0].items, "decode dst page",
                               "pages");
        !e)
      return error{e.code, fmt::format("room {}: {}", p.room, e.message)};
  }
  if (p.dst_state_slot != no_index &&
      (!dl[pool_kind::state].present || p.dst_state_slot >= dl[pool_kind::state].buffers[0].items))
    return error{errc::invalid_request,
                 fmt::format("room {}: decode dst state slot {} is outside its mamba pool", p.room,
                             p.dst_state_slot)};
  if (p.dst_aux_row != no_index &&
      (!dl[pool_kind::aux].present || p.dst_aux_row >= dl[pool_kind::aux].buffers[0].items))
    return error{errc::invalid_request,
                 fmt::format("room {}: decode dst aux row {} is outside its aux pool", p.room,
                             p.dst_aux_row)};
  const auto& state = ctx.config.pools.mamba;
  if (state && paged(state->type)) {
    // The handshake made both sides' state pools of one type, so the decode's is paged too.
    if (p.dst_state_slot != no_index)
      return error{errc::invalid_request,
                   fmt::format("room {}: the decode named state slot {} for a {} state pool, "
                               "which is indexed by pages",
                               p.room, p.dst_state_slot, to_string(state->type))};
    if (!dl[pool_kind::state].present)  // (the handshake pairs state pools; checked anyway)
      return error{errc::invalid_request,
                   fmt::format("room {}: the decode has no state pool", p.room)};
    if (auto e = check_indices(state_pages, dl[pool_kind::state].buffers[0].items,
                               "decode dst state page", "pages");
        !e)
      return error{e.code, fmt::format("room {}: {}", p.room, e.message)};
  } else if (!state_pages.empty()) {
    return error{errc::invalid_request,
                 fmt::format("room {}: the decode named {} state pages; this daemon's state pool "
                             "takes one slot",
                             p.room, state_pages.size())};
  } else if (ctx.layout[pool_kind::state].present && p.dst_state_slot == no_index) {
    return error{
        errc::invalid_request,
        fmt::format("mamba requires single state index: room {} got dst=none from the decode",
                    p.room)};
  }
  if (ctx.layout[pool_kind::aux].present && p.dst_aux_row == no_index)
    return error{errc::invalid_request,
                 fmt::format("room {}: the decode named no aux row", p.room)};
  return check_staging_offset(from, p.room, p.dst_staging, p.dst_pages.size());
}

result<> check_staging_offset(const peer_info& from, uint64_t room, uint64_t offset, size_t pages) {
  if (offset == no_staging) return {};
  // Head-sliced KV to unpack, or whole pages and packed slices to scatter (core/pack.hpp).
  const auto need = from.link->landing_bytes(pages);
  if (offset == staging_on_request) {
    if (from.version < peer_late_staging_version || !need || !from.staging.present)
      return error{
          errc::invalid_request,
          fmt::format("room {}: the decode's prepare says it grants staging later, but "
                      "{}",
                      room,
                      from.version < peer_late_staging_version
                          ? fmt::format("this link speaks peer protocol {} (grants "
                                        "need {})",
                                        from.version, peer_late_staging_version)
                          : std::string("nothing of this link lands in its staging")),
      };
    return {};
  }
  if (!need || !from.staging.present || offset > from.staging.length ||
      from.staging.length - offset < need)
    return error{
        errc::invalid_request,
        fmt::format("room {}: staging offset {} ({} bytes) is outside the decode's staging "
                    "region of {} bytes",
                    room, offset, need, from.staging.length)};
  return {};
}

}  // namespace ferry
