// libFuzzer target: the handshake path. Two configs (a prefill rank and a decode rank, split at
// a "\n---8<---\n" line) are parsed and validated as a daemon does with its own and a peer's;
// then the link plan is made and a room planned. Properties: no crash (no division by zero, no
// out-of-range index); every planned write and copy stays inside its pools and staging.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/config.hpp"
#include "core/geometry.hpp"
#include "core/pack.hpp"
#include "core/plan.hpp"

using namespace ferry;

namespace {

bool inside(const node_layout& l, space s, uint64_t off, uint64_t len, uint64_t staging) {
  const uint64_t size = s == space::staging ? staging : l.pools[static_cast<int>(s)].total_bytes;
  return off <= size && len <= size - off;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 128 * 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto cut = text.find("\n---8<---\n");
  if (cut == std::string::npos) return 0;
  auto a = parse_config_text(text.substr(0, cut));
  auto b = parse_config_text(text.substr(cut + 10));
  if (!a || !b || !validate_config(a.value) || !validate_config(b.value)) return 0;
  fill_derived(a.value);
  fill_derived(b.value);
  const auto s = schema_of(a.value), d = schema_of(b.value);
  auto r = make_link_plan(s, d);
  if (!r) {
    if (r.message.empty()) std::abort();
    return 0;
  }
  const auto& link = r.value;
  const auto sl = make_layout(s.pools), dl = make_layout(d.pools);
  // Plan a small room at the ends of both pools, as every mode would.
  std::vector<uint32_t> src, dst;
  if (s.pools.kv && d.pools.kv) {
    const uint64_t n = std::min<uint64_t>({s.pools.kv->pages, d.pools.kv->pages, 8});
    for (uint64_t i = 0; i < n; ++i) {
      src.push_back(static_cast<uint32_t>(s.pools.kv->pages - 1 - i));
      dst.push_back(static_cast<uint32_t>(i * 2 % d.pools.kv->pages));
    }
  }
  const auto runs = coalesce_runs(src, dst);
  uint64_t pack = pack_bytes(link, runs);
  const uint64_t unpack = link.landing_bytes(dst.size());
  std::vector<planned_copy> copies;
  std::vector<planned_write> writes;
  plan_kv_chunk(link, sl, dl, runs, {uint64_t{0}, uint64_t{0}, static_cast<uint32_t>(dst.size())},
                copies, writes);
  plan_kv_chunk(link, sl, dl, runs, {}, copies, writes);  // the per-token path as well
  // Small runs gathered at the source into the decode's landing block (core/pack.hpp).
  kv_options o;
  o.dst_staging = 0;
  o.room_pages = static_cast<uint32_t>(dst.size());
  o.slice_bytes = 4096;
  o.threshold = uint64_t{1} << 30;
  const auto kp = plan_kv(link, sl, dl, runs, o);
  writes.insert(writes.end(), kp.writes.begin(), kp.writes.end());
  expand_pack_jobs(kp.jobs, 0, copies, writes);
  pack = std::max(pack, kp.decision.packed_bytes);
  if (s.pools.mamba && d.pools.mamba) {
    plan_state_link(link, sl, dl, static_cast<uint32_t>(s.pools.mamba->slots - 1),
                    static_cast<uint32_t>(d.pools.mamba->slots - 1), writes);
    // A paged state pool's pages, reversed at the source, ascending at the destination.
    std::vector<uint32_t> ss, ds;
    const uint64_t n = std::min<uint64_t>({s.pools.mamba->slots, d.pools.mamba->slots, 8});
    for (uint64_t i = 0; i < n; ++i) {
      ss.push_back(static_cast<uint32_t>(s.pools.mamba->slots - 1 - i));
      ds.push_back(static_cast<uint32_t>(i));
    }
    plan_state_pages(link, sl, dl, ss, ds, writes);
  }
  if (s.pools.aux && d.pools.aux)
    plan_aux_link(link, sl, dl, static_cast<uint32_t>(s.pools.aux->rows - 1),
                  static_cast<uint32_t>(d.pools.aux->rows - 1), writes);
  plan_unpack(link, dl, dst, 0, copies);
  for (const auto& w : writes)
    if (!inside(sl, w.src, w.src_offset, w.length, pack) ||
        !inside(dl, w.dst, w.dst_offset, w.length, unpack))
      std::abort();
  for (const auto& c : copies) {
    // Packing copies run at the prefill, unpacking copies at the decode.
    const bool at_decode = c.from == space::staging;
    const auto& l = at_decode ? dl : sl;
    const uint64_t st = at_decode ? unpack : pack;
    if (!inside(l, c.from, c.from_offset, c.length, st) ||
        !inside(l, c.to, c.to_offset, c.length, st))
      std::abort();
  }
  return 0;
}
