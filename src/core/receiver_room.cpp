#include "core/receiver_room.hpp"

#include <fmt/format.h>

namespace ferry::receiver {

room::room(uint64_t id, lifecycle_limits limits, rank_schema mine, std::vector<std::string> named,
           uint64_t first_token, uint32_t pages, uint64_t staging_capacity, bool checks)
    : id_(id),
      life_(limits, waits),
      mine_(mine),
      first_token_(first_token),
      pages_(pages),
      capacity_(staging_capacity),
      checks_(checks) {
  named_.resize(named.size());
  for (size_t i = 0; i < named.size(); ++i) named_[i].address = std::move(named[i]);
}

bool room::all_accepted() const {
  if (!selected_) return false;
  for (const auto& l : links_)
    if (!l.accepted) return false;
  return true;
}

const link_record* room::link_of(size_t i) const {
  for (const auto& l : links_)
    if (l.named == i) return &l;
  return nullptr;
}

link_record* room::link(size_t i, uint64_t token) {
  for (auto& l : links_)
    if (l.named == i) return l.token == token ? &l : nullptr;  // not this incarnation's
  return nullptr;
}

void room::advance(room_status s, effects& out) {
  auto e = life_.on(life_ev::advance{s});
  if (!e.empty()) out.push_back(life{std::move(e)});
}

effects room::on(event e) {
  return std::visit([this](auto& x) { return handle(std::move(x)); }, e);
}

effects room::handle(ev::start) { return {life{life_.on(life_ev::start{})}}; }

effects room::handle(ev::resolved e) {
  const auto& [i, schema, unpack_bytes, optional, asks] = e;
  effects out;
  if (i >= named_.size() || ended()) return out;
  auto& n = named_[i];
  if (n.resolved || !n.unusable.empty()) return out;
  n.resolved = true;
  n.schema = schema;
  n.unpack_bytes = unpack_bytes;
  n.optional = optional && unpack_bytes;
  n.asks = asks;
  if (++looked_up_ == named_.size()) select(out);
  return out;
}

effects room::handle(ev::unusable e) {
  auto& [i, code, why] = e;
  effects out;
  if (i >= named_.size() || ended()) return out;
  auto& n = named_[i];
  if (n.resolved || !n.unusable.empty()) return out;
  n.unusable = std::move(why);
  n.code = code;
  if (++looked_up_ == named_.size()) select(out);
  return out;
}

/// Every named peer finished its handshake or failed: pick the ranks the geometry needs among
/// the usable ones. A peer that could not be used matters only if the geometry needs it.
void room::select(effects& out) {
  std::vector<rank_schema> schemas;
  std::vector<size_t> usable;
  std::string first_unusable;
  errc first_code = errc::peer_unreachable;
  for (size_t i = 0; i < named_.size(); ++i) {
    if (named_[i].resolved) {
      schemas.push_back(named_[i].schema);
      usable.push_back(i);
    } else if (first_unusable.empty()) {
      first_unusable = named_[i].unusable;
      first_code = named_[i].code;
    }
  }
  selected_ = true;
  if (usable.empty()) return fail(first_code, first_unusable, false, out);
  auto chosen = select_prefill_peers(mine_, schemas);
  if (!chosen)
    return fail(
        first_unusable.empty() ? chosen.code : first_code,
        first_unusable.empty() ? chosen.message : chosen.message + " (" + first_unusable + ")",
        false, out);
  uint64_t need = 0;
  bool all_ask = true;
  for (size_t k : chosen.value) {
    const size_t i = usable[k];
    link_record l;
    l.named = i;
    l.address = named_[i].address;
    l.token = first_token_ + i;
    l.unpack_bytes = named_[i].unpack_bytes;
    l.optional = named_[i].optional;
    need += l.unpack_bytes;
    all_ask = all_ask && (!l.unpack_bytes || named_[i].asks);
    links_.push_back(std::move(l));
  }
  if (need && (capacity_ == 0 || need > capacity_)) {
    out.push_back(no_staging{need});
    for (auto& l : links_) l.unpack_bytes = 0;
  } else {
    staging_need_ = need;
    // Held from the first write's approach, not from the prepare: a room the engine has not
    // computed yet holds no staging.
    on_request_ = need && all_ask;
    for (auto& l : links_) l.on_request = on_request_ && l.unpack_bytes;
  }
  reserve_and_prepare(out);
}

/// Reserve one staging block for every link whose KV lands in staging, then send the prepares.
void room::reserve_and_prepare(effects& out) {
  if (!selected_ || prepared_ || reserving_ || ended()) return;
  if (staging_need_ && !staging_ && !on_request_) {
    // A block only to scatter into is not worth a wait: it would be held from now until the
    // commit, however long the prefill takes to send, while direct writes work at once.
    bool wait = false;
    for (const auto& l : links_) wait = wait || (l.unpack_bytes && !l.optional);
    reserving_ = true;
    out.push_back(reserve_staging{staging_need_, wait});
    return;
  }
  prepared_ = true;
  out.push_back(send_prepares{});
}

effects room::handle(ev::staging_requested e) {
  const auto [i, token] = e;
  effects out;
  auto* l = link(i, token);
  // Only a link whose prepare said so asks, and once: anything else is ignored.
  if (!l || !l->on_request || l->requested || ended()) return out;
  l->requested = true;
  if (staging_ || !staging_need_) {
    out.push_back(grant{static_cast<size_t>(l - links_.data())});
  } else if (!reserving_) {
    reserving_ = true;
    bool wait = false;
    for (const auto& x : links_) wait = wait || (x.unpack_bytes && !x.optional);
    out.push_back(reserve_staging{staging_need_, wait});
  }
  return out;
}

/// Tell every link that asked where its KV lands (a block reserved, or none).
void room::grant_requested(effects& out) {
  for (size_t j = 0; j < links_.size(); ++j)
    if (links_[j].requested) out.emplace_back(std::in_place_type<grant>, grant{j});
}

effects room::handle(ev::staging_reserved e) {
  uint64_t at = e.at;
  effects out;
  if (!reserving_) return {release_staging{at}};  // not asked for: not ours to keep
  reserving_ = false;
  staging_ = at;
  for (auto& l : links_)
    if (l.unpack_bytes) {
      l.staging = at;
      at += l.unpack_bytes;
    }
  if (ended()) {
    release(out);
    return out;
  }
  if (on_request_)
    grant_requested(out);
  else
    reserve_and_prepare(out);
  return out;
}

effects room::handle(ev::staging_freed) {
  effects out;
  if (!reserving_ || ended()) return out;
  reserving_ = false;  // the reservation that waited is answered by asking again
  if (!on_request_) {
    reserve_and_prepare(out);
  } else if (!staging_) {
    reserving_ = true;
    out.push_back(reserve_staging{staging_need_, true});
  }
  return out;
}

effects room::handle(ev::staging_declined) {
  effects out;
  if (!reserving_) return out;
  reserving_ = false;
  if (ended()) return out;
  bool optional = true;
  for (const auto& l : links_) optional = optional && (!l.unpack_bytes || l.optional);
  if (optional) {
    out.push_back(no_staging{staging_need_, true});
    for (auto& l : links_) l.unpack_bytes = 0;
    staging_need_ = 0;
  }
  if (!on_request_) {
    reserve_and_prepare(out);  // otherwise it must land in staging: ask again, and wait
  } else if (optional) {
    grant_requested(out);  // no offset: they write directly
  } else {
    reserving_ = true;
    out.push_back(reserve_staging{staging_need_, true});
  }
  return out;
}

effects room::handle(ev::prepare_ack e) {
  const auto& [i, token, ok, code, reason] = e;
  effects out;
  auto* l = link(i, token);
  if (!l || life_.terminal()) return out;
  // A refusal settles only a link that never accepted: one that did may still have writes of the
  // room in flight, which only its drain report or a fence accounts for.
  if (!ok && !l->accepted) l->refused = true;
  if (life_.draining()) {
    finish_drain(out);
    return out;
  }
  if (!ok) {
    fail(code == errc::ok ? errc::peer_incompatible : code,
         fmt::format("prefill {} refused the prepare: {}", l->address, reason), true, out);
    return out;
  }
  l->accepted = true;
  if (all_accepted()) advance(room_status::waiting_for_input, out);
  return out;
}

effects room::handle(ev::announce e) {
  const auto [i, token, writes, bytes] = e;
  effects out;
  auto* l = link(i, token);
  if (!l || ended()) return out;
  if (l->announced) {
    fail(errc::internal, "prefill " + l->address + " announced twice", true, out);
    return out;
  }
  // Its KV lands in staging at an offset it must have asked for: a rank that announces without
  // asking did not write it there, and unpacking the block would put other bytes in the pages.
  if (l->on_request && !l->requested) {
    fail(errc::internal,
         "prefill " + l->address +
             " announced its writes without asking where its KV lands in "
             "staging",
         true, out);
    return out;
  }
  l->announced = writes;
  bytes_ += bytes;
  advance(room_status::transferring, out);
  uint64_t total = 0;
  for (const auto& x : links_) {
    if (!x.announced) return out;
    total += *x.announced;
  }
  evaluate(commit_.announce(total), out);
  return out;
}

effects room::handle(ev::outcome e) {
  const auto& [i, token, ok, code, reason] = e;
  effects out;
  auto* l = link(i, token);
  if (!l || ok) return out;
  fail(code == errc::ok ? errc::internal : code,
       fmt::format("prefill {} reported: {}", l->address, reason), true, out);
  return out;
}

effects room::handle(ev::drained e) {
  const auto [i, token, completed, failed] = e;
  effects out;
  auto* l = link(i, token);
  if (!l || l->drained || life_.terminal()) return out;
  l->drained = completed;
  // A prefill rank's room may fail (and drain) before this one hears of it.
  fail(errc::peer_lost, fmt::format("prefill {} failed the room", l->address), true, out);
  // Landed notifications account for the writes they cover, and no notification covers a
  // batch whose write failed (tcp: one marker after the batch's last write): its other writes
  // may still be in flight. Only the fence makes sure none of them lands later.
  if (failed > 0 && !l->fenced) {
    l->must_fence = true;
    out.push_back(fence{i, fmt::format("fenced: prefill {} reported {} failed write(s) of room "
                                       "{}; the rest of their batches may still land",
                                       l->address, failed, id_)});
  }
  finish_drain(out);
  return out;
}

effects room::handle(ev::landed e) {
  const auto [token, count] = e;
  effects out;
  for (auto& l : links_)
    if (l.token == token) l.landed += count;
  if (life_.terminal()) return out;
  if (life_.draining()) {
    finish_drain(out);
    return out;
  }
  advance(room_status::transferring, out);
  evaluate(commit_.add_landed(count), out);
  return out;
}

void room::evaluate(commit_counter::state c, effects& out) {
  switch (c) {
    case commit_counter::state::pending:
      return;
    case commit_counter::state::overflow:
      return fail(errc::internal,
                  fmt::format("{} writes landed but the prefill ranks announced {}",
                              commit_.landed(), *commit_.expected()),
                  true, out);
    case commit_counter::state::complete:
      if (unpacking_ || verifying_) return;
      for (const auto& l : links_)
        if (l.staging) {
          unpacking_ = true;
          out.push_back(unpack{});
          return;
        }
      return landed_all(out);
  }
}

effects room::handle(ev::unpacked) {
  effects out;
  if (!unpacking_ || ended() || verifying_) return out;
  landed_all(out);
  return out;
}

void room::landed_all(effects& out) {
  if (!checks_) return succeed(out);
  verifying_ = true;
  out.emplace_back(std::in_place_type<verify>);
}

effects room::handle(ev::verified e) {
  const auto& [code, reason] = e;
  effects out;
  if (!verifying_ || ended()) return out;
  verifying_ = false;
  if (code == errc::ok) {
    succeed(out);
    return out;
  }
  fail(code, reason, true, out);
  return out;
}

void room::succeed(effects& out) {
  release(out);
  out.emplace_back(std::in_place_type<tell>, tell{true, {}, errc::ok});
  advance(room_status::success, out);
}

effects room::handle(ev::cancel e) {
  effects out;
  fail(errc::cancelled, std::move(e.why), true, out);
  return out;
}

effects room::handle(ev::peer_down e) {
  auto& [i, fenced, code, why] = e;
  effects out;
  if (i >= named_.size() || life_.terminal()) return out;
  if (!selected_) {
    // Before selection: this named peer is out; whether that matters is decided once every
    // named peer is resolved.
    auto& n = named_[i];
    if (n.resolved) {
      n.resolved = false;
      --looked_up_;
    }
    return handle(ev::unusable{i, code, std::move(why)});
  }
  // After selection, a named peer the geometry left out does not matter.
  link_record* l = nullptr;
  for (auto& x : links_)
    if (x.named == i) l = &x;
  if (!l) return out;
  l->fenced = l->fenced || fenced;
  fail(code, why, true, out);
  finish_drain(out);
  return out;
}

effects room::handle(ev::expired e) {
  effects out;
  const auto x = life_.on(life_ev::expired{e.kind, e.generation}).expired;
  if (!x) return out;  // no longer applies
  if (x->what == expiry::kind::timed_out) {
    fail(errc::timed_out,
         fmt::format(
             "timed out in {} after {} ms ({}: {} landed, {} announced{})", to_string(x->in), x->ms,
             x->waits, commit_.landed(),
             commit_.expected() ? std::to_string(*commit_.expected()) : "none",
             reserving_ ? fmt::format("; waiting for {} bytes of staging", staging_need_) : ""),
         true, out);
    return out;
  }
  // The drain deadline: a rank that has not drained may still have writes of this room in
  // flight, so the room's pages cannot be handed back yet. Fence those ranks; each fence
  // arrives as peer_down and completes the drain.
  std::string waiting;
  for (size_t j = 0; j < links_.size(); ++j) {
    const auto& l = links_[j];
    if (l.settled() || l.must_fence) continue;  // (a fence is on its way)
    waiting +=
        fmt::format("{}{} ({})", waiting.empty() ? "" : ", ", l.address,
                    l.drained ? fmt::format("{} of {} drained writes landed", l.landed, *l.drained)
                              : "no drain report");
    out.push_back(fence{j, fmt::format("fenced: room {} did not drain within {} ms "
                                       "(timeouts.drain_ms)",
                                       id_, x->ms)});
  }
  if (waiting.empty()) {
    finish_drain(out);
    return out;
  }
  drain_note_ =
      fmt::format("; drain incomplete after {} ms (timeouts.drain_ms), fenced: {}", x->ms, waiting);
  return out;
}

void room::fail(errc code, std::string reason, bool tell_peers, effects& out) {
  // Once the prepares went out, prefill ranks may write: the drain is bounded by drain_ms.
  auto e = life_.on(life_ev::fail{code, reason, prepared_});
  if (!e.began_drain) return;
  out.push_back(failed{reason});
  if (!prepared_) {
    // No prepare went out: no prefill rank can write into this room.
    for (auto& l : links_) l.refused = true;
  } else if (tell_peers) {
    out.push_back(tell{false, reason, code});
  }
  if (!e.empty()) out.push_back(life{std::move(e)});
  finish_drain(out);
}

/// Report Failed once no write of the room can land any more: every rank refused, is fenced,
/// or drained and all of its completed writes landed. Nothing else reports it: when the drain
/// deadline passes first, the ranks still open are fenced, and their fences complete the drain.
void room::finish_drain(effects& out) {
  if (!life_.draining()) return;
  for (const auto& l : links_)
    if (!l.settled()) return;
  release(out);
  out.push_back(life{life_.on(life_ev::drained{drain_note_})});
}

void room::release(effects& out) {
  for (auto& l : links_) l.staging.reset();
  if (staging_) out.push_back(release_staging{*staging_});
  staging_.reset();
}

}  // namespace ferry::receiver
