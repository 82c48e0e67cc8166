#include "actors/peer_hello.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/geometry.hpp"

namespace ferry {

std::string identity(const std::string& node, const std::string& instance) {
  return node + "/" + instance;
}

std::vector<described_space> described_spaces(const daemon_context& ctx) {
  std::vector<described_space> out;
  for (int k = 0; k < pool_kind_count; ++k)
    if (ctx.layout.pools[k].present)
      out.push_back(
          {k, ctx.base(static_cast<space>(k)), ctx.layout.pools[k].total_bytes, ctx.regions[k]});
  if (ctx.staging) out.push_back({-1, ctx.staging->data, ctx.staging->bytes, ctx.staging->region});
  return out;
}

peer_hello describe_self(const daemon_context& ctx, const std::vector<peer_region>& regions,
                         const peer_region& staging, const bytes& nonce, caf::actor self) {
  peer_hello h;
  h.node = ctx.config.node_name;
  h.instance = ctx.instance;
  h.role = to_string(ctx.config.role);
  h.tp_size = ctx.config.tp.size;
  h.tp_rank = ctx.config.tp.rank;
  h.pp_size = ctx.config.pp.size;
  h.pp_rank = ctx.config.pp.rank;
  h.config_yaml = ctx.config_yaml;
  h.compat_hash = compatibility_hash(ctx.config.pools);
  h.fabric_address = ctx.engine->local_address();
  h.regions = regions;
  h.staging = staging;
  h.connection = std::move(self);
  h.nonce = nonce;
  return h;
}

result<std::shared_ptr<peer_info>> validate_peer(const ferry_config& mine_cfg, const peer_hello& h,
                                                 bool we_decode, const std::string& address) {
  auto refuse = [](std::string why) { return error{errc::peer_incompatible, std::move(why)}; };
  if (h.version < peer_protocol_min_version || h.min_version > peer_protocol_version)
    return error{
        errc::peer_incompatible,
        fmt::format("peer speaks protocol versions {}..{}, this daemon speaks {}..{}",
                    h.min_version, h.version, peer_protocol_min_version, peer_protocol_version)};
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
  auto info = std::make_shared<peer_info>();
  info->address = address;
  info->node = h.node;
  info->instance = h.instance;
  info->version = std::min(h.version, peer_protocol_version);
  info->pools = parsed.value.pools;
  if (compatibility_hash(info->pools) != h.compat_hash)
    return error{errc::peer_incompatible,
                 "peer compatibility hash does not match its own layout (corrupted handshake)"};
  // The geometry a peer declares must be consistent with its own config.
  const auto& parsed_cfg = parsed.value;
  if (parsed_cfg.tp.size != h.tp_size || parsed_cfg.tp.rank != h.tp_rank ||
      parsed_cfg.pp.size != h.pp_size || parsed_cfg.pp.rank != h.pp_rank)
    return error{
        errc::peer_incompatible,
        "peer declared a TP/PP position that differs from its config (corrupted handshake)"};
  info->schema = schema_of(parsed_cfg);
  info->instance_ranks = parsed_cfg.instance_ranks;
  const auto mine = schema_of(mine_cfg);
  auto plan = we_decode ? make_link_plan(info->schema, mine) : make_link_plan(mine, info->schema);
  if (!plan) {
    const auto& e = plan.message;
    const auto& src = we_decode ? info->schema : mine;
    const auto& dst = we_decode ? mine : info->schema;
    if (src.tp_size == dst.tp_size && src.pp_size == dst.pp_size)
      return refuse("incompatible layouts: " + e);
    return error{errc::peer_incompatible,
                 fmt::format("incompatible layouts (prefill TP {} rank {} PP {} stage {}, decode "
                             "TP {} rank {} PP {} "
                             "stage {}): {}",
                             src.tp_size, src.tp_rank, src.pp_size, src.pp_rank, dst.tp_size,
                             dst.tp_rank, dst.pp_size, dst.pp_rank, e)};
  }
  info->link = std::make_shared<link_plan>(std::move(plan.value));
  info->layout = make_layout(info->pools);
  if (h.regions.size() != pool_kind_count)
    return error{errc::peer_incompatible, fmt::format("peer sent {} memory regions, expected {}",
                                                      h.regions.size(), pool_kind_count)};
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& r = h.regions[k];
    const auto& p = info->layout.pools[k];
    if (r.present != p.present || (p.present && r.length < p.total_bytes))
      return error{errc::peer_incompatible,
                   fmt::format("peer region for pool {} is {} bytes but its layout needs {}",
                               to_string(static_cast<pool_kind>(k)), r.length, p.total_bytes)};
  }
  if (h.fabric_address.empty())
    return error{errc::peer_incompatible, "peer sent an empty fabric address"};
  info->regions = h.regions;
  info->staging = h.staging;
  return info;
}

}  // namespace ferry
