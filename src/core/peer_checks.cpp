#include "core/peer_checks.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/plan.hpp"

namespace ferry {

result<checked_peer> check_peer_hello(const ferry_config& mine_cfg, const peer_hello& h,
                                      bool we_decode, uint32_t spoken) {
  auto refuse = [](std::string why) { return error{errc::peer_incompatible, std::move(why)}; };
  const uint32_t ours = spoken;  // the highest version we speak
  if (h.version < peer_protocol_min_version || h.min_version > ours)
    return error{errc::peer_incompatible,
                 fmt::format("peer speaks protocol versions {}..{}, this daemon speaks {}..{}",
                             h.min_version, h.version, peer_protocol_min_version, ours)};
  if (we_decode && h.role == "decode")
    return error{
        errc::peer_incompatible,
        fmt::format("peer {} has role decode; a prepare must name a prefill daemon", h.node)};
  if (!we_decode && h.role == "prefill")
    return error{
        errc::peer_incompatible,
        fmt::format("peer {} has role prefill; only a decode daemon may connect to send prepares",
                    h.node)};
  // A peer's config is input like any other: it must pass the same validation as our own
  // before any size or count from it reaches the planner.
  auto parsed = parse_config_text(h.config_yaml);
  if (!parsed) return refuse("peer config could not be read: " + parsed.message);
  if (auto valid = validate_config(parsed.value); !valid)
    return refuse("peer config is invalid: " + valid.message);
  if (!described_yet(parsed.value.pools))
    return refuse(
        "peer config leaves a pool to its engine's registration, which it has not "
        "described yet");
  checked_peer out;
  out.node = h.node;
  out.instance = h.instance;
  out.version = std::min(h.version, ours);
  out.pools = parsed.value.pools;
  // A paged state pool's prepares carry its pages (peer_prepare_paged), which an older peer
  // cannot read.
  const pools_config* ours_then_theirs[] = {&mine_cfg.pools, &out.pools};
  for (const pools_config* pools : ours_then_theirs)
    if (pools->mamba && paged(pools->mamba->type) && out.version < peer_paged_state_version)
      return refuse(
          fmt::format("{} has a {} state pool, which needs peer protocol {}; the pair "
                      "speaks {}",
                      pools == &mine_cfg.pools ? "this daemon" : "the peer",
                      to_string(pools->mamba->type), peer_paged_state_version, out.version));
  if (compatibility_hash(out.pools) != h.compat_hash)
    return error{errc::peer_incompatible,
                 "peer compatibility hash does not match its own layout (corrupted handshake)"};
  // The geometry a peer declares must be consistent with its own config.
  const auto& parsed_cfg = parsed.value;
  if (parsed_cfg.tp.size != h.tp_size || parsed_cfg.tp.rank != h.tp_rank ||
      parsed_cfg.pp.size != h.pp_size || parsed_cfg.pp.rank != h.pp_rank)
    return error{
        errc::peer_incompatible,
        "peer declared a TP/PP position that differs from its config (corrupted handshake)"};
  out.schema = schema_of(parsed_cfg);
  out.instance_ranks = parsed_cfg.instance_ranks;
  const auto mine = schema_of(mine_cfg);
  auto plan = we_decode ? make_link_plan(out.schema, mine) : make_link_plan(mine, out.schema);
  if (!plan) {
    const auto& e = plan.message;
    const auto& src = we_decode ? out.schema : mine;
    const auto& dst = we_decode ? mine : out.schema;
    if (src.tp_size == dst.tp_size && src.pp_size == dst.pp_size)
      return refuse("incompatible layouts: " + e);
    return error{errc::peer_incompatible,
                 fmt::format("incompatible layouts (prefill TP {} rank {} PP {} stage {}, decode "
                             "TP {} rank {} PP {} "
                             "stage {}): {}",
                             src.tp_size, src.tp_rank, src.pp_size, src.pp_rank, dst.tp_size,
                             dst.tp_rank, dst.pp_size, dst.pp_rank, e)};
  }
  out.link = std::make_shared<link_plan>(std::move(plan.value));
  out.layout = make_layout(out.pools);
  if (h.regions.size() != pool_kind_count)
    return error{errc::peer_incompatible, fmt::format("peer sent {} memory regions, expected {}",
                                                      h.regions.size(), pool_kind_count)};
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& r = h.regions[k];
    const auto& p = out.layout.pools[k];
    if (r.present != p.present || (p.present && r.length < p.total_bytes))
      return error{errc::peer_incompatible,
                   fmt::format("peer region for pool {} is {} bytes but its layout needs {}",
                               to_string(static_cast<pool_kind>(k)), r.length, p.total_bytes)};
  }
  if (h.fabric_address.empty())
    return error{errc::peer_incompatible, "peer sent an empty fabric address"};
  out.regions = h.regions;
  out.staging = h.staging;
  return out;
}

