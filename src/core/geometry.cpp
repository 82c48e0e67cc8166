#include "core/geometry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

namespace ferry {
namespace {

unit_range intersect(unit_range a, unit_range b) {
  const uint64_t lo = std::max(a.first, b.first);
  const uint64_t hi = std::min(a.first + a.count, b.first + b.count);
  return hi > lo ? unit_range{lo, hi - lo} : unit_range{lo, 0};
}

bool divides(uint64_t a, uint64_t b) { return a != 0 && b % a == 0; }

/// Index of the buffer holding (kind, layer id) in a pool layout, or -1.
int find_buffer(const pool_layout& pool, buffer_kind kind, uint32_t layer, uint32_t tensor) {
  for (size_t i = 0; i < pool.buffers.size(); ++i) {
    const auto& b = pool.buffers[i];
    if (b.kind == kind && b.layer_id == layer && b.tensor == tensor) return static_cast<int>(i);
  }
  return -1;
}

/// Append `s`, merging it into the previous segment when both sides continue it.
void push_segment(std::vector<segment>& out, segment s) {
  if (s.length == 0) return;
  if (!out.empty()) {
    auto& b = out.back();
    if (b.src + b.length == s.src && b.dst + b.length == s.dst) {
      b.length += s.length;
      return;
    }
  }
  out.push_back(s);
}

std::string dims_text(const std::vector<uint64_t>& v) { return fmt::format("{}", v); }
std::string units_text(const state_tensor_config& t) {
  return t.shard_units.empty() ? "" : fmt::format(" shard_units {}", t.shard_units);
}

/// Where a side's model head count comes from: its config's total_heads, or kv_heads x TP.
std::string heads_source(const kv_pool_config& kv, uint32_t tp) {
  if (kv.total_heads) return fmt::format("pools.kv.total_heads {}", kv.total_heads);
  return fmt::format("kv_heads {} x TP {}", kv.kv_heads, tp);
}

/// KV part of a link: compatibility, buffer pairing by layer id, and the row slice. MLA KV and
/// replicated heads are sent by the lowest prefill rank of the decode rank's group holding them.
result<> plan_kv(const rank_schema& s, const rank_schema& d, const node_layout& sl,
                 const node_layout& dl, link_plan& plan) {
  const auto& a = *s.pools.kv;
  const auto& b = *d.pools.kv;
  auto differ = [](const char* what, auto x, auto y) -> result<> {
    if (x == y) return {};
    return error{errc::peer_incompatible,
                 fmt::format("{} differs: prefill has {}, decode has {}", what, x, y)};
  };
  if (auto e = differ("kv.page_tokens", a.page_tokens, b.page_tokens); !e) return e;
  if (auto e = differ("kv.dtype_bytes", a.dtype_bytes, b.dtype_bytes); !e) return e;
  if (auto e = differ("kv.mla", a.mla, b.mla); !e) return e;
  if (auto e = differ("kv.head_dim", a.head_dim, b.head_dim); !e) return e;
  const uint32_t H = a.model_heads(s.tp_size);
  if (!a.mla) {
    if (H != b.model_heads(d.tp_size))
      return error{
          errc::peer_incompatible,
          fmt::format("kv total heads differ: prefill has {} ({}), decode has {} ({}); set "
                      "pools.kv.total_heads on the side whose heads are replicated",
                      H, heads_source(a, s.tp_size), b.model_heads(d.tp_size),
                      heads_source(b, d.tp_size))};
    for (auto [side, p, heads] : {std::tuple{"prefill", s.tp_size, a.kv_heads},
                                  std::tuple{"decode", d.tp_size, b.kv_heads}}) {
      if (!(divides(p, H) || divides(H, p)))
        return error{errc::peer_incompatible,
                     fmt::format("kv heads do not divide: {} kv heads over {} TP {}", H, side, p)};
      if (heads != kv_heads_of(H, p, 0).count)
        return error{
            errc::peer_incompatible,
            fmt::format("{} kv_heads {} does not match {} total heads at TP {} (expected {})", side,
                        heads, H, p, kv_heads_of(H, p, 0).count)};
    }
  } else if (auto e = differ("kv.kv_heads (MLA)", a.kv_heads, b.kv_heads); !e) {
    return e;
  }
  plan.page_tokens = a.page_tokens;
  plan.src_page_bytes = a.page_bytes();
  plan.dst_page_bytes = b.page_bytes();
  plan.src_row_bytes = plan.src_page_bytes / a.page_tokens;
  plan.dst_row_bytes = plan.dst_page_bytes / b.page_tokens;
  if (!plan.in_group) return {};

  // Pair buffers by (K/V, layer id): every prefill layer must exist at the decode.
  const auto& sp = sl[pool_kind::kv];
  const auto& dp = dl[pool_kind::kv];
  for (uint32_t i = 0; i < sp.buffers.size(); ++i) {
    const auto& sb = sp.buffers[i];
    const int j = find_buffer(dp, sb.kind, sb.layer_id, 0);
    if (j < 0)
      return error{
          errc::peer_incompatible,
          fmt::format("prefill kv layer {} has no counterpart on the decode (decode layers {})",
                      sb.layer_id, b.layer_ids)};
    plan.kv_buffers.push_back({i, static_cast<uint32_t>(j), 0});
  }

  const auto group = prefill_ranks_for(s.tp_size, d.tp_size, d.tp_rank);
  if (a.mla) {
    plan.row = {0, 0, plan.src_row_bytes};
    plan.kv = s.tp_rank == group.front() ? kv_mode::whole_pages : kv_mode::none;
    return {};
  }
  const uint64_t head_bytes = uint64_t{a.head_dim} * a.dtype_bytes;
  const auto hs = kv_heads_of(H, s.tp_size, s.tp_rank);
  const auto hd = kv_heads_of(H, d.tp_size, d.tp_rank);
  const auto moved = intersect(hs, hd);
  // A head held by several prefill ranks of the group goes out once, from the lowest rank.
  bool first_holder = true;
  for (uint32_t p : group)
    if (p < s.tp_rank && intersect(kv_heads_of(H, s.tp_size, p), moved).count == moved.count)
      first_holder = false;
  if (moved.count == 0 || !first_holder) {
    plan.kv = kv_mode::none;
    return {};
  }
  plan.row = {(moved.first - hs.first) * head_bytes, (moved.first - hd.first) * head_bytes,
              moved.count * head_bytes};
  const bool src_whole = moved == hs, dst_whole = moved == hd;
  plan.kv = src_whole && dst_whole ? kv_mode::whole_pages
            : dst_whole            ? kv_mode::pack
                                   : kv_mode::unpack;
  // Neither side whole cannot happen when one TP size divides the other: the scatter side's
  // heads are a subset of its single source rank's, the gather side's a superset.
  return {};
}

result<> plan_state(const rank_schema& s, const rank_schema& d, const node_layout& sl,
                    const node_layout& dl, link_plan& plan) {
  const auto& a = *s.pools.mamba;
  const auto& b = *d.pools.mamba;
  if (a.type != b.type)
    return error{errc::peer_incompatible,
                 fmt::format("state type differs: prefill has {}, decode has {}", to_string(a.type),
                             to_string(b.type))};
  // A paged component (SGLang's swa, dsa, minimax_index_k) is re-sliced nowhere: under a TP
  // mismatch it moves only where SGLang moves it, replicated beside MLA KV, from one rank.
  bool replicated = false;
  if (paged(a.type) && s.tp_size != d.tp_size) {
    const bool mla = s.pools.kv && s.pools.kv->mla;
    bool sliced = false;
    for (const auto& t : a.tensors) sliced = sliced || t.slice_axis.has_value();
    if (a.type == state_type::minimax_index_k || !mla || sliced)
      return error{
          errc::peer_incompatible,
          fmt::format("{} state cannot move from prefill TP {} to decode TP {}: {}",
                      to_string(a.type), s.tp_size, d.tp_size,
                      a.type == state_type::minimax_index_k
                          ? "SGLang refuses minimax_index_k under a TP mismatch"
                      : !mla ? "SGLang refuses SWA state under a TP mismatch for non-MLA models"
                             : "its tensors are sliced across TP ranks, and a paged state "
                               "component moves under a TP mismatch only replicated (MLA)")};
    replicated = true;
  }
  if (a.tensors.size() != b.tensors.size())
    return error{errc::peer_incompatible,
                 fmt::format("mamba.tensors count differs: prefill has {}, decode has {}",
                             a.tensors.size(), b.tensors.size())};
  const bool same_tp = s.tp_size == d.tp_size;
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    const auto& x = a.tensors[t];
    const auto& y = b.tensors[t];
    const auto key = fmt::format("mamba.tensors[{}] ({})", t, x.name);
    if (x.name != y.name)
      return error{errc::peer_incompatible,
                   fmt::format("mamba.tensors[{}].name differs: prefill has {}, decode has {}", t,
                               x.name, y.name)};
    if (x.dtype != y.dtype && !x.dtype.empty() && !y.dtype.empty())
      return error{
          errc::peer_incompatible,
          fmt::format("{} dtype differs: prefill has {}, decode has {}", key, x.dtype, y.dtype)};
    if (x.dtype_bytes != y.dtype_bytes)
      return error{errc::peer_incompatible,
                   fmt::format("{} dtype_bytes differs: prefill has {}, decode has {}", key,
                               x.dtype_bytes, y.dtype_bytes)};
    if (x.slice_axis != y.slice_axis || x.shard_groups != y.shard_groups ||
        x.shard_units != y.shard_units)
      return error{errc::peer_incompatible,
                   fmt::format("{} slicing differs: prefill has slice_axis {} shard_groups {}{}, "
                               "decode has slice_axis "
                               "{} shard_groups {}{}",
                               key, x.slice_axis ? std::to_string(*x.slice_axis) : "none",
                               dims_text(x.shard_groups), units_text(x),
                               y.slice_axis ? std::to_string(*y.slice_axis) : "none",
                               dims_text(y.shard_groups), units_text(y))};
    if (x.shape.size() != y.shape.size())
      return error{errc::peer_incompatible,
                   fmt::format("{} shape differs: prefill has {}, decode has {}", key,
                               dims_text(x.shape), dims_text(y.shape))};
    if (same_tp || replicated) {
      if (x.shape != y.shape)
        return error{errc::peer_incompatible,
                     fmt::format("{} shape differs: prefill has {}, decode has {}", key,
                                 dims_text(x.shape), dims_text(y.shape))};
      plan.state_segments.push_back({{0, 0, x.slot_bytes()}});
      continue;
    }
    if (!x.slice_axis)
      return error{
          errc::peer_incompatible,
          fmt::format(
              "{} has no slice_axis: it cannot be re-sliced from prefill TP {} to decode TP {} "
              "(refusing a whole-slot copy)",
              key, s.tp_size, d.tp_size)};
    const uint32_t axis = *x.slice_axis;
    for (size_t i = 0; i < x.shape.size(); ++i)
      if (i != axis && x.shape[i] != y.shape[i])
        return error{
            errc::peer_incompatible,
            fmt::format("{} shape differs outside slice axis {}: prefill has {}, decode has {}",
                        key, axis, dims_text(x.shape), dims_text(y.shape))};
    // Every group is {size, units}; without shard_groups the axis is one group of single
    // elements. What rank r of P holds of each group is shard_share (config_types.hpp).
    std::vector<uint64_t> groups = x.shard_groups, units;
    if (groups.empty()) groups = {x.shape[axis] * s.tp_size};
    for (size_t i = 0; i < groups.size(); ++i)
      units.push_back(x.shard_groups.empty() ? groups[i] : x.group_units(i));
    const bool replicable = !x.shard_units.empty();
    const auto full_size_differs = [&] {
      return error{
          errc::peer_incompatible,
          fmt::format("{} full size differs: prefill {} x TP {} = {}, decode {} x TP {} = {}", key,
                      x.shape[axis], s.tp_size, x.shape[axis] * s.tp_size, y.shape[axis], d.tp_size,
                      y.shape[axis] * d.tp_size)};
    };
    if (!replicable && y.shape[axis] * d.tp_size != x.shape[axis] * s.tp_size)
      return full_size_differs();
    uint64_t held_s = 0, held_d = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const uint64_t g = groups[i], u = units[i];
      for (uint32_t tp : {s.tp_size, d.tp_size})
        if (u == 0 || g % u != 0 || (u % tp != 0 && (!replicable || tp % u != 0)))
          return error{
              errc::peer_incompatible,
              replicable
                  ? fmt::format("{} shard group {} ({} elements in {} units) cannot be held by "
                                "TP {}: {} is neither a multiple nor a divisor of {} (prefill TP "
                                "{}, decode TP {})",
                                key, i, g, u, tp, u, tp, s.tp_size, d.tp_size)
                  : fmt::format("{} does not divide evenly: shard group of {} over prefill TP {} "
                                "and decode TP {}",
                                key, g, s.tp_size, d.tp_size)};
      held_s += shard_share(g, u, s.tp_size, 0).second;
      held_d += shard_share(g, u, d.tp_size, 0).second;
    }
    // (Groups that do not add up to the shapes would plan segments outside a slot.)
    if (x.shape[axis] != held_s || y.shape[axis] != held_d) {
      if (!replicable) return full_size_differs();
      return error{errc::peer_incompatible,
                   fmt::format("{} sliced axis {} does not match its shard groups {} in units {}: "
                               "prefill TP {} holds {} (expected {}), decode TP {} holds {} "
                               "(expected {})",
                               key, axis, dims_text(groups), dims_text(units), s.tp_size,
                               x.shape[axis], held_s, d.tp_size, y.shape[axis], held_d)};
    }
    std::vector<segment> segs;
    if (plan.in_group) {
      // Of the prefill ranks this decode rank hears, the lowest that holds a piece sends it:
      // a replicated group has several holders, and each destination byte is written once.
      const auto senders = prefill_ranks_for(s.tp_size, d.tp_size, d.tp_rank);
      const uint64_t unit = x.unit_bytes();
      const uint64_t ds = x.shape[axis], dd = y.shape[axis];
      for (uint64_t o = 0; o < x.outer_count(); ++o) {
        uint64_t off_s = 0, off_d = 0;
        for (size_t i = 0; i < groups.size(); ++i) {
          const auto [fs, ns] = shard_share(groups[i], units[i], s.tp_size, s.tp_rank);
          const auto [fd, nd] = shard_share(groups[i], units[i], d.tp_size, d.tp_rank);
          const unit_range rs{fs, ns}, rd{fd, nd};
          const auto m = intersect(rs, rd);
          bool ours = m.count != 0;
          for (uint32_t p : senders) {
            if (!ours || p >= s.tp_rank) break;
            const auto [fp, np] = shard_share(groups[i], units[i], s.tp_size, p);
            if (intersect({fp, np}, m).count != 0) ours = false;  // a lower rank sends it
          }
          if (ours)
            push_segment(segs, {(o * ds + off_s + m.first - rs.first) * unit,
                                (o * dd + off_d + m.first - rd.first) * unit, m.count * unit});
          off_s += ns;
          off_d += nd;
        }
      }
    }
    plan.state_segments.push_back(std::move(segs));
  }
  if (!plan.in_group) return {};
  // Replicated state goes out once, from the lowest prefill rank of the group.
  if (replicated && s.tp_rank != prefill_ranks_for(s.tp_size, d.tp_size, d.tp_rank).front())
    return {};
  const auto& sp = sl[pool_kind::state];
  const auto& dp = dl[pool_kind::state];
  for (uint32_t i = 0; i < sp.buffers.size(); ++i) {
    const auto& sb = sp.buffers[i];
    const int j = find_buffer(dp, buffer_kind::state, sb.layer_id, sb.tensor);
    if (j < 0)
      return error{
          errc::peer_incompatible,
          fmt::format("prefill mamba layer {} has no counterpart on the decode (decode layers {})",
                      sb.layer_id, b.layer_ids)};
    plan.state_buffers.push_back({i, static_cast<uint32_t>(j), sb.tensor});
  }
  return {};
}

}  // namespace

