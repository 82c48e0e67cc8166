// A Sender's data plane: each chunk planned for each decode rank with the link plan cached at
// handshake (core/pack.hpp), head-sliced KV and small runs packed through staging a slice at a
// time, and the write batches posted to the engine, their completions fed back to the machine.

#include <algorithm>

#include "actors/sender_state.hpp"

namespace ferry::sending {
namespace {

/// Bytes of staging one packed batch may use: small enough that many rooms pack at once.
uint64_t pack_slice_bytes(const daemon_context& ctx) {
  return std::min<uint64_t>(4u << 20, ctx.staging->bytes / 8);
}

/// Copy planned local copies, then post `w` (split into pieces) to link `i` as one batch whose
/// completion releases `staging` (if any).
void submit(sender_actor* self, size_t i, std::optional<uint64_t> staging) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  auto& l = st.links[i];
  auto& w = st.writes;
  uint64_t copied = 0;
  for (const auto& c : st.copies) {
    ctx.copy(c, 0, c.count);
    copied += c.bytes();
  }
  if (copied) ctx.staging->packed(copied);
  split_pieces(w, ctx.config.fabric.write_piece_bytes);
  if (w.empty()) {
    if (staging) ctx.staging->release(*staging);
    return;
  }
  transport::write_batch batch;
  batch.peer = l.peer->fabric_peer;
  // One immediate for the batch where the fabric orders writes (tcp): half the posts of a
  // write + marker per write, and one landed count for the decode instead of one per write.
  batch.mode = transport::notify::batch_end;
  batch.cancel = st.cancel;  // the room's failure stops what is not posted yet
  batch.ops.reserve(w.size());
  uint64_t bytes = 0;
  for (const auto& p : w) {
    const auto& region = l.peer->region(p.dst);
    batch.ops.push_back({ctx.region(p.src), p.src_offset, p.length,
                         region.remote_base + p.dst_offset, region.key, l.prep.token});
    bytes += p.length;
  }
  const uint64_t id = st.next_batch++;
  caf::actor me = caf::actor_cast<caf::actor>(self);
  // Packed staging is released by the completion itself: once every write of the batch has
  // completed locally nothing reads it any more, whether or not this room still exists.
  staging_area* area = staging ? ctx.staging.get() : nullptr;
  daemon_metrics* metrics = ctx.metrics.get();  // outlives the engine, which runs `done`
  const uint64_t ops = w.size();
  batch.done = [me, id, area, at = staging.value_or(0), metrics, bytes,
                ops](transport::batch_result r) {
    if (area) area->release(at);
    // In writes (the result counts notifications): every write neither failed nor skipped (its
    // room failed first) has completed.
    const uint64_t failed = std::min<uint64_t>(r.failed, ops);
    const uint64_t skipped = std::min<uint64_t>(r.skipped, ops - failed);
    metrics->writes_completed(ops - failed - skipped, failed, skipped, bytes);
    caf::anon_send(me, batch_done_msg{id, std::move(r)});
  };
  metrics->writes_posted(w.size(), bytes);
  // The machine counts notifications, what the decode counts: the announced total.
  const uint64_t writes = ctx.engine->submit(std::move(batch));
  apply(self, feed(st, sender::ev::posted{i, id, writes, bytes}));
}

}  // namespace

void pump(sender_actor* self) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  if (!ctx.staging) return;  // nothing is planned for staging there is not
  const uint64_t budget = pack_slice_bytes(ctx);
  uint64_t copied = 0;
  for (size_t i = 0; i < st.links.size(); ++i) {
    auto& l = st.links[i];
    while (!l.jobs.empty() && !st.machine.lifecycle().terminal()) {
      uint64_t bytes = 0;
      size_t n = 0;
      while (n < l.jobs.size() && (n == 0 || bytes + l.jobs[n].bytes() <= budget))
        bytes += l.jobs[n++].bytes();
      auto at = staging_or_wait(self, st.ctx, bytes);
      if (!at) return;  // resumed by batch_done or staging_atom
      st.slice.assign(l.jobs.begin(), l.jobs.begin() + static_cast<ptrdiff_t>(n));
      l.jobs.erase(l.jobs.begin(), l.jobs.begin() + static_cast<ptrdiff_t>(n));
      st.copies.clear();
      st.writes.clear();
      expand_pack_jobs(st.slice, *at, st.copies, st.writes);
      copied += bytes;
      submit(self, i, at);
      if (copied >= copy_quantum_bytes && !l.jobs.empty()) {
        if (!st.pump_scheduled) self->send(self, pump_atom::value);
        st.pump_scheduled = true;
        return;
      }
    }
  }
}

bool pack_pending(const sender_state& st) {
  for (const auto& l : st.links)
    if (!l.jobs.empty() || !l.held.empty()) return true;
  return false;
}

void pumped(sender_actor* self) {
  auto& st = self->state;
  pump(self);
  const bool pending = pack_pending(st);
  apply(self, feed(st, sender::ev::pumped{pending}));
}

void post_link(sender_actor* self, size_t i, const sender::post_chunk& post) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  auto& l = st.links[i];
  const auto& link = *l.peer->link;
  const auto& chunk = post.chunk;
  const uint32_t first = post.first;
  const auto layers = layer_range::of(chunk);
  st.writes.clear();
  st.copies.clear();
  if (!chunk.src_pages.empty()) {
    auto dst_pages =
        std::span<const uint32_t>(l.prep.dst_pages).subspan(first, chunk.src_pages.size());
    kv_options o;
    if (l.prep.dst_staging != no_staging) o.dst_staging = l.prep.dst_staging;
    o.room_pages = static_cast<uint32_t>(l.prep.dst_pages.size());
    o.slice_bytes = ctx.staging ? pack_slice_bytes(ctx) : 0;
    o.threshold = ctx.config.fabric.pack_threshold();
    o.layers = layers;
    auto plan = plan_kv(link, ctx.layout, l.peer->layout,
                        coalesce_runs(chunk.src_pages, dst_pages, first), o);
    if (ctx.log_room->should_log(spdlog::level::debug))  // the plan says how and why
      ctx.log_room->debug("room={} peer={} chunk at {}: {}", st.room, l.peer->address, first,
                          plan.decision.describe());
    st.writes = std::move(plan.writes);
    l.jobs.insert(l.jobs.end(), plan.jobs.begin(), plan.jobs.end());
  }
  if (chunk.last && ctx.layout[pool_kind::state].present) {
    if (paged(ctx.config.pools.mamba->type))
      plan_state_pages(link, ctx.layout, l.peer->layout, chunk.state_pages, l.dst_state_pages,
                       st.writes, layers);
    else
      plan_state_link(link, ctx.layout, l.peer->layout, chunk.state_slot, l.prep.dst_state_slot,
                      st.writes, layers);
  }
  if (post.ends_room && ctx.layout[pool_kind::aux].present)
    plan_aux_link(link, ctx.layout, l.peer->layout, chunk.aux_row, l.prep.dst_aux_row, st.writes);
  submit(self, i, std::nullopt);
}

}  // namespace ferry::sending
