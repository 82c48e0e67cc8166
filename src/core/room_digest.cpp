#include "core/room_digest.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <new>

namespace ferry {
namespace {

struct state_deleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

/// One digest under way: the bytes of one buffer pair, fed range by range.
class digester {
 public:
  digester(const std::array<const uint8_t*, 3>& bases, digest_side side)
      : bases_(bases), side_(side), state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
  }

  void begin(space where, uint32_t buffer) {
    XXH3_64bits_reset(state_.get());
    d_ = room_digest{where, buffer, ~uint64_t{0}, 0, 0};
  }
  /// `length` bytes from source offset `src` to destination offset `dst` (both in `d_.where`).
  void range(uint64_t src, uint64_t dst, uint64_t length) {
    const uint64_t at = side_ == digest_side::source ? src : dst;
    XXH3_64bits_update(state_.get(), bases_[static_cast<int>(d_.where)] + at, length);
    d_.first = std::min(d_.first, dst);
    d_.end = std::max(d_.end, dst + length);
  }
  void end(std::vector<room_digest>& out) {
    d_.value = XXH3_64bits_digest(state_.get());
    if (d_.first > d_.end) d_.first = d_.end = 0;  // it covered nothing
    out.push_back(d_);
  }

 private:
  std::array<const uint8_t*, 3> bases_;
  digest_side side_;
  std::unique_ptr<XXH3_state_t, state_deleter> state_;
  room_digest d_;
};

}  // namespace

std::vector<room_digest> digest_room(const link_plan& link, const node_layout& src,
                                     const node_layout& dst, const room_items& src_items,
                                     const room_items& dst_items,
                                     const std::array<const uint8_t*, 3>& bases, digest_side side) {
  std::vector<room_digest> out;
  digester d(bases, side);
  // KV: page position by position; a sliced row token by token (the slice that moves).
  if (link.kv != kv_mode::none) {
    const auto& sp = src[pool_kind::kv];
    const auto& dp = dst[pool_kind::kv];
    const size_t n = std::min(src_items.pages.size(), dst_items.pages.size());
    const bool whole = link.kv == kv_mode::whole_pages;
    for (const auto& pair : link.kv_buffers) {
      d.begin(space::kv, pair.dst);
      const uint64_t s0 = sp.buffers[pair.src].offset, d0 = dp.buffers[pair.dst].offset;
      for (size_t p = 0; p < n; ++p) {
        const uint64_t s = s0 + uint64_t{src_items.pages[p]} * link.src_page_bytes;
        const uint64_t t = d0 + uint64_t{dst_items.pages[p]} * link.dst_page_bytes;
        if (whole) {
          d.range(s, t, link.dst_page_bytes);
          continue;
        }
        for (uint32_t k = 0; k < link.page_tokens; ++k)
          d.range(s + k * link.src_row_bytes + link.row.src,
                  t + k * link.dst_row_bytes + link.row.dst, link.row.length);
      }
      d.end(out);
    }
  }
  // State: the slot's segments (or each paged state page's), buffer pair by buffer pair.
  {
    const auto& sp = src[pool_kind::state];
    const auto& dp = dst[pool_kind::state];
    const bool paged = !dst_items.state_pages.empty();
    const size_t n = std::min(src_items.state_pages.size(), dst_items.state_pages.size());
    for (const auto& pair : link.state_buffers) {
      const auto& s = sp.buffers[pair.src];
      const auto& t = dp.buffers[pair.dst];
      const auto& segs = link.state_segments[pair.tensor];
      d.begin(space::state, pair.dst);
      auto item = [&](uint32_t si, uint32_t di) {
        for (const auto& seg : segs)
          d.range(s.offset + uint64_t{si} * s.item_bytes + seg.src,
                  t.offset + uint64_t{di} * t.item_bytes + seg.dst, seg.length);
      };
      if (paged) {
        for (size_t p = 0; p < n; ++p) item(src_items.state_pages[p], dst_items.state_pages[p]);
      } else if (src_items.slot != no_index && dst_items.slot != no_index) {
        item(src_items.slot, dst_items.slot);
      }
      d.end(out);
    }
  }
  // Aux: the row of every aux buffer, from the one link that carries it.
  if (link.aux && src_items.row != no_index && dst_items.row != no_index) {
    const auto& sb = src[pool_kind::aux].buffers;
    const auto& db = dst[pool_kind::aux].buffers;
    for (size_t b = 0; b < sb.size() && b < db.size(); ++b) {
      d.begin(space::aux, static_cast<uint32_t>(b));
      d.range(sb[b].offset + uint64_t{src_items.row} * sb[b].item_bytes,
              db[b].offset + uint64_t{dst_items.row} * db[b].item_bytes, sb[b].item_bytes);
      d.end(out);
    }
  }
  return out;
}

std::string digest_difference(const std::vector<room_digest>& got,
                              const std::vector<uint64_t>& sent, const node_layout& dst,
                              const std::string& from) {
  if (got.size() != sent.size())
    return fmt::format("prefill {} sent {} digests but this decode computes {} for its link", from,
                       sent.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& g = got[i];
    if (g.value == sent[i]) continue;
    const auto pool = static_cast<pool_kind>(g.where);
    const auto& b = dst[pool].buffers[g.buffer];
    std::string what;
    if (b.kind == buffer_kind::state)
      what = fmt::format("state buffer {} (tensor {}, layer {})", g.buffer, b.tensor, b.layer_id);
    else if (b.kind == buffer_kind::aux)
      what = fmt::format("aux buffer {}", g.buffer);
    else
      what = fmt::format("kv buffer {} ({}, layer {})", g.buffer, to_string(b.kind), b.layer_id);
    return fmt::format(
        "{}: destination bytes [{}, {}) of the {} pool differ from what prefill {} sent "
        "(digest {:#018x} landed, {:#018x} sent)",
        what, g.first, g.end, to_string(pool), from, g.value, sent[i]);
  }
  return {};
}

}  // namespace ferry