rank_schema schema_of(const ferry_config& cfg) {
  return {cfg.pools,   cfg.tp.size, cfg.tp.rank, cfg.pp.size,
          cfg.pp.rank, cfg.dp.size, cfg.dp.rank, cfg.model};
}

std::optional<std::string> contract_difference(const std::optional<model_contract>& prefill,
                                               const std::optional<model_contract>& decode) {
  if (!prefill && !decode) return std::nullopt;
  if (!prefill || !decode)
    return fmt::format(
        "model differs: the {} declares {} (model section), the {} declares none: "
        "declare the same model on both sides, or on neither",
        prefill ? "prefill" : "decode", prefill ? prefill->architecture : decode->architecture,
        prefill ? "decode" : "prefill");
  const auto& a = *prefill;
  const auto& b = *decode;
  auto text = [](const std::string& v) { return v.empty() ? std::string("undeclared") : v; };
  if (a.architecture != b.architecture)
    return fmt::format("model.architecture differs: prefill has {}, decode has {}", a.architecture,
                       b.architecture);
  if (a.state_covers != b.state_covers)
    return fmt::format(
        "model.state_covers differs: prefill has {}, decode has {} (a state that "
        "covers N prompt tokens cannot stand in for one that covers N - 1)",
        text(a.state_covers), text(b.state_covers));
  // Both lists are sorted by key (config_parse.cpp): walk them together.
  size_t i = 0, j = 0;
  while (i < a.fields.size() || j < b.fields.size()) {
    if (j == b.fields.size() || (i < a.fields.size() && a.fields[i].first < b.fields[j].first))
      return fmt::format("model.fields.{} differs: prefill has {}, decode has none",
                         a.fields[i].first, a.fields[i].second);
    if (i == a.fields.size() || b.fields[j].first < a.fields[i].first)
      return fmt::format("model.fields.{} differs: prefill has none, decode has {}",
                         b.fields[j].first, b.fields[j].second);
    if (a.fields[i].second != b.fields[j].second)
      return fmt::format("model.fields.{} differs: prefill has {}, decode has {}",
                         a.fields[i].first, a.fields[i].second, b.fields[j].second);
    ++i, ++j;
  }
  return std::nullopt;
}

