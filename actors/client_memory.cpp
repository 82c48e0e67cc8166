#include "actors/client_memory.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry {
namespace {

constexpr uint64_t page = 4096;

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

std::string file_type(mode_t m) {
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISFIFO(m)) return "a pipe";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

/// Put the no-access reservation back over [base, base + bytes).
bool reserve(uint8_t* base, uint64_t bytes) {
  void* at =
      mmap(base, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return at != MAP_FAILED;
}

/// The size of descriptor `i`, a memfd sealed against shrinking, or why it cannot be used.
result<uint64_t> check_descriptor(const std::string& name, size_t i, int fd) {
  struct stat s {};
  if (fstat(fd, &s) != 0)
    return error{errc::invalid_request, fmt::format("pool {}: fd {} cannot be examined: {}", name,
                                                    i, std::strerror(errno))};
  if (!S_ISREG(s.st_mode))
    return error{errc::invalid_request,
                 fmt::format("pool {}: fd {} is {}, not a memfd", name, i, file_type(s.st_mode))};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return error{errc::invalid_request,
                 fmt::format("pool {}: fd {} is not a memfd (it cannot carry seals: {})", name, i,
                             std::strerror(errno))};
  if ((seals & F_SEAL_SHRINK) == 0)
    return error{errc::invalid_request,
                 fmt::format("pool {}: fd {} is not sealed against shrinking (F_SEAL_SHRINK): a "
                             "shrink would crash ferryd",
                             name, i)};
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0)
    return error{errc::invalid_request,
                 fmt::format("pool {}: fd {} is sealed against writing: ferryd's fabric writes "
                             "land in it",
                             name, i)};
  if (s.st_blksize > static_cast<blksize_t>(page))
    return error{errc::invalid_request,
                 fmt::format("pool {}: fd {} has blocks of {} bytes (a huge-page memfd); lend "
                             "memory of {}-byte pages",
                             name, i, s.st_blksize, page)};
  return static_cast<uint64_t>(s.st_size);
}

/// Whether pool `k` is described by its registration (pool_placement::registered).
bool registered(const daemon_context& ctx, int k) {
  const auto& p = ctx.config.pools;
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

/// A registered pool's registration: the description it makes must pass the config's own
/// checks, and, after the first registration, be that one.
result<registration_plan> check_described(const daemon_context& ctx,
                                          const proto::register_memory& req,
                                          const std::vector<uint64_t>& sizes) {
  const auto k = req.pool;
  // One described pool at a time: the checks across pools (layer ids) see the others whole.
  for (int other = 0; other < pool_kind_count; ++other)
    if (other != static_cast<int>(k) && registered(ctx, other) &&
        !ctx.client_pools[other].described &&
        ctx.client_pools[other].now.load() == client_pool::state::registering)
      return error{errc::invalid_request,
                   fmt::format("pool {}: pool {}'s first registration is still being mapped; "
                               "register one pool at a time",
                               to_string(k), pool_name(other))};
  auto described = describe_registration(req, sizes);
  if (!described) return std::move(described).error();
  // The engine's registration is the source of truth; a model catalogue checks it.
  if (k != pool_kind::aux)
    if (auto diff = catalogue_difference(ctx.config, described.value.section,
                                         k == pool_kind::kv ? "kv" : "mamba"))
      return error{errc::invalid_request,
                   fmt::format("pool {}: the registration does not match the model: {}",
                               to_string(k), *diff)};
  ferry_config whole = ctx.config;
  if (k == pool_kind::kv) whole.pools.kv = described.value.section.kv;
  if (k == pool_kind::state) whole.pools.mamba = described.value.section.mamba;
  if (k == pool_kind::aux) whole.pools.aux = described.value.section.aux;
  if (auto valid = validate_config(whole); !valid)
    return error{errc::invalid_request,
                 fmt::format("pool {}: the registration describes a pool this daemon cannot "
                             "serve: {}",
                             to_string(k), valid.message)};
  if (const auto& first = ctx.client_pools[static_cast<int>(k)].described)
    if (auto diff = registration_difference(k, *first, described.value))
      return error{errc::invalid_request,
                   fmt::format("pool {}: this registration differs from the first one: {}; a "
                               "pool's layout is fixed by its first registration for the life "
                               "of ferryd (peers planned with it): restart ferryd to change it",
                               to_string(k), *diff)};
  return registration_plan{std::move(described.value)};
}

}  // namespace

const char* to_string(client_pool::state s) {
  switch (s) {
    case client_pool::state::unregistered:
      return "unregistered";
    case client_pool::state::registering:
      return "registering";
    case client_pool::state::registered:
      return "registered";
    case client_pool::state::releasing:
      return "releasing";
  }
  return "?";
}

result<> daemon_context::ready() const {
  if (!serving) return error{errc::draining, drain_begun ? "stopping" : "starting"};
  return pools_usable();
}

result<> daemon_context::pools_usable() const {
  for (int k = 0; k < pool_kind_count; ++k) {
    if (!client_memory(k)) continue;
    switch (client_pools[k].now.load()) {
      case client_pool::state::registered:
        continue;
      case client_pool::state::unregistered:
        return error{
            errc::peer_incompatible,
            fmt::format("pool {} is client memory and no client has registered it", pool_name(k))};
      case client_pool::state::registering:
        return error{errc::peer_incompatible,
                     fmt::format("pool {} is client memory and its registration is not finished",
                                 pool_name(k))};
      case client_pool::state::releasing:
        return error{
            errc::peer_incompatible,
            fmt::format("pool {} is client memory and its last registration is still being "
                        "released",
                        pool_name(k))};
    }
  }
  return {};
}

result<> reserve_client_pools(daemon_context& ctx) {
  const auto& pools = ctx.config.pools;
  const bool client[pool_kind_count] = {pools.kv && pools.kv->memory == pool_memory::client,
                                        pools.mamba && pools.mamba->memory == pool_memory::client,
                                        pools.aux && pools.aux->memory == pool_memory::client};
  const bool registered[pool_kind_count] = {pools.kv && pools.kv->placement.registered,
                                            pools.mamba && pools.mamba->placement.registered,
                                            pools.aux && pools.aux->placement.registered};
  for (int k = 0; k < pool_kind_count; ++k) {
    if (!client[k] || !ctx.layout.pools[k].present) continue;
    ctx.client_pools[k].client = true;
    if (registered[k]) continue;  // its first registration says how large it is
    const uint64_t bytes = (ctx.layout.pools[k].total_bytes + page - 1) / page * page;
    void* at = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED)
      return error{errc::system_error,
                   fmt::format("pool {}: cannot reserve {} bytes of address space: {}",
                               pool_name(k), bytes, std::strerror(errno))};
    ctx.client_pools[k].base = static_cast<uint8_t*>(at);
    ctx.client_pools[k].bytes = bytes;
  }
  return {};
}

