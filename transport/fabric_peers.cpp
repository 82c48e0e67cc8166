// Peers: their address-vector entries (shared by connections to one address), removal, which
// cuts the peer's connection, the fence, and on shm, which has no connection to cut, the renewal
// of the endpoint after a peer was cut.
#include <rdma/fi_domain.h>
#include <signal.h>

#include <cerrno>
#include <charconv>
#include <optional>
#include <string_view>

#include "transport/fabric_engine.hpp"

namespace ferry::transport::detail {
namespace {

/// shm endpoint renewal: how long the writes in flight get to complete before it (healthy ones
/// complete in microseconds to milliseconds; a write a fenced peer dropped never does).
constexpr auto renew_wait = std::chrono::seconds(1);

/// Replaced endpoints kept open at most (see fabric_engine::retired_): each holds its shm
/// region, a 16 MiB /dev/shm region.
constexpr size_t max_retired_endpoints = 16;

/// The process id in a shm address ("fi_shm://<pid>:<uid>:<index>" or without the prefix),
/// if it has one.
std::optional<pid_t> shm_address_pid(const std::vector<uint8_t>& address) {
  std::string_view text(reinterpret_cast<const char*>(address.data()), address.size());
  text = text.substr(0, text.find('\0'));
  if (text.starts_with("fi_shm://")) text.remove_prefix(9);
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), pid);
  if (ec != std::errc{} || pid <= 0 || end == text.data() + text.size() || *end != ':')
    return std::nullopt;
  return pid;
}

}  // namespace

result<peer_handle> fabric_engine::insert_peer(const std::vector<uint8_t>& address) {
  return run_exclusive<result<peer_handle>>([this, &address] { return do_insert_peer(address); });
}

void fabric_engine::insert_peer_async(std::vector<uint8_t> address,
                                      std::function<void(result<peer_handle>)> done) {
  run_queued([this, address = std::move(address), done = std::move(done)]() mutable {
    invoke_callback(*log_, "insert_peer", done, do_insert_peer(address));
  });
}

result<peer_handle> fabric_engine::do_insert_peer(const std::vector<uint8_t>& address) {
  result<peer_handle> out;
  if (address.empty()) return error{errc::peer_incompatible, "insert_peer: empty fabric address"};
  // Two connections to one peer address (e.g. a node that is both prefill and decode) share
  // one AV entry: count them, so removing one does not invalidate the other's handle.
  for (auto& [addr, e] : peers_)
    if (e.address == address) {
      ++e.refs;
      out.value = addr;
      log_->debug("inserted peer={} again ({} users)", addr, e.refs);
      return out;
    }
  // Removed, but still in the AV until the endpoint renewal: use that entry again.
  for (auto it = av_removals_after_renewal_.begin(); it != av_removals_after_renewal_.end(); ++it)
    if (it->second == address) {
      const fi_addr_t addr = it->first;
      peers_[addr] = peer_entry{1, address};
      removed_peers_.erase(addr);
      av_removals_after_renewal_.erase(it);
      out.value = addr;
      log_->debug("inserted peer={} again (its removal was pending)", addr);
      return out;
    }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  int rc = fi_av_insert(av_.get(), address.data(), 1, &addr, 0, nullptr);
  if (rc != 1 || addr == FI_ADDR_NOTAVAIL) {
    const error refused = rc < 0
                              ? fi_error("fi_av_insert", rc, errc::fabric_error)
                              : error{errc::peer_incompatible,
                                      "fi_av_insert: address of " + std::to_string(address.size()) +
                                          " bytes rejected by provider " + provider_};
    log_->error("{}", refused.message);
    return refused;
  }
  peers_[addr] = peer_entry{1, address};
  removed_peers_.erase(addr);
  out.value = addr;
  log_->debug("inserted peer={}", addr);
  return out;
}

void fabric_engine::add_peer_rails(peer_handle, std::vector<peer_rail> rails,
                                   std::function<void(result<uint32_t>)> done) {
  result<uint32_t> out;
  if (!rails.empty())
    out = error{errc::invalid_request,
                "add_peer_rails: this engine has one rail (fabric.rails 1, no express rail), "
                "asked for rail " +
                    std::to_string(rails.front().rail)};
  invoke_callback(*log_, "add_peer_rails", done, std::move(out));
}