unit_range kv_heads_of(uint32_t total, uint32_t tp, uint32_t rank) {
  if (tp <= total) return {uint64_t{rank} * (total / tp), total / tp};
  return {rank / (tp / total), 1};
}

std::vector<uint32_t> prefill_ranks_for(uint32_t ps, uint32_t pd, uint32_t decode_rank) {
  if (ps <= pd) return {decode_rank / (pd / ps)};
  std::vector<uint32_t> out;
  const uint32_t k = ps / pd;
  for (uint32_t i = 0; i < k; ++i) out.push_back(decode_rank * k + i);
  return out;
}

uint32_t decode_ranks_per_prefill(uint32_t ps, uint32_t pd) { return pd > ps ? pd / ps : 1; }

const char* to_string(kv_mode m) {
  switch (m) {
    case kv_mode::none:
      return "none";
    case kv_mode::whole_pages:
      return "whole-pages";
    case kv_mode::pack:
      return "pack";
    case kv_mode::unpack:
      return "unpack";
  }
  return "?";
}

uint64_t link_plan::unpack_staging_bytes(uint64_t pages) const {
  return kv == kv_mode::unpack ? landing_bytes(pages) : 0;
}

uint64_t link_plan::landing_bytes(uint64_t pages) const {
  if (kv == kv_mode::none) return 0;
  return kv_buffers.size() * pages * page_tokens * row.length;
}