result<registration_plan> check_registration(const daemon_context& ctx,
                                             const proto::register_memory& req,
                                             const std::vector<int>& fds) {
  const int k = static_cast<int>(req.pool);
  const std::string name = pool_name(k);
  const auto& layout = ctx.layout.pools[k];
  if (!layout.present)
    return error{errc::invalid_request,
                 fmt::format("pool {} is not configured on this daemon", name)};
  if (!ctx.client_memory(k))
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
  if (req.pool == pool_kind::state && !registered(ctx, k) && req.state != state_type::mamba &&
      req.state != ctx.config.pools.mamba->type)
    return error{errc::invalid_request,
                 fmt::format("pool state: the registration says state_type {}, the config's "
                             "pools.mamba.type is {}",
                             to_string(req.state), to_string(ctx.config.pools.mamba->type))};
  switch (ctx.client_pools[k].now.load()) {
    case client_pool::state::unregistered:
      break;
    case client_pool::state::registering:
    case client_pool::state::registered:
      return error{errc::invalid_request,
                   fmt::format("pool {} is already registered by another connection", name)};
    case client_pool::state::releasing:
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
  // Every descriptor: a sealed memfd (a shrink under a mapping would crash ferryd).
  std::vector<uint64_t> sizes(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    auto size = check_descriptor(name, i, fds[i]);
    if (!size) return std::move(size).error();
    sizes[i] = size.value;
  }
  if (registered(ctx, k)) return check_described(ctx, req, sizes);
  if (req.buffers.size() != layout.buffers.size())
    return error{errc::invalid_request,
                 fmt::format("pool {}: the table lists {} buffers, the pool has {} (see the "
                             "hello_reply's layout)",
                             name, req.buffers.size(), layout.buffers.size())};
  struct range {
    uint64_t begin, end;
    size_t buffer;
  };
  std::vector<std::vector<range>> used(fds.size());
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
    if (got.fd_index >= fds.size())
      return error{errc::invalid_request,
                   fmt::format("pool {}: buffer {} ({}) names fd {}, but {} came with the frame",
                               name, b, expected, got.fd_index, fds.size())};
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

/// Map a registered pool: reserve its range at the first registration, then each descriptor's
/// span at its place (its buffers land at the described offsets), and register the range.
result<> map_described(daemon_context& ctx, const proto::register_memory& req,
                       const std::vector<int>& fds, const described_pool& d) {
  const int k = static_cast<int>(req.pool);
  const std::string name = pool_name(k);
  auto& pool = ctx.client_pools[k];
  const bool first = !pool.base;
  if (first) {
    void* at =
        mmap(nullptr, d.bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED)
      return error{errc::system_error,
                   fmt::format("pool {}: cannot reserve {} bytes of address space: {}", name,
                               d.bytes, std::strerror(errno))};
    pool.base = static_cast<uint8_t*>(at);
    pool.bytes = d.bytes;
  } else if (pool.bytes != d.bytes) {  // check_described compared it with the first: never
    return error{errc::internal,
                 fmt::format("pool {}: the registration spans {} bytes, the reserved range {}",
                             name, d.bytes, pool.bytes)};
  }
  auto undo = [&](error why) {
    if (first) {  // nothing was described yet: the next registration reserves its own size
      munmap(pool.base, pool.bytes);
      pool.base = nullptr;
      pool.bytes = 0;
    } else {
      reserve(pool.base, pool.bytes);
    }
    return why;
  };
  for (const auto& b : req.buffers)  // back every byte now (see map_client_pool)
    if (int rc = posix_fallocate(fds[b.fd_index], static_cast<off_t>(b.fd_offset),
                                 static_cast<off_t>(b.items * b.item_bytes));
        rc != 0)
      return undo({errc::system_error,
                   fmt::format("pool {}: cannot reserve the memory of a buffer in fd {}: {}", name,
                               b.fd_index, std::strerror(rc))});
  for (const auto& s : d.spans) {
    void* at = mmap(pool.base + s.at, s.end - s.begin, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_FIXED | MAP_POPULATE, fds[s.fd], static_cast<off_t>(s.begin));
    if (at == MAP_FAILED)
      return undo(
          {errc::system_error, fmt::format("pool {}: cannot map bytes {}..{} of fd {}: {}", name,
                                           s.begin, s.end, s.fd, std::strerror(errno))});
  }
  auto reg = ctx.engine->register_region(pool.base, d.bytes, transport::region_access::local);
  if (!reg)
    return undo({reg.code, fmt::format("pool {}: memory registration of {} bytes failed: {}", name,
                                       d.bytes, reg.message)});
  ctx.regions[k] = reg.value;
  return {};
}

result<> map_client_pool(daemon_context& ctx, const proto::register_memory& req,
                         const std::vector<int>& fds, const registration_plan& plan) {
  if (plan.described) return map_described(ctx, req, fds, *plan.described);
  const int k = static_cast<int>(req.pool);
  const std::string name = pool_name(k);
  auto& pool = ctx.client_pools[k];
  const auto& layout = ctx.layout.pools[k];
  auto undo = [&](error why) {
    reserve(pool.base, pool.bytes);
    return why;
  };
  for (size_t b = 0; b < req.buffers.size(); ++b) {
    const auto& want = layout.buffers[b];
    const auto& got = req.buffers[b];
    const uint64_t len = want.items * want.item_bytes;
    // Back every byte now: a hole filled later by a fabric write could fail (SIGBUS).
    if (int rc = posix_fallocate(fds[got.fd_index], static_cast<off_t>(got.fd_offset),
                                 static_cast<off_t>(len));
        rc != 0)
      return undo({errc::system_error,
                   fmt::format("pool {}: cannot reserve the memory of buffer {} in fd {}: {}", name,
                               b, got.fd_index, std::strerror(rc))});
    // Populated now, as daemon pools are: first touches would otherwise stall the first rooms.
    void* at = mmap(pool.base + want.offset, len, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_FIXED | MAP_POPULATE, fds[got.fd_index],
                    static_cast<off_t>(got.fd_offset));
    if (at == MAP_FAILED)
      return undo({errc::system_error, fmt::format("pool {}: cannot map buffer {} from fd {}: {}",
                                                   name, b, got.fd_index, std::strerror(errno))});
  }
  auto reg =
      ctx.engine->register_region(pool.base, layout.total_bytes, transport::region_access::local);
  if (!reg)
    return undo({reg.code, fmt::format("pool {}: memory registration of {} bytes failed: {}", name,
                                       layout.total_bytes, reg.message)});
  ctx.regions[k] = reg.value;
  return {};
}

bool registered_pool(const daemon_context& ctx, int k) { return registered(ctx, k); }

std::optional<std::string> undescribed_pool(const daemon_context& ctx) {
  for (int k = 0; k < pool_kind_count; ++k)
    if (registered(ctx, k) && !ctx.client_pools[k].described)
      return fmt::format(
          "pool {} of {} is described by its engine's register_memory, which has not come yet",
          pool_name(k), ctx.config.node_name);
  return std::nullopt;
}

result<> unmap_client_pool(daemon_context& ctx, int k) {
  auto& pool = ctx.client_pools[k];
  result<> out;
  if (auto r = ctx.engine->deregister_region(ctx.regions[k]); !r) out = std::move(r).error();
  if (!reserve(pool.base, pool.bytes))
    out = error{out ? errc::system_error : out.code,
                fmt::format("{}{}cannot drop the client's memory from pool {}: {}", out.message,
                            out ? "" : "; ", pool_name(k), std::strerror(errno))};
  return out;
}

}  // namespace ferry
