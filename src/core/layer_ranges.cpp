#include "core/layer_ranges.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ferry {
namespace {

std::string range_text(layer_range r) {
  return fmt::format("[{}, {})", r.first, uint64_t{r.first} + r.count);
}

std::string index_text(uint32_t i) { return i == no_index ? "none" : std::to_string(i); }

}  // namespace

result<> check_layer_range(const std::vector<uint32_t>& layers, uint64_t room, layer_range r) {
  if (r.all()) {
    if (r.first == 0) return {};
    return error{errc::invalid_request,
                 fmt::format("room {}: first_layer {} given with layer_count 0 (a layer_count of "
                             "0 sends every layer)",
                             room, r.first)};
  }
  if (layers.empty())
    return error{errc::invalid_request,
                 fmt::format("room {}: layers {} named, but this daemon's pools hold no layers",
                             room, range_text(r))};
  const uint64_t end = uint64_t{r.first} + r.count;
  if (r.first < layers.front() || end - 1 > layers.back())
    return error{errc::invalid_request,
                 fmt::format("room {}: layers {} reach outside this rank's layers {}..{}", room,
                             range_text(r), layers.front(), layers.back())};
  const auto it = std::lower_bound(layers.begin(), layers.end(), r.first);
  if (it == layers.end() || *it >= end)
    return error{errc::invalid_request,
                 fmt::format("room {}: layers {} name none of this rank's {} layers ({}..{})", room,
                             range_text(r), layers.size(), layers.front(), layers.back())};
  return {};
}

chunk_layers::chunk_layers(std::vector<uint32_t> layers)
    : layers_(std::move(layers)), sent_(layers_.size(), false) {}

std::pair<size_t, size_t> chunk_layers::span_of(layer_range r) const {
  if (r.all()) return {0, layers_.size()};
  const auto lo = std::lower_bound(layers_.begin(), layers_.end(), r.first);
  const uint64_t end = uint64_t{r.first} + r.count;
  const auto hi = std::lower_bound(lo, layers_.end(), end,
                                   [](uint32_t id, uint64_t e) { return uint64_t{id} < e; });
  return {static_cast<size_t>(lo - layers_.begin()), static_cast<size_t>(hi - layers_.begin())};
}

result<chunk_layers::step> chunk_layers::check(const proto::send& s) const {
  const auto r = layer_range::of(s);
  const auto [lo, hi] = span_of(r);
  if (!r.all() && lo == hi)
    return error{errc::invalid_request,
                 fmt::format("layers {} name none of this rank's layers", range_text(r))};
  if (!open_) return step{true, hi - lo == layers_.size(), chunk_};
  if (s.src_pages != opened_.src_pages) {
    const auto missing =
        static_cast<size_t>(std::find(sent_.begin(), sent_.end(), false) - sent_.begin());
    return error{
        errc::invalid_request,
        fmt::format("chunk {} is still open ({} of its {} layers to send, layer {} "
                    "first): send them, naming the same pages, before another chunk",
                    chunk_, layers_.size() - sent_count_, layers_.size(), layers_[missing])};
  }
  if (s.last != opened_.last)
    return error{errc::invalid_request,
                 fmt::format("chunk {} was opened with last={}; a layer range of it cannot say "
                             "last={}",
                             chunk_, opened_.last ? 1 : 0, s.last ? 1 : 0)};
  if (s.state_slot != opened_.state_slot || s.aux_row != opened_.aux_row)
    return error{errc::invalid_request,
                 fmt::format("chunk {} named state slot {} and aux row {} with its first layers; "
                             "this layer range names slot {} and row {}",
                             chunk_, index_text(opened_.state_slot), index_text(opened_.aux_row),
                             index_text(s.state_slot), index_text(s.aux_row))};
  if (s.state_pages != opened_.state_pages)
    return error{errc::invalid_request,
                 fmt::format("chunk {} named {} state pages with its first layers; this layer "
                             "range names another list ({} pages)",
                             chunk_, opened_.state_pages.size(), s.state_pages.size())};
  for (size_t i = lo; i < hi; ++i)
    if (sent_[i])
      return error{errc::invalid_request,
                   fmt::format("layer {} of chunk {} was already sent", layers_[i], chunk_)};
  return step{false, sent_count_ + (hi - lo) == layers_.size(), chunk_};
}

chunk_layers::step chunk_layers::take(const proto::send& s) {
  const auto r = layer_range::of(s);
  const auto [lo, hi] = span_of(r);
  step st{!open_, false, chunk_};
  if (!open_) {
    opened_ = s;
    std::fill(sent_.begin(), sent_.end(), false);
    sent_count_ = 0;
  }
  for (size_t i = lo; i < hi; ++i) sent_[i] = true;
  sent_count_ += hi - lo;
  st.completes = sent_count_ == layers_.size();
  open_ = !st.completes;
  if (st.completes) {
    ++chunk_;
    opened_.src_pages.clear();
  }
  return st;
}

}  // namespace ferry