std::string link_plan::describe() const {
  if (!in_group) return "not in this decode rank's group";
  std::vector<size_t> segs;
  for (const auto& s : state_segments) segs.push_back(s.size());
  return fmt::format(
      "kv {} ({} buffers, {} of {} row bytes at src+{} dst+{}), state {} buffers with {} "
      "segments per tensor, aux {}",
      to_string(kv), kv_buffers.size(), row.length, src_row_bytes, row.src, row.dst,
      state_buffers.size(), segs, aux ? "yes" : "no");
}

result<link_plan> make_link_plan(const rank_schema& s, const rank_schema& d) {
  if (d.pp_size != 1 && d.pp_size != s.pp_size)
    return error{errc::peer_incompatible,
                 fmt::format("decode pp.size {} must be 1 or equal the prefill's pp.size {}",
                             d.pp_size, s.pp_size)};
  if (!(divides(s.tp_size, d.tp_size) || divides(d.tp_size, s.tp_size)))
    return error{errc::peer_incompatible,
                 fmt::format("TP sizes do not divide: prefill TP {} and decode TP {}", s.tp_size,
                             d.tp_size)};
  if (auto diff = contract_difference(s.model, d.model))
    return error{errc::peer_incompatible, *diff};
  link_plan plan;
  const auto group = prefill_ranks_for(s.tp_size, d.tp_size, d.tp_rank);
  plan.in_group = std::find(group.begin(), group.end(), s.tp_rank) != group.end() &&
                  (d.pp_size == 1 || d.pp_rank == s.pp_rank);
  const auto sl = make_layout(s.pools);
  const auto dl = make_layout(d.pools);
  // A prefill pool needs a destination; a decode pool may be filled by other PP stages.
  auto missing = [](const char* pool) {
    return error{errc::peer_incompatible,
                 fmt::format("pool {} is present on the prefill but absent on the decode", pool)};
  };
  if (s.pools.kv) {
    if (!d.pools.kv) return missing("kv");
    if (auto e = plan_kv(s, d, sl, dl, plan); !e) return e.error();
  }
  if (s.pools.mamba) {
    if (!d.pools.mamba) return missing("mamba");
    if (auto e = plan_state(s, d, sl, dl, plan); !e) return e.error();
  }
  if (s.pools.aux) {
    if (!d.pools.aux) return missing("aux");
    const auto src_rows = s.pools.aux->row_sizes(), dst_rows = d.pools.aux->row_sizes();
    if (src_rows.size() != dst_rows.size())
      return error{errc::peer_incompatible,
                   fmt::format("aux buffers differ: prefill has {} ({}), decode has {} ({})",
                               src_rows.size(), src_rows, dst_rows.size(), dst_rows)};
    for (size_t b = 0; b < src_rows.size(); ++b)
      if (src_rows[b] != dst_rows[b])
        return error{errc::peer_incompatible,
                     src_rows.size() == 1
                         ? fmt::format("aux.row_bytes differs: prefill has {}, decode has {}",
                                       src_rows[b], dst_rows[b])
                         : fmt::format("aux buffer {} has rows of {} bytes on the prefill, {} "
                                       "on the decode",
                                       b, src_rows[b], dst_rows[b])};
    // The row comes from the first TP rank of the group, and from the last PP stage (which
    // samples the output token) when one decode stage receives from all of them.
    plan.aux = plan.in_group && s.tp_rank == group.front() &&
               (d.pp_size != 1 || s.pp_rank + 1 == s.pp_size);
  }
  return plan;
}

