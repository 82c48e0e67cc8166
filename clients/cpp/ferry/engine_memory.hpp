#pragma once
/// What an engine does for a `memory: client` pool (docs/protocol.md, register_memory): one
/// memfd per pool, sized to the pool's layout and sealed against shrinking, mapped here, lent
/// to ferryd with register_memory and attached to the client so `item` and the workload helpers
/// reach it. Used by ferry-bench (and any tool that drives a daemon as an engine would).

#include <array>
#include <cstdint>

#include "ferry/client.hpp"

namespace ferry::client {

class engine_memory {
 public:
  engine_memory() = default;
  engine_memory(engine_memory&& o) noexcept { *this = std::move(o); }
  engine_memory& operator=(engine_memory&& o) noexcept;
  engine_memory(const engine_memory&) = delete;
  engine_memory& operator=(const engine_memory&) = delete;
  ~engine_memory();

  /// Lend memory for every pool of `c`'s daemon that is client memory (its hello_reply names
  /// no shm object); pools the daemon owns are left alone. The registrations last as long as
  /// `c`'s connection; this object must outlive it. A pool described by its registration
  /// (`registered` in the hello) is refused by name: its layout is an engine's own tensors.
  static result<engine_memory> lend(client& c);

  /// Pools lent.
  int lent() const;

 private:
  struct pool {
    int fd = -1;
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
  };
  std::array<pool, pool_kind_count> pools_{};
};

}  // namespace ferry::client
