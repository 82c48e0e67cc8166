#include "core/registration.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

namespace ferry {
namespace {

constexpr uint64_t page = lent_page_bytes;
constexpr uint64_t align_down(uint64_t v) { return v / page * page; }
constexpr uint64_t align_up(uint64_t v) { return (v + page - 1) / page * page; }

error refuse(pool_kind k, std::string why) {
  return {errc::invalid_request, fmt::format("pool {}: {}", to_string(k), why)};
}

std::string what(const proto::memory_buffer& b) {
  return b.kind == buffer_kind::state
             ? fmt::format("state tensor {} of layer {}", b.tensor, b.layer_id)
         : b.kind == buffer_kind::aux
             ? std::string("aux buffer")
             : fmt::format("{} of layer {}", to_string(b.kind), b.layer_id);
}

/// Buffer `i` of `bs` names a value `get` other than buffer 0's: the text naming both, or none.
template <class Get>
std::optional<std::string> uneven(const std::vector<proto::memory_buffer>& bs, size_t from,
                                  size_t to, const char* field, Get get) {
  for (size_t i = from + 1; i < to; ++i)
    if (get(bs[i]) != get(bs[from]))
      return fmt::format("buffer {} ({}) has {} {}, buffer {} ({}) {}: they must be the same", i,
                         what(bs[i]), field, get(bs[i]), from, what(bs[from]), get(bs[from]));
  return std::nullopt;
}

/// A pool section of client memory whose description comes from its registration.
template <class Section>
Section registered_section() {
  Section s;
  s.memory = pool_memory::client;
  s.placement.registered = true;
  return s;
}

result<kv_pool_config> describe_kv(const proto::register_memory& req) {
  const auto& bs = req.buffers;
  const auto k = pool_kind::kv;
  auto kv = registered_section<kv_pool_config>();
  kv.mla = bs.front().kind == buffer_kind::kv;
  if (kv.mla) {
    for (size_t i = 0; i < bs.size(); ++i)
      if (bs[i].kind != buffer_kind::kv)
        return refuse(k, fmt::format("buffer {} is {}, but buffer 0 is an MLA buffer (KV): an MLA "
                                     "pool has one KV buffer per layer and nothing else",
                                     i, what(bs[i])));
    for (const auto& b : bs) kv.layer_ids.push_back(b.layer_id);
  } else {
    const size_t half = bs.size() / 2;
    for (size_t i = 0; i < bs.size(); ++i) {
      const auto want = i < half ? buffer_kind::k : buffer_kind::v;
      if (bs.size() % 2 != 0 || bs[i].kind != want)
        return refuse(
            k, fmt::format("buffer {} is {}, expected {}: the table lists K of every layer, then V "
                           "of the same layers in the same order ({} buffers)",
                           i, what(bs[i]), to_string(want), bs.size()));
      if (i >= half && bs[i].layer_id != bs[i - half].layer_id)
        return refuse(k, fmt::format("buffer {} is {}, but the K at its place (buffer {}) is of "
                                     "layer {}: V must follow the K layers' order",
                                     i, what(bs[i]), i - half, bs[i - half].layer_id));
    }
    for (size_t i = 0; i < half; ++i) kv.layer_ids.push_back(bs[i].layer_id);
  }
  auto item = [](const proto::memory_buffer& b) { return b.item_bytes; };
  auto items = [](const proto::memory_buffer& b) { return b.items; };
  auto heads = [](const proto::memory_buffer& b) { return b.slice_dim; };
  auto total = [](const proto::memory_buffer& b) { return b.total_dim; };
  if (auto e = uneven(bs, 0, bs.size(), "page size", item)) return refuse(k, *e);
  if (auto e = uneven(bs, 0, bs.size(), "page count", items)) return refuse(k, *e);
  if (auto e = uneven(bs, 0, bs.size(), "head count", heads)) return refuse(k, *e);
  if (auto e = uneven(bs, 0, bs.size(), "model head count", total)) return refuse(k, *e);
  if (req.page_tokens == 0)
    return refuse(k, "page_tokens is 0: the registration names no page size");
  kv.page_tokens = req.page_tokens;
  kv.kv_heads = kv.mla ? 1 : bs.front().slice_dim;
  if (kv.kv_heads == 0)
    return refuse(k, "buffer 0 names no KV heads at this rank (slice_dim 0; SGLang's kv_head_num)");
  kv.total_heads = kv.mla ? 0 : bs.front().total_dim;
  const uint64_t per_token_head = uint64_t{kv.page_tokens} * kv.kv_heads;
  if (bs.front().item_bytes % per_token_head != 0 ||
      bs.front().item_bytes / per_token_head > std::numeric_limits<uint32_t>::max())
    return refuse(k, fmt::format("pages of {} bytes do not hold {} tokens x {} heads evenly",
                                 bs.front().item_bytes, kv.page_tokens, kv.kv_heads));
  // A head's bytes per token: the registration says bytes, not a dtype.
  kv.head_dim = static_cast<uint32_t>(bs.front().item_bytes / per_token_head);
  kv.dtype_bytes = 1;
  kv.pages = bs.front().items;
  return kv;
}

result<mamba_pool_config> describe_state(const proto::register_memory& req) {
  const auto& bs = req.buffers;
  const auto k = pool_kind::state;
  auto m = registered_section<mamba_pool_config>();
  // Tensor-major: tensor 0 over its layers, then tensor 1 over the same layers, ...
  size_t layers = 0;
  while (layers < bs.size() && bs[layers].tensor == 0) ++layers;
  if (layers == 0 || bs.size() % layers != 0)
    return refuse(k, fmt::format("the table lists {} buffers, tensor 0 has {} layers: every tensor "
                                 "covers the same layers (tensor-major, then layer)",
                                 bs.size(), layers));
  for (size_t i = 0; i < bs.size(); ++i) {
    const uint32_t t = static_cast<uint32_t>(i / layers);
    if (bs[i].kind != buffer_kind::state || bs[i].tensor != t ||
        bs[i].layer_id != bs[i % layers].layer_id)
      return refuse(k, fmt::format("buffer {} is {}, expected state tensor {} of layer {} "
                                   "(tensor-major, then layer; every tensor over the same layers)",
                                   i, what(bs[i]), t, bs[i % layers].layer_id));
  }
  auto items = [](const proto::memory_buffer& b) { return b.items; };
  if (auto e = uneven(bs, 0, bs.size(), "slot count", items)) return refuse(k, *e);
  m.slots = bs.front().items;
  m.type = req.state;
  for (size_t l = 0; l < layers; ++l) m.layer_ids.push_back(bs[l].layer_id);
  for (size_t from = 0; from < bs.size(); from += layers) {
    auto item = [](const proto::memory_buffer& b) { return b.item_bytes; };
    auto dim = [](const proto::memory_buffer& b) { return b.slice_dim; };
    auto outer = [](const proto::memory_buffer& b) { return std::max<uint64_t>(1, b.outer); };
    auto groups = [](const proto::memory_buffer& b) { return fmt::format("{}", b.groups); };
    auto units = [](const proto::memory_buffer& b) { return fmt::format("{}", b.units); };
    for (auto e : {uneven(bs, from, from + layers, "slot size", item),
                   uneven(bs, from, from + layers, "sliced axis", dim),
                   uneven(bs, from, from + layers, "outer dims", outer),
                   uneven(bs, from, from + layers, "shard groups", groups),
                   uneven(bs, from, from + layers, "shard units", units)})
      if (e) return refuse(k, *e);
    const auto& b = bs[from];
    state_tensor_config t;
    t.name = fmt::format("tensor{}", from / layers);
    t.dtype_bytes = 1;  // shapes in bytes: the registration says bytes, not a dtype
    if (b.slice_dim == 0) {
      if (!b.groups.empty() || !b.units.empty())
        return refuse(k, fmt::format("buffer {} ({}) has shard groups but no sliced axis "
                                     "(slice_dim 0)",
                                     from, what(b)));
      t.shape = {b.item_bytes};  // not sliced: it moves only between equal TP sizes
    } else {
      const uint64_t outer = std::max<uint64_t>(1, b.outer);
      if (outer > b.item_bytes / b.slice_dim)  // (and no product below overflows)
        return refuse(k, fmt::format("buffer {} ({}): slots of {} bytes cannot hold {} x {} "
                                     "(outer dims x sliced axis)",
                                     from, what(b), b.item_bytes, outer, b.slice_dim));
      if (b.item_bytes % (outer * b.slice_dim) != 0)
        return refuse(k, fmt::format("buffer {} ({}): slots of {} bytes do not hold {} x {} "
                                     "(outer dims x sliced axis) evenly",
                                     from, what(b), b.item_bytes, outer, b.slice_dim));
      const uint64_t unit = b.item_bytes / (outer * b.slice_dim);
      if (outer > 1) {
        t.shape = {outer, b.slice_dim, unit};
        t.slice_axis = 1;
      } else {
        t.shape = {b.slice_dim, unit};
        t.slice_axis = 0;
      }
      t.shard_groups = b.groups;
      t.shard_units = b.units;
    }
    m.tensors.push_back(std::move(t));
  }
  return m;
}

result<aux_pool_config> describe_aux(const proto::register_memory& req) {
  const auto& bs = req.buffers;
  const auto k = pool_kind::aux;
  auto a = registered_section<aux_pool_config>();
  for (size_t i = 0; i < bs.size(); ++i)
    if (bs[i].kind != buffer_kind::aux)
      return refuse(k, fmt::format("buffer {} is {}, expected an aux buffer", i, what(bs[i])));
  auto items = [](const proto::memory_buffer& b) { return b.items; };
  if (auto e = uneven(bs, 0, bs.size(), "row count", items)) return refuse(k, *e);
  a.rows = bs.front().items;
  a.row_bytes = bs.front().item_bytes;
  for (size_t i = 1; i < bs.size(); ++i) a.more_row_bytes.push_back(bs[i].item_bytes);
  a.room_id_buffer = req.room_id_buffer;
  return a;
}

/// The described section, placed at `offsets`, into the pool's place in a pools_config.
template <class Section>
result<> fill(result<Section> described, std::vector<uint64_t> offsets,
              std::optional<Section>& into) {
  if (!described) return std::move(described).error();
  described.value.placement.offsets = std::move(offsets);
  into = std::move(described.value);
  return {};
}

}  // namespace

result<described_pool> describe_registration(const proto::register_memory& req,
                                             const std::vector<uint64_t>& fd_sizes) {
  const auto k = req.pool;
  const auto& bs = req.buffers;
  if (bs.empty()) return refuse(k, "the table lists no buffers");
  // Where each buffer lies in its descriptor; the span of each descriptor its buffers cover.
  struct range {
    uint64_t begin, end;
    size_t buffer;
  };
  std::vector<std::vector<range>> used(fd_sizes.size());
  for (size_t i = 0; i < bs.size(); ++i) {
    const auto& b = bs[i];
    if (b.item_bytes == 0 || b.items == 0)
      return refuse(k, fmt::format("buffer {} ({}) has {} items of {} bytes: nothing to map", i,
                                   what(b), b.items, b.item_bytes));
    if (b.fd_index >= fd_sizes.size())
      return refuse(k, fmt::format("buffer {} ({}) names fd {}, but {} came with the frame", i,
                                   what(b), b.fd_index, fd_sizes.size()));
    const uint64_t size = fd_sizes[b.fd_index];
    if (b.items > std::numeric_limits<uint64_t>::max() / b.item_bytes || b.fd_offset > size ||
        b.items * b.item_bytes > size - b.fd_offset)
      return refuse(k,
                    fmt::format("buffer {} ({} with {} items of {} bytes) needs bytes up to "
                                "fd {} offset {} and beyond, but the fd has {}",
                                i, what(b), b.items, b.item_bytes, b.fd_index, b.fd_offset, size));
    used[b.fd_index].push_back({b.fd_offset, b.fd_offset + b.items * b.item_bytes, i});
  }
  described_pool out;
  for (uint32_t fd = 0; fd < used.size(); ++fd) {
    auto& r = used[fd];
    if (r.empty())
      return refuse(k, fmt::format("fd {} came with the frame but no buffer uses it", fd));
    std::sort(r.begin(), r.end(), [](const range& a, const range& b) { return a.begin < b.begin; });
    // The pages each buffer touches, runs of them merged: only those are mapped (the engine's
    // other memory between its buffers is neither mapped nor exposed to peers).
    for (size_t j = 0; j < r.size(); ++j) {
      if (j > 0 && r[j].begin < r[j - 1].end)
        return refuse(
            k, fmt::format("buffers {} and {} overlap in fd {}", r[j - 1].buffer, r[j].buffer, fd));
      const uint64_t begin = align_down(r[j].begin), end = align_up(r[j].end);
      if (!out.spans.empty() && out.spans.back().fd == fd && begin <= out.spans.back().end) {
        auto& last = out.spans.back();
        out.bytes += std::max(end, last.end) - last.end;
        last.end = std::max(end, last.end);
      } else {
        out.spans.push_back({fd, begin, end, out.bytes});
        out.bytes += end - begin;
      }
    }
  }
  std::vector<uint64_t> offsets;
  for (const auto& b : bs) {  // the span of its fd that holds it
    const auto s = std::find_if(out.spans.begin(), out.spans.end(), [&](const fd_span& x) {
      return x.fd == b.fd_index && x.begin <= b.fd_offset && b.fd_offset < x.end;
    });
    offsets.push_back(s->at + (b.fd_offset - s->begin));
  }
  result<> filled;
  switch (k) {
    case pool_kind::kv:
      filled = fill(describe_kv(req), std::move(offsets), out.section.kv);
      break;
    case pool_kind::state:
      filled = fill(describe_state(req), std::move(offsets), out.section.mamba);
      break;
    case pool_kind::aux:
      filled = fill(describe_aux(req), std::move(offsets), out.section.aux);
      break;
  }
  if (!filled) return std::move(filled).error();
  return out;
}

std::optional<std::string> registration_difference(pool_kind k, const described_pool& first,
                                                   const described_pool& now) {
  const auto a = make_layout(first.section)[k];
  const auto b = make_layout(now.section)[k];
  if (a.buffers.size() != b.buffers.size())
    return fmt::format("it lists {} buffers, the first registration {}", b.buffers.size(),
                       a.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    const auto& x = a.buffers[i];
    const auto& y = b.buffers[i];
    if (x.kind != y.kind || x.layer_id != y.layer_id || x.tensor != y.tensor ||
        x.item_bytes != y.item_bytes || x.items != y.items || x.offset != y.offset)
      return fmt::format(
          "buffer {} is {} of layer {} (tensor {}) with {} items of {} bytes at pool offset {}; "
          "the first registration had {} of layer {} (tensor {}) with {} items of {} bytes at {}",
          i, to_string(y.kind), y.layer_id, y.tensor, y.items, y.item_bytes, y.offset,
          to_string(x.kind), x.layer_id, x.tensor, x.items, x.item_bytes, x.offset);
  }
  // The same pieces of memory at the same places (where they lie in the descriptors may move).
  if (first.spans.size() != now.spans.size())
    return fmt::format("its buffers lie in {} runs of pages, the first registration's in {}",
                       now.spans.size(), first.spans.size());
  for (size_t i = 0; i < first.spans.size(); ++i) {
    const auto& a = first.spans[i];
    const auto& b = now.spans[i];
    if (a.fd != b.fd || a.at != b.at || a.end - a.begin != b.end - b.begin)
      return fmt::format(
          "its run of pages {} is {} bytes of fd {} at pool offset {}, the first "
          "registration's {} bytes of fd {} at {}",
          i, b.end - b.begin, b.fd, b.at, a.end - a.begin, a.fd, a.at);
  }
  // The slicing facts: the same layout with other heads or groups would plan other writes.
  if (compatibility_hash(first.section) != compatibility_hash(now.section))
    return std::string(
        "its slicing facts (heads, sliced axes, shard groups, page size or room id "
        "buffer) differ from the first registration's");
  return std::nullopt;
}

}  // namespace ferry