result<std::vector<size_t>> select_prefill_peers(const rank_schema& d,
                                                 std::span<const rank_schema> named) {
  if (named.empty()) return error{errc::peer_incompatible, std::string("no prefill peers named")};
  const uint32_t ps = named[0].tp_size, pp = named[0].pp_size;
  for (const auto& n : named)
    if (n.tp_size != ps || n.pp_size != pp)
      return error{errc::peer_incompatible,
                   fmt::format("named prefill peers disagree on geometry: TP {} PP {} and TP {} PP "
                               "{} (name the ranks "
                               "of one prefill instance)",
                               ps, pp, n.tp_size, n.pp_size)};
  for (const auto& n : named)
    if (n.dp_size != named[0].dp_size || n.dp_rank != named[0].dp_rank)
      return error{errc::peer_incompatible,
                   fmt::format("named prefill peers are of different attention DP groups: DP rank "
                               "{} of {} and DP rank "
                               "{} of {} (a room's KV lives in one group: name that group's ranks)",
                               named[0].dp_rank, named[0].dp_size, n.dp_rank, n.dp_size)};
  if (!(divides(ps, d.tp_size) || divides(d.tp_size, ps)))
    return error{
        errc::peer_incompatible,
        fmt::format("TP sizes do not divide: prefill TP {} and decode TP {}", ps, d.tp_size)};
  if (d.pp_size != 1 && d.pp_size != pp)
    return error{errc::peer_incompatible,
                 fmt::format("decode pp.size {} must be 1 or equal the prefill's pp.size {}",
                             d.pp_size, pp)};
  const auto ranks = prefill_ranks_for(ps, d.tp_size, d.tp_rank);
  std::vector<uint32_t> stages;
  if (d.pp_size == 1)
    for (uint32_t i = 0; i < pp; ++i) stages.push_back(i);
  else
    stages.push_back(d.pp_rank);
  std::vector<size_t> chosen;
  for (uint32_t stage : stages)
    for (uint32_t r : ranks) {
      std::vector<size_t> hits;
      for (size_t i = 0; i < named.size(); ++i)
        if (named[i].tp_rank == r && named[i].pp_rank == stage) hits.push_back(i);
      if (hits.empty())
        return error{errc::peer_incompatible,
                     fmt::format("decode TP rank {} of {} needs prefill TP rank {} of {} in PP "
                                 "stage {} of {}, but no "
                                 "usable named peer is that rank",
                                 d.tp_rank, d.tp_size, r, ps, stage, pp)};
      if (hits.size() > 1)
        return error{
            errc::peer_incompatible,
            fmt::format("prefill TP rank {} PP stage {} is named {} times", r, stage, hits.size())};
      chosen.push_back(hits[0]);
    }
  // Every decode layer must be held by exactly one chosen stage (TP ranks of a stage hold the
  // same layers).
  auto cover = [&](const char* pool, const std::vector<uint32_t>* dst_ids,
                   auto ids_of) -> result<> {
    // The TP ranks of a stage hold the same layers (each its own heads or channels of them).
    std::map<uint32_t, size_t> first_of_stage;
    for (size_t i : chosen) {
      auto [it, fresh] = first_of_stage.emplace(named[i].pp_rank, i);
      if (fresh) continue;
      const auto* a = ids_of(named[it->second]);
      const auto* b = ids_of(named[i]);
      const std::vector<uint32_t> none;
      const auto& x = a ? *a : none;
      const auto& y = b ? *b : none;
      const std::set<uint32_t> xs(x.begin(), x.end()), ys(y.begin(), y.end());
      for (auto [has, lacks, rank_has, rank_lacks] :
           {std::tuple{&xs, &ys, named[it->second].tp_rank, named[i].tp_rank},
            std::tuple{&ys, &xs, named[i].tp_rank, named[it->second].tp_rank}})
        for (uint32_t id : *has)
          if (!lacks->count(id))
            return error{errc::peer_incompatible,
                         fmt::format("prefill TP rank {} of PP stage {} does not hold {} layer {}, "
                                     "which TP rank {} of "
                                     "the same stage holds",
                                     rank_lacks, named[i].pp_rank, pool, id, rank_has)};
    }
    std::map<uint32_t, uint32_t> holder;  // layer -> stage
    for (size_t i : chosen) {
      const auto* ids = ids_of(named[i]);
      if (!ids) continue;
      for (uint32_t id : *ids) {
        auto [it, fresh] = holder.emplace(id, named[i].pp_rank);
        if (!fresh && it->second != named[i].pp_rank)
          return error{errc::peer_incompatible,
                       fmt::format("{} layer {} is held by PP stages {} and {}", pool, id,
                                   it->second, named[i].pp_rank)};
      }
    }
    if (!dst_ids) return {};
    for (uint32_t id : *dst_ids)
      if (!holder.count(id))
        return error{
            errc::peer_incompatible,
            fmt::format("decode {} layer {} is not held by any named prefill stage", pool, id)};
    return {};
  };
  if (auto e =
          cover("kv", d.pools.kv ? &d.pools.kv->layer_ids : nullptr,
                [](const rank_schema& r) { return r.pools.kv ? &r.pools.kv->layer_ids : nullptr; });
      !e)
    return e.error();
  if (auto e = cover(
          "mamba", d.pools.mamba ? &d.pools.mamba->layer_ids : nullptr,
          [](const rank_schema& r) { return r.pools.mamba ? &r.pools.mamba->layer_ids : nullptr; });
      !e)
    return e.error();
  return chosen;
}

}  // namespace ferry
