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

constexpr uint64_t page = lent_page_bytes;

std::string pool_name(int k) { return to_string(static_cast<pool_kind>(k)); }

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

pool_standings standings(const daemon_context& ctx) {
  pool_standings out;
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& p = ctx.client_pools[k];
    out[k] = {p.client, p.now.load(), p.described ? &*p.described : nullptr};
  }
  return out;
}

}  // namespace

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
  const auto pools = standings(ctx);
  if (auto ok = check_registration_request(ctx.config, ctx.layout, pools, req); !ok)
    return std::move(ok).error();
  // Every descriptor: a sealed memfd (a shrink under a mapping would crash ferryd).
  const std::string name = pool_name(static_cast<int>(req.pool));
  std::vector<uint64_t> sizes(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    auto size = check_descriptor(name, i, fds[i]);
    if (!size) return std::move(size).error();
    sizes[i] = size.value;
  }
  return check_registration_layout(ctx.config, ctx.layout, pools, req, sizes);
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

bool registered_pool(const daemon_context& ctx, int k) { return registered_pool(ctx.config, k); }

std::optional<std::string> undescribed_pool(const daemon_context& ctx) {
  for (int k = 0; k < pool_kind_count; ++k)
    if (registered_pool(ctx.config, k) && !ctx.client_pools[k].described)
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
