#include "actors/sender_checks.hpp"

namespace ferry {

peer_terms terms_of(const peer_info& from) {
  return {from.layout, *from.link, from.version, from.staging};
}

result<> check_named_indices(const daemon_context& ctx, const peer_info& from,
                             const peer_prepare& p, const std::vector<uint32_t>& state_pages) {
  return check_prepare_indices(ctx.config.pools, ctx.layout, terms_of(from), p, state_pages);
}

}  // namespace ferry