result<std::vector<rails::kind>> check_peer_rails(const peer_rails& m) {
  auto refuse = [](std::string why) {
    return error{errc::peer_incompatible, "peer listed its fabric endpoints wrongly: " + why};
  };
  if (m.rails.empty() || m.rails.size() > max_peer_rails)
    return refuse(
        fmt::format("expected 1 to {} endpoints, got {}", max_peer_rails, m.rails.size()));
  std::vector<rails::kind> kinds;
  bool express = false;
  for (size_t i = 0; i < m.rails.size(); ++i) {
    const auto& r = m.rails[i];
    if (r.fabric_address.empty() || r.fabric_address.size() > 4096)
      return refuse(fmt::format("endpoint {} has an address of {} bytes, expected 1 to 4096", i,
                                r.fabric_address.size()));
    if (r.express && i == 0) return refuse("endpoint 0 (its hello's) is an express endpoint");
    if (r.express && express) return refuse("more than one express endpoint");
    express |= r.express;
    kinds.push_back({r.express});
  }
  return kinds;
}

result<> check_prepare_indices(const pools_config& mine, const node_layout& my_layout,
                               const checked_peer& from, const peer_prepare& p,
                               const std::vector<uint32_t>& state_pages) {
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
  const auto& state = mine.mamba;
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
  } else if (my_layout[pool_kind::state].present && p.dst_state_slot == no_index) {
    return error{
        errc::invalid_request,
        fmt::format("mamba requires single state index: room {} got dst=none from the decode",
                    p.room)};
  }
  if (my_layout[pool_kind::aux].present && p.dst_aux_row == no_index)
    return error{errc::invalid_request,
                 fmt::format("room {}: the decode named no aux row", p.room)};
  return check_staging_offset(from, p.room, p.dst_staging, p.dst_pages.size());
}

result<> check_staging_offset(const checked_peer& from, uint64_t room, uint64_t offset,
                              size_t pages) {
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

result<> check_peer_challenge(bool we_have_secret, const peer_hello& h) {
  if (we_have_secret && h.nonce.size() != auth_nonce_bytes)
    return error{errc::peer_incompatible,
                 "this daemon requires peers to prove the cluster secret, and the peer offered "
                 "no challenge (set security.cluster_secret_file on both sides)"};
  if (!we_have_secret && !h.nonce.empty())
    return error{errc::peer_incompatible,
                 "the peer requires a cluster secret but this daemon has none (set "
                 "security.cluster_secret_file on both sides)"};
  return {};
}

result<int> check_peer_proof(const cluster_secrets& secrets, const bytes& ours,
                             const peer_hello& h) {
  const auto who = h.node + "/" + h.instance;
  if (h.proof.empty())
    return error{errc::peer_incompatible,
                 fmt::format("peer {} did not prove the cluster secret (is its "
                             "security.cluster_secret_file set?)",
                             who)};
  const int with = matching_secret(secrets, h.proof, "ferry-accept", ours, h.nonce, who);
  if (with < 0)
    return error{
        errc::peer_incompatible,
        fmt::format("peer {} failed the cluster-secret challenge (different secrets?)", who)};
  return with;
}

}  // namespace ferry
