#include "core/sender_room.hpp"

#include <fmt/format.h>

#include "core/room_registry.hpp"

namespace ferry::sender {

room::room(uint64_t id, lifecycle_limits limits, uint32_t tp_rank, uint32_t tp_size,
           uint32_t pp_rank, std::vector<uint32_t> layers)
    : id_(id),
      life_(limits, waits),
      tp_rank_(tp_rank),
      tp_size_(tp_size),
      pp_rank_(pp_rank),
      layers_(std::move(layers)) {}

uint64_t room::bytes() const {
  uint64_t b = 0;
  for (const auto& l : links_) b += l.bytes;
  return b;
}

std::string room::peer_name() const {
  std::string s;
  for (const auto& l : links_) s += (s.empty() ? "" : ",") + l.address;
  return s.empty() ? "?" : s;
}

void room::advance(room_status s, effects& out) {
  auto e = life_.on(life_ev::advance{s});
  if (!e.empty()) out.push_back(life{std::move(e)});
}

effects room::on(event e) {
  return std::visit([this](auto& x) { return handle(std::move(x)); }, e);
}

effects room::handle(ev::start) { return {life{life_.on(life_ev::start{})}}; }

result<> room::check(const ev::prepare& in, bool& fatal) const {
  fatal = false;
  if (!in.in_group)
    return error{errc::invalid_request,
                 fmt::format("decode TP rank {} of {} (PP stage {}) does not receive from this "
                             "prefill (TP rank {} of {}, PP stage {})",
                             in.tp_rank, in.tp_size, in.pp_rank, tp_rank_, tp_size_, pp_rank_)};
  for (const auto& l : links_)
    if (l.link == in.link)
      return error{errc::invalid_request, fmt::format("duplicate room {}: already prepared", id_)};
  if (ready())
    return error{errc::invalid_request,
                 fmt::format("room {}: all {} decode ranks already prepared", id_, expected_)};
  // Ranks that disagree: the room cannot succeed any more.
  fatal = true;
  for (const auto& l : links_) {
    if (l.pages != in.pages)
      return error{errc::invalid_request,
                   fmt::format("room {}: decode ranks prepared different page counts: {} "
                               "prepared {} pages, {} prepared {}",
                               id_, l.address, l.pages, in.address, in.pages)};
    if (l.state_pages != in.state_pages)
      return error{errc::invalid_request,
                   fmt::format("room {}: decode ranks prepared different state page counts: {} "
                               "prepared {} state pages, {} prepared {}",
                               id_, l.address, l.state_pages, in.address, in.state_pages)};
    if (l.prefix_tokens != in.prefix_tokens)
      return error{errc::invalid_request,
                   fmt::format("room {}: decode ranks prepared different prefixes: {} prepared "
                               "{} tokens, {} prepared {}",
                               id_, l.address, l.prefix_tokens, in.address, in.prefix_tokens)};
    if (l.tp_size != in.tp_size)
      return error{errc::invalid_request,
                   fmt::format("room {}: decode ranks of different TP sizes prepared it: {} has "
                               "TP {}, {} has TP {}",
                               id_, l.address, l.tp_size, in.address, in.tp_size)};
  }
  fatal = false;
  return in.indices;
}

result<> room::state_pages_match(const proto::send& c) const {
  // A paged state component moves page for page: a list of another length is refused, not
  // truncated to the common prefix (SGLang's backends warn and truncate).
  if (!c.last || links_.empty() || c.state_pages.size() == links_.front().state_pages) return {};
  return error{errc::invalid_request,
               fmt::format("room {}: the last chunk names {} state pages but the decode prepared "
                           "{} (the lists must be the same length)",
                           id_, c.state_pages.size(), links_.front().state_pages)};
}

effects room::handle(ev::prepare in) {
  effects out;
  // Every prepare is answered: its decode rank waits for this answer, or for a drain report.
  if (life_.terminal()) {
    out.push_back(
        ack{in.link, in.token,
            ended_before_prepare(id_, life_.status(), life_.fail_reason(), life_.fail_code())});
    return out;
  }
  if (life_.draining()) {
    out.push_back(ack{in.link, in.token,
                      error{life_.fail_code(), fmt::format("room {} failed on the prefill: {}", id_,
                                                           life_.fail_reason())}});
    return out;
  }
  bool fatal = false;
  if (auto ok = check(in, fatal); !ok) {
    out.push_back(ack{in.link, in.token, ok});
    if (fatal) fail(ok.code, ok.message, out);
    return out;
  }
  expected_ = in.expected_links;
  prefix_ = in.prefix_tokens;
  cursor_ = chunk_cursor(in.pages);
  link_record l;
  l.link = in.link;
  l.address = std::move(in.address);
  l.tp_size = in.tp_size;
  l.pages = in.pages;
  l.state_pages = in.state_pages;
  l.prefix_tokens = in.prefix_tokens;
  l.token = in.token;
  links_.push_back(std::move(l));
  out.push_back(ack{in.link, in.token, {}});
  if (!ready()) return out;
  advance(room_status::waiting_for_input, out);
  // Take every queued chunk's positions before posting any: if one does not fit, the room fails
  // with nothing of it posted (no write may be in flight once Failed is reported). A chunk sent
  // in layer ranges takes its positions once, with its first range.
  std::vector<post_chunk> taken;
  while (!queued_.empty()) {
    auto q = std::move(queued_.front());
    queued_.pop_front();
    if (auto fits = state_pages_match(q.send); !fits) {
      fail(fits.code, fits.message, out);
      return out;
    }
    if (q.step.opens) {
      auto first = cursor_.take(static_cast<uint32_t>(q.send.src_pages.size()), q.send.last);
      if (!first) {
        fail(first.code, first.message, out);
        return out;
      }
      open_first_ = first.value;
    }
    const bool ends = q.step.completes && q.send.last;
    taken.push_back(post_chunk{std::move(q.send), open_first_, ends});
  }
  for (auto& p : taken) {
    last_taken_ = last_taken_ || p.ends_room;
    ++unposted_;
    out.push_back(std::move(p));
  }
  return out;
}

effects room::handle(ev::chunk e) {
  auto& c = e.send;
  effects out;
  if (life_.terminal()) {
    out.push_back(reply{error{errc::invalid_request, fmt::format("room {} has already ended ({})",
                                                                 id_, to_string(life_.status()))}});
    return out;
  }
  if (life_.draining()) {
    out.push_back(
        reply{error{errc::cancelled, fmt::format("room {} failed: {} (its writes are draining)",
                                                 id_, life_.fail_reason())}});
    return out;
  }
  // Its layers: a range of the open chunk, or the first send of the next chunk.
  auto step = layers_.check(c);
  if (!step) {
    out.push_back(reply{error{step.code, fmt::format("room {}: {}", id_, step.message)}});
    return out;
  }
  // A page in two chunks would be written to two positions: refuse the chunk, naming it. (A
  // later range of the open chunk names the pages its first range named.)
  for (size_t i = 0; step.value.opens && i < c.src_pages.size(); ++i)
    if (sent_pages_.count(c.src_pages[i])) {
      out.push_back(reply{error{errc::invalid_request,
                                fmt::format("room {}: src page {} (position {}) was already sent "
                                            "in an earlier chunk of this room",
                                            id_, c.src_pages[i], i)}});
      return out;
    }
  if (!ready()) {
    if (queued_.size() >= max_queued_chunks) {
      out.push_back(reply{error{errc::invalid_request,
                                fmt::format("room {}: {} chunks already wait for the decode's "
                                            "prepare",
                                            id_, max_queued_chunks)}});
      return out;
    }
    // Answered now: the chunk is accepted and posted once every rank has prepared.
    sent_pages_.insert(c.src_pages.begin(), c.src_pages.end());
    layers_.take(c);
    out.push_back(reply{{}});
    queued_.push_back({std::move(c), step.value});
    return out;
  }
  if (auto fits = state_pages_match(c); !fits) {
    out.push_back(reply{fits});
    return out;
  }
  if (step.value.opens) {
    auto first = cursor_.take(static_cast<uint32_t>(c.src_pages.size()), c.last);
    if (!first) {
      out.push_back(reply{error{first.code, fmt::format("room {}: {}", id_, first.message)}});
      return out;
    }
    open_first_ = first.value;
    sent_pages_.insert(c.src_pages.begin(), c.src_pages.end());
  }
  layers_.take(c);
  const bool ends = step.value.completes && c.last;
  last_taken_ = last_taken_ || ends;
  ++unposted_;
  // Answered before it is planned and posted (packing a large chunk takes milliseconds): the
  // engine's call waits for the chunk's acceptance, not for ferryd's work on it.
  out.push_back(reply{{}});
  out.push_back(post_chunk{std::move(c), open_first_, ends});
  return out;
}

effects room::handle(ev::posted e) {
  const auto [link, batch, writes, bytes] = e;
  effects out;
  // Only a post_chunk (once every rank prepared) posts; a batch posted while draining is
  // waited for like any other.
  if (!ready() || link >= links_.size()) return out;
  links_[link].writes += writes;
  links_[link].bytes += bytes;
  batches_[batch] = link;
  advance(room_status::transferring, out);
  return out;
}

effects room::handle(ev::chunk_posted e) {
  const bool pack_pending = e.pack_pending;
  effects out;
  if (unposted_ > 0) --unposted_;
  pack_pending_ = pack_pending;
  maybe_announce(out);
  return out;
}

effects room::handle(ev::pumped e) {
  effects out;
  pack_pending_ = e.pack_pending;
  maybe_announce(out);
  return out;
}

void room::maybe_announce(effects& out) {
  if (!last_taken_ || announced_ || unposted_ > 0 || pack_pending_) return;
  if (life_.draining() || life_.terminal()) return;
  announced_ = true;
  out.push_back(announce{});
  // A room with no writes at all (no pages, no state, no aux pool) commits on the announcement.
  advance(room_status::transferring, out);
}

effects room::handle(ev::batch_done e) {
  const auto& [batch, completed, failed, r] = e;
  effects out;
  std::string to = "?";
  if (auto it = batches_.find(batch); it != batches_.end()) {
    auto& l = links_[it->second];
    l.completed += completed;
    l.failed += failed;
    to = l.address;
    batches_.erase(it);
  }
  if (life_.terminal()) return out;
  if (life_.draining()) {
    finish_drain({}, out);
    return out;
  }
  if (!r) {
    fail(r.code, fmt::format("write to decode {} failed: {}", to, r.message), out);
    return out;
  }
  out.push_back(pump{});
  return out;
}

effects room::handle(ev::outcome e) {
  const auto& [link, address, in_group, token, ok, code, reason] = e;
  effects out;
  if (life_.draining() || life_.terminal()) return out;
  const errc c = code == errc::ok ? errc::internal : code;
  link_record* l = nullptr;
  for (auto& x : links_)
    if (x.link == link) l = &x;
  if (!l) {
    // A decode rank of this room's group failed before its prepare arrived.
    if (!ok && in_group) fail(c, fmt::format("decode {} reported: {}", address, reason), out);
    return out;
  }
  if (token != l->token) return out;  // an earlier incarnation of this room id
  if (!ok) {
    fail(c, fmt::format("decode {} reported: {}", l->address, reason), out);
    return out;
  }
  // A rank commits only once it knows its total from the announcement: a commit before it (a
  // confused or hostile peer) counts for nothing.
  if (!announced_) return out;
  l->committed = true;
  for (const auto& x : links_)
    if (!x.committed) return out;
  advance(room_status::success, out);
  return out;
}

effects room::handle(ev::cancel e) {
  effects out;
  fail(errc::cancelled, std::move(e.why), out);
  return out;
}

effects room::handle(ev::peer_down e) {
  effects out;
  fail(e.code, std::move(e.why), out);
  return out;
}

effects room::handle(ev::expired e) {
  effects out;
  const auto x = life_.on(life_ev::expired{e.kind, e.generation}).expired;
  if (!x) return out;  // no longer applies
  if (x->what == expiry::kind::drain_over) {
    finish_drain(fmt::format("; {} write batches were still in flight after the {} ms drain "
                             "(timeouts.drain_ms)",
                             batches_.size(), x->ms),
                 out);
    return out;
  }
  fail(errc::timed_out,
       fmt::format("timed out in {} after {} ms ({})", to_string(x->in), x->ms, x->waits), out);
  return out;
}

void room::fail(errc code, std::string reason, effects& out) {
  // With batches in flight the drain is bounded by timeouts.drain_ms.
  auto e = life_.on(life_ev::fail{code, reason, !batches_.empty()});
  if (!e.began_drain) return;
  out.push_back(tell_failed{std::move(reason), code, batches_.size()});
  // Queued chunks were answered ok when they arrived; the room's failure reaches the client as
  // an event and a poll answer, never as a second reply to those requests.
  queued_.clear();
  if (!e.empty()) out.push_back(life{std::move(e)});
  finish_drain({}, out);
}

/// Report Failed once nothing is in flight any more (or with `note` when the drain deadline
/// passed first); tell each rank how many of its writes completed.
void room::finish_drain(const std::string& note, effects& out) {
  if (!life_.draining()) return;
  if (!batches_.empty() && note.empty()) return;
  if (note.empty()) out.push_back(tell_drained{});
  out.push_back(life{life_.on(life_ev::drained{note})});
}

}  // namespace ferry::sender
