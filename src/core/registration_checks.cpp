#include "core/registration_checks.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/config.hpp"

namespace ferry {
namespace {

constexpr uint64_t page = lent_page_bytes;

std::string pool_name(int k) { return to_string(static_cast<pool_kind>(k)); }

/// "V of layer 7 with 2 items of 512 bytes" (what a buffer is, for error texts).
std::string describe(buffer_kind kind, uint32_t layer, uint32_t tensor, uint64_t items,
                     uint64_t item_bytes) {
  std::string what = kind == buffer_kind::aux ? "aux rows"
                     : kind == buffer_kind::state
                         ? fmt::format("state tensor {} of layer {}", tensor, layer)
                         : fmt::format("{} of layer {}", to_string(kind), layer);
  return fmt::format("{} with {} items of {} bytes", what, items, item_bytes);
}

/// A registered pool's registration: the description it makes must pass the config's own
/// checks, and, after the first registration, be that one.
result<registration_plan> check_described(const ferry_config& cfg, const pool_standings& pools,
                                          const proto::register_memory& req,
                                          const std::vector<uint64_t>& sizes) {
  const auto k = req.pool;
  // One described pool at a time: the checks across pools (layer ids) see the others whole.
  for (int other = 0; other < pool_kind_count; ++other)
    if (other != static_cast<int>(k) && registered_pool(cfg, other) && !pools[other].described &&
        pools[other].now == client_pool_state::registering)
      return error{errc::invalid_request,
                   fmt::format("pool {}: pool {}'s first registration is still being mapped; "
                               "register one pool at a time",
                               to_string(k), pool_name(other))};
  auto described = describe_registration(req, sizes);
  if (!described) return std::move(described).error();
  // The engine's registration is the source of truth; a model catalogue checks it.
  if (k != pool_kind::aux)
    if (auto diff =
            catalogue_difference(cfg, described.value.section, k == pool_kind::kv ? "kv" : "mamba"))
      return error{errc::invalid_request,
                   fmt::format("pool {}: the registration does not match the model: {}",
                               to_string(k), *diff)};
  ferry_config whole = cfg;
  if (k == pool_kind::kv) whole.pools.kv = described.value.section.kv;
  if (k == pool_kind::state) whole.pools.mamba = described.value.section.mamba;
  if (k == pool_kind::aux) whole.pools.aux = described.value.section.aux;
  if (auto valid = validate_config(whole); !valid)
    return error{errc::invalid_request,
                 fmt::format("pool {}: the registration describes a pool this daemon cannot "
                             "serve: {}",
                             to_string(k), valid.message)};
  if (const auto* first = pools[static_cast<int>(k)].described)
    if (auto diff = registration_difference(k, *first, described.value))
      return error{errc::invalid_request,
                   fmt::format("pool {}: this registration differs from the first one: {}; a "
                               "pool's layout is fixed by its first registration for the life "
                               "of ferryd (peers planned with it): restart ferryd to change it",
                               to_string(k), *diff)};
  return registration_plan{std::move(described.value)};
}

}  // namespace

bool registered_pool(const ferry_config& cfg, int k) {
  const auto& p = cfg.pools;
  switch (static_cast<pool_kind>(k)) {
    case pool_kind::kv:
      return p.kv && p.kv->placement.registered;
    case pool_kind::state:
      return p.mamba && p.mamba->placement.registered;
    case pool_kind::aux:
      return p.aux && p.aux->placement.registered;
  }
  return false;
}

const char* to_string(client_pool_state s) {
  switch (s) {
    case client_pool_state::unregistered:
      return "unregistered";
    case client_pool_state::registering:
      return "registering";
    case client_pool_state::registered:
      return "registered";
    case client_pool_state::releasing:
      return "releasing";
  }
  return "?";
}

result<> check_registration_request(const ferry_config& cfg, const node_layout& layout,
                                    const pool_standings& pools,
                                    const proto::register_memory& req) {
  const int k = static_cast<int>(req.pool);
  const std::string name = pool_name(k);
  if (!layout.pools[k].present)
    return error{errc::invalid_request,
                 fmt::format("pool {} is not configured on this daemon", name)};
  if (!pools[k].client)
    return error{
        errc::invalid_request,
        fmt::format("pool {0} is daemon memory (pools.{1}.memory: daemon); there is nothing to "
                    "register",
                    name, req.pool == pool_kind::state ? "mamba" : name)};
  if (req.pool != pool_kind::state && req.state != state_type::mamba)
    return error{errc::invalid_request,
                 fmt::format("pool {}: state_type {} applies to the state pool only", name,
                             to_string(req.state))};
  // The config describes such a pool, its type too; a registration may leave the type unsaid
  // (mamba, as before version 8) but not contradict it.
  if (req.pool == pool_kind::state && !registered_pool(cfg, k) && req.state != state_type::mamba &&
      req.state != cfg.pools.mamba->type)
    return error{errc::invalid_request,
                 fmt::format("pool state: the registration says state_type {}, the config's "
                             "pools.mamba.type is {}",
                             to_string(req.state), to_string(cfg.pools.mamba->type))};
  switch (pools[k].now) {
    case client_pool_state::unregistered:
      break;
    case client_pool_state::registering:
    case client_pool_state::registered:
      return error{errc::invalid_request,
                   fmt::format("pool {} is already registered by another connection", name)};
    case client_pool_state::releasing:
      return error{
          errc::invalid_request,
          fmt::format("pool {} is still being released (the rooms and peers of its previous "
                      "registration are ending); register it again once that is done",
                      name)};
  }
  switch (req.kind) {
    case proto::memory_kind::host:
      break;
    case proto::memory_kind::cuda_dmabuf:
      return error{
          errc::invalid_request,
          "memory kind cuda_dmabuf: this ferryd's libfabric 1.17 has no FI_MR_DMABUF (it needs "
          "1.20), and this build has no CUDA (docs/gpu.md)"};
    case proto::memory_kind::cuda_ipc:
    case proto::memory_kind::cuda_vmm_fd:
      return error{
          errc::invalid_request,
          fmt::format("memory kind {}: importing it needs a CUDA context in ferryd, and this "
                      "build has no CUDA (docs/gpu.md)",
                      proto::to_string(req.kind))};
    default:
      return error{errc::invalid_request,
                   fmt::format("memory kind {} is unknown (0 host, 1 cuda_dmabuf, 2 cuda_ipc, "
                               "3 cuda_vmm_fd)",
                               static_cast<int>(req.kind))};
  }
  return {};
}

result<registration_plan> check_registration_layout(const ferry_config& cfg,
                                                    const node_layout& node,
                                                    const pool_standings& pools,
                                                    const proto::register_memory& req,
                                                    const std::vector<uint64_t>& sizes) {
  const int k = static_cast<int>(req.pool);
  const std::string name = pool_name(k);
  const auto& layout = node.pools[k];
  if (registered_pool(cfg, k)) return check_described(cfg, pools, req, sizes);
  if (req.buffers.size() != layout.buffers.size())
    return error{errc::invalid_request,
                 fmt::format("pool {}: the table lists {} buffers, the pool has {} (see the "
                             "hello_reply's layout)",
                             name, req.buffers.size(), layout.buffers.size())};
  struct range {
    uint64_t begin, end;
    size_t buffer;
  };
  std::vector<std::vector<range>> used(sizes.size());
  for (size_t b = 0; b < req.buffers.size(); ++b) {
    const auto& want = layout.buffers[b];
    const auto& got = req.buffers[b];
    const auto expected =
        describe(want.kind, want.layer_id, want.tensor, want.items, want.item_bytes);
    if (got.kind != want.kind || got.layer_id != want.layer_id || got.tensor != want.tensor ||
        got.items != want.items || got.item_bytes != want.item_bytes)
      return error{
          errc::invalid_request,
          fmt::format("pool {}: buffer {} is {}, but the table says {}", name, b, expected,
                      describe(got.kind, got.layer_id, got.tensor, got.items, got.item_bytes))};
    if (got.fd_index >= sizes.size())
      return error{errc::invalid_request,
                   fmt::format("pool {}: buffer {} ({}) names fd {}, but {} came with the frame",
                               name, b, expected, got.fd_index, sizes.size())};
    if (got.fd_offset % page != 0)
      return error{
          errc::invalid_request,
          fmt::format("pool {}: buffer {} ({}) starts at fd offset {}, not a multiple of {}", name,
                      b, expected, got.fd_offset, page)};
    const uint64_t len = want.items * want.item_bytes;
    if (got.fd_offset > sizes[got.fd_index] || len > sizes[got.fd_index] - got.fd_offset)
      return error{
          errc::invalid_request,
          fmt::format("pool {}: buffer {} ({}) needs {} bytes at fd {} offset {}, but the fd "
                      "has {}",
                      name, b, expected, len, got.fd_index, got.fd_offset, sizes[got.fd_index])};
    used[got.fd_index].push_back({got.fd_offset, got.fd_offset + len, b});
  }
  for (size_t i = 0; i < used.size(); ++i) {
    auto& r = used[i];
    if (r.empty())
      return error{
          errc::invalid_request,
          fmt::format("pool {}: fd {} came with the frame but no buffer uses it", name, i)};
    std::sort(r.begin(), r.end(), [](const range& a, const range& b) { return a.begin < b.begin; });
    for (size_t j = 1; j < r.size(); ++j)
      if (r[j].begin < r[j - 1].end)
        return error{errc::invalid_request,
                     fmt::format("pool {}: buffers {} and {} overlap in fd {}", name,
                                 r[j - 1].buffer, r[j].buffer, i)};
  }
  return registration_plan{};
}

}  // namespace ferry
