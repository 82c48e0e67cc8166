#include "actors/peer_hello.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/geometry.hpp"
#include "os/failpoint.hpp"

namespace ferry {

uint32_t spoken_peer_version() {
  static const uint32_t v = os::failpoint("peer_protocol_6")   ? 6
                            : os::failpoint("peer_protocol_9") ? 9
                                                               : peer_protocol_version;
  return v;
}

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
                         const peer_region& staging, const bytes& nonce) {
  peer_hello h;
  h.version = spoken_peer_version();
  h.node = ctx.config.node_name;
  h.instance = ctx.instance;
  h.role = to_string(ctx.config.role);
  h.tp_size = ctx.config.tp.size;
  h.tp_rank = ctx.config.tp.rank;
  h.pp_size = ctx.config.pp.size;
  h.pp_rank = ctx.config.pp.rank;
  h.config_yaml = ctx.peer_config_yaml;
  h.compat_hash = compatibility_hash(ctx.config.pools);
  h.fabric_address = ctx.engine->local_address();
  h.regions = regions;
  h.staging = staging;
  h.nonce = nonce;
  return h;
}

peer_rails describe_rails(const transport::engine& engine) {
  peer_rails m;
  for (auto& r : engine.rails()) m.rails.push_back({std::move(r.address), r.express});
  return m;
}

std::vector<transport::peer_rail> rails_to_add(const transport::engine& engine,
                                               const peer_rails& theirs,
                                               const std::vector<rails::kind>& kinds) {
  std::vector<rails::kind> ours;
  for (const auto& r : engine.rails()) ours.push_back({r.express});
  std::vector<transport::peer_rail> out;
  for (const auto& [mine, its] : rails::pair_rails(ours, kinds))
    out.push_back({mine, theirs.rails[its].fabric_address});
  return out;
}

result<std::shared_ptr<peer_info>> validate_peer(const ferry_config& mine, const peer_hello& h,
                                                 bool we_decode, const std::string& address) {
  auto checked = check_peer_hello(mine, h, we_decode, spoken_peer_version());
  if (!checked) return error{checked.code, std::move(checked.message)};
  auto info = std::make_shared<peer_info>();
  static_cast<checked_peer&>(*info) = std::move(checked.value);
  info->address = address;
  return info;
}

}  // namespace ferry
