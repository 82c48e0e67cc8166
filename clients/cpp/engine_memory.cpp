#include "ferry/engine_memory.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::client {

engine_memory& engine_memory::operator=(engine_memory&& o) noexcept {
  std::swap(pools_, o.pools_);
  return *this;
}

engine_memory::~engine_memory() {
  for (auto& p : pools_) {
    if (p.base) munmap(p.base, p.bytes);
    if (p.fd >= 0) close(p.fd);
  }
}

int engine_memory::lent() const {
  int n = 0;
  for (const auto& p : pools_) n += p.fd >= 0;
  return n;
}

result<engine_memory> engine_memory::lend(client& c) {
  engine_memory m;
  auto fail = [](std::string why) { return error{errc::system_error, std::move(why)}; };
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& info = c.daemon().pools[k];
    if (!info.present || !info.shm_name.empty()) continue;
    const auto name = to_string(static_cast<pool_kind>(k));
    if (info.registered)  // its layout is the engine's own tensors, not one to copy
      return error{errc::invalid_request,
                   fmt::format("pool {} of ferryd is described by its engine's registration "
                               "(memory: client and nothing else in its config): engine_memory "
                               "lays out only pools a config describes; register the engine's "
                               "own tensors with register_memory (protocol v7)",
                               name)};
    auto& p = m.pools_[k];
    p.bytes = (info.layout.total_bytes + 4095) / 4096 * 4096;
    p.fd =
        memfd_create(fmt::format("ferry-engine-{}", name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p.fd < 0)
      return fail(fmt::format("memfd_create for pool {}: {}", name, std::strerror(errno)));
    if (ftruncate(p.fd, static_cast<off_t>(p.bytes)) != 0 ||
        fcntl(p.fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
      return fail(fmt::format("sizing the memfd of pool {}: {}", name, std::strerror(errno)));
    void* at = mmap(nullptr, p.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
    if (at == MAP_FAILED)
      return fail(fmt::format("mapping the memfd of pool {}: {}", name, std::strerror(errno)));
    p.base = static_cast<uint8_t*>(at);
    proto::register_memory req;
    req.pool = static_cast<pool_kind>(k);
    for (const auto& b : info.layout.buffers)
      req.buffers.push_back({0, b.offset, b.item_bytes, b.items, b.layer_id, b.tensor, b.kind});
    if (auto r = c.register_memory(std::move(req), {p.fd}); !r) {
      result<engine_memory> o;
      o.code = r.code;
      o.message = r.message;
      return o;
    }
    c.attach_pool(static_cast<pool_kind>(k), p.base);
  }
  result<engine_memory> o;
  o.value = std::move(m);
  return o;
}

}  // namespace ferry::client