void fabric_engine::remove_peer(peer_handle peer) {
  run_queued([this, peer] { do_remove_peer(peer); });
}

void fabric_engine::remove_peer_resolved(std::function<std::optional<peer_handle>()> resolve) {
  run_queued([this, resolve = std::move(resolve)] {
    if (auto peer = resolve()) do_remove_peer(*peer);
  });
}

void fabric_engine::fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                               std::function<void()> done) {
  run_queued([this, peer, regions = std::move(regions), done = std::move(done)]() mutable {
    do_fence_peer(peer, regions);
    invoke_callback(*log_, "fence_peer", done);
  });
}

void fabric_engine::fence_peer_resolved(std::function<std::optional<peer_handle>()> resolve,
                                        std::vector<region_id> regions,
                                        std::function<void()> done) {
  run_queued([this, resolve = std::move(resolve), regions = std::move(regions),
              done = std::move(done)]() mutable {
    do_fence_peer(resolve(), regions);
    invoke_callback(*log_, "fence_peer", done);
  });
}

void fabric_engine::do_fence_peer(std::optional<peer_handle> peer,
                                  const std::vector<region_id>& regions) {
  // One task, no completion read in between: once the keys are closed, the connection is cut
  // before the provider can place another byte of a write it had begun to receive.
  for (auto id : regions)
    if (auto r = do_deregister_region(id); !r)
      log_->error("fence: closing region {} failed: {}", id, r.message);
  if (peer) do_remove_peer(*peer);
}

void fabric_engine::do_remove_peer(peer_handle peer) {
  const error why{errc::peer_lost, "peer removed (peer " + std::to_string(peer) + ")"};
  pending_.for_each([&](batch_state* b) {
    if (b->batch.peer == peer) b->abort_unposted(why);
  });
  // Every batch that leaves the queue is no longer referenced by it, whichever its peer: one of
  // another peer that had posted its last write waits there for its turn to be popped, and
  // would otherwise never finish.
  std::vector<batch_state*> left;
  pending_.erase_if([&](batch_state* b) {
    if (!b->all_posted()) return false;
    left.push_back(b);
    return true;
  });
  for (batch_state* b : left) b->in_pending = false;
  // Posted writes to the peer complete (or fail) through the CQ as the provider decides.
  for (batch_state* b : left) maybe_finish(b);

  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    log_->warn("remove_peer: peer={} is not inserted", peer);
    return;
  }
  const bool renew = cfg_.keep_address ? it->second.writes_posted > 0 : writer_;
  if (renew_on_cut_ && renew) request_renewal(peer);
  if (renew_pending_) {
    // shm has no connection to cut. Unmapping the peer while this endpoint still has writes to
    // it posted crashes the provider's progress (it locks the unmapped peer region), so the
    // removal waits for the endpoint's renewal.
    if (--it->second.refs > 0) return;
    av_removals_after_renewal_[peer] = std::move(it->second.address);
    peers_.erase(it);
    removed_peers_.insert(peer);
    log_->debug("removed peer={} (its address leaves the AV at the endpoint renewal)", peer);
    return;
  }
  // fi_av_remove also closes ofi_rxm's connection to the peer (FI_AV_REMOVE_CLEANUP): a write
  // it had begun to receive is cut, not finished later.
  fi_addr_t addr = peer;
  int rc = fi_av_remove(av_.get(), &addr, 1, 0);
  if (rc != 0) log_->error("{} (peer={})", fi_error_text("fi_av_remove", rc), peer);
  if (--it->second.refs > 0) {
    // Another connection still uses this address: insert it again (the next write reconnects).
    fi_addr_t again = FI_ADDR_NOTAVAIL;
    rc = fi_av_insert(av_.get(), it->second.address.data(), 1, &again, 0, nullptr);
    if (rc == 1 && again == peer) {
      log_->debug("cut peer={}; still used by {} connection(s)", peer, it->second.refs);
      return;
    }
    log_->error("re-inserting peer={} after its cut gave {} (rc {}): its other users fail", peer,
                again, rc);
  }
  peers_.erase(it);
  removed_peers_.insert(peer);
  log_->debug("removed peer={}", peer);
}

