#pragma once
/// Which active room holds each destination page, state slot (or state page) and aux row of a
/// decode daemon.
/// Two active rooms naming the same memory would overwrite each other's bytes without a word,
/// so a prepare claims its indices whole or not at all, and the room's terminal state (which
/// means its memory may be reused) releases them.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/errors.hpp"

namespace ferry {

class dst_claims {
 public:
  dst_claims(uint64_t pages, uint64_t slots, uint64_t rows);

  /// Claim `pages`, `slot` and `row` (no_index: none) and the pages of a paged state pool
  /// (`state_pages`, counted with the slots) for `room`; on a conflict claim nothing and return
  /// the first held index and its holder (`errc::invalid_request`), e.g. "room 11: dst page 103
  /// (position 1) is held by active room 10". Indices must be in range (checked before).
  result<> claim(uint64_t room, std::span<const uint32_t> pages, uint32_t slot, uint32_t row,
                 std::span<const uint32_t> state_pages = {});
  /// Release what `room` claimed with the same arguments.
  void release(uint64_t room, std::span<const uint32_t> pages, uint32_t slot, uint32_t row,
               std::span<const uint32_t> state_pages = {});
  /// Indices held now (pages + slots + rows), for tests and stats.
  uint64_t held() const { return pages_.held + slots_.held + rows_.held; }
  /// Held per pool, for the `pools` info document: items in use there.
  uint64_t pages_held() const { return pages_.held; }
  uint64_t slots_held() const { return slots_.held; }
  uint64_t rows_held() const { return rows_.held; }

 private:
  struct table {
    std::vector<uint64_t> holder;
    std::vector<bool> taken;
    uint64_t held = 0;
  };
  table pages_, slots_, rows_;
};

}  // namespace ferry