void fabric_engine::request_renewal(peer_handle peer) {
  for (auto& [addr, e] : peers_) e.writes_posted = 0;  // the new endpoint has sent nothing yet
  if (renew_pending_) return;
  renew_pending_ = true;
  renew_deadline_ = clock_type::now() + renew_wait;
  renew_reason_ = "peer " + std::to_string(peer) + " was cut";
  log_->info(
      "shm: peer={} was cut on rail {}; holding new writes until the endpoint is renewed ({} "
      "in flight)",
      peer, label_, inflight_);
}

void fabric_engine::renew_endpoint() {
  renew_pending_ = false;
  // Closing the endpoint ends what its peers never answered; completions it had already queued
  // are read next, so only writes that truly never completed fail. While a peer may still read
  // its introduction (unanswered_), it is retired instead: open until read (`retired_`).
  if (unanswered_.empty()) ep_.reset();
  for (int i = 0; i < 64 && read_completions() > 0; ++i) {
  }
  if (!unanswered_.empty()) {
    // Kept open with its CQ, never read again, so its name still maps.
    retired_endpoint old{std::move(cq_), std::move(ep_), {}};
    std::string peers;
    for (auto& [peer, address] : unanswered_) {
      peers += (peers.empty() ? "" : ", ") + std::to_string(peer);
      old.waiting_on.push_back(std::move(address));
    }
    unanswered_.clear();
    log_->info(
        "shm: rail {} keeps its replaced endpoint open until peer(s) {} read its introduction",
        label_, peers);
    retired_.push_back(std::move(old));
    prune_retired(nullptr);
  }
  const error why{errc::fabric_write_failed,
                  "fabric endpoint renewed (" + renew_reason_ +
                      ", which may have fenced this endpoint): write never completed"};
  std::vector<bool> free(write_contexts_.size(), false);
  for (op_context* c : free_contexts_) free[static_cast<size_t>(c - write_contexts_.data())] = true;
  uint32_t failed = 0;
  for (size_t i = 0; i < write_contexts_.size(); ++i)
    if (!free[i]) {
      complete_op(&write_contexts_[i], false, why);
      ++failed;
    }
  for (auto& [peer, address] : av_removals_after_renewal_) {
    fi_addr_t addr = peer;
    if (int rc = fi_av_remove(av_.get(), &addr, 1, 0); rc != 0)
      log_->error("{} (peer={})", fi_error_text("fi_av_remove", rc), peer);
  }
  av_removals_after_renewal_.clear();
  cq_.reset();
  auto reopened = open_cq();
  if (reopened) reopened = open_endpoint();
  if (!reopened) {
    // Without an endpoint nothing can be sent: fail what waits, and stop.
    log_->error("shm endpoint renewal of rail {} failed: {}; the engine stops", label_,
                reopened.message);
    stop_requested_.store(true);
    return;
  }
  log_->info("shm endpoint of rail {} renewed after {}: {} write(s) that never completed failed",
             label_, renew_reason_, failed);
}

void fabric_engine::prune_retired(const std::vector<uint8_t>* answered) {
  // A write's answer costs a comparison; the liveness probes (a syscall each) run on the tick.
  for (auto& r : retired_)
    std::erase_if(r.waiting_on, [answered](const std::vector<uint8_t>& address) {
      if (answered != nullptr) return address == *answered;
      const auto pid = shm_address_pid(address);
      return pid && ::kill(*pid, 0) != 0 && errno == ESRCH;
    });
  const auto before = retired_.size();
  std::erase_if(retired_, [](const retired_endpoint& r) { return r.waiting_on.empty(); });
  if (retired_.size() != before)
    log_->info("shm: rail {} closed {} replaced endpoint(s) no peer can still read", label_,
               before - retired_.size());
  // Bounded: only peers cut while our first post to them was unanswered leave one here, and a
  // hung one is not inserted again before it answers. Past the bound, the oldest is closed.
  while (retired_.size() > max_retired_endpoints) {
    log_->warn(
        "shm: rail {} closes a replaced endpoint that {} peer(s) may not have read yet (more "
        "than {} kept): such a peer crashes if it reads it later (libfabric 1.17)",
        label_, retired_.front().waiting_on.size(), max_retired_endpoints);
    retired_.erase(retired_.begin());
  }
}

}  // namespace ferry::transport::detail
