// The progress thread: it takes queued work, posts writes, reads completions, delivers arrived
// immediates, and blocks when idle (the design, threading and waiting, is at the top of
// fabric_engine.hpp); on stop it drains what is posted and fails the rest.
#include <poll.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "transport/fabric_engine.hpp"

namespace ferry::transport::detail {
namespace {

/// Completions read per fi_cq_read: one batch amortises the provider's progress call.
constexpr size_t cq_batch = 64;
/// Empty polls continue this long before blocking: a burst's next write or completion usually
/// arrives within microseconds, and a blocking wait costs a wake-up of tens of microseconds.
constexpr auto spin_budget = std::chrono::microseconds(30);
/// Upper bounds of one blocking wait on the CQ fd. The fd does not signal everything the
/// provider must progress: ofi_rxm runs connection management inside fi_cq_read (at most every
/// FI_OFI_RXM_CM_PROGRESS_INTERVAL, 10 ms by default), and an initiator blocked on the fd misses
/// "connected" (measured: first write 63-83 ms with a 50 ms cap, 18-27 ms with 1 ms, raw
/// busy-polling 30-50 ms). So: short while writes are posted or queued, longer when idle.
constexpr auto fd_wait_cap_busy = std::chrono::milliseconds(1);
constexpr auto fd_wait_cap_idle = std::chrono::milliseconds(10);
/// Without a wait fd (shm) the loop sleeps in doubling steps, capped by how long it has been
/// idle: short caps keep latency low within a transfer; long ones keep an idle daemon cheap.
/// A wake-up costs 15-35 µs of CPU on the reference VM (timer + context switch), so 1 ms steps
/// are 1.5-3.5 % of a core and 4 ms steps under 1 %; the price is that the first write after
/// a second of silence waits up to 4 ms.
constexpr auto sleep_first = std::chrono::microseconds(20);
constexpr auto sleep_cap_recent = std::chrono::microseconds(200);
constexpr auto recent_window = std::chrono::milliseconds(20);
constexpr auto sleep_cap_warm = std::chrono::milliseconds(1);
constexpr auto warm_window = std::chrono::seconds(1);
constexpr auto sleep_cap_cold = std::chrono::milliseconds(4);
/// How long `stop` waits for posted writes to complete before failing them.
constexpr auto stop_drain_limit = std::chrono::seconds(2);
/// A streak of refused posts (-FI_EAGAIN) this long is logged: healthy queues drain in
/// microseconds to milliseconds.
constexpr auto refused_warn_after = std::chrono::seconds(2);
/// shm (libfabric 1.17): writes up to this size are copied through inject buffers.
constexpr uint64_t shm_inject_size = 4096;

}  // namespace

void fabric_engine::run() {
  std::lock_guard<std::recursive_mutex> exclusive(fabric_mutex_);
  progress_thread_id_.store(std::this_thread::get_id(), std::memory_order_release);
  log_->debug("progress thread started provider={}", provider_);

  auto last_activity = clock_type::now();
  clock_type::duration sleep_step = sleep_first;
  while (!stop_requested_.load(std::memory_order_relaxed)) {
    bool active = take_queue();
    active |= post_writes();
    const size_t completions = read_completions();
    if (completions > 0) {
      active = true;
      // Room may have opened for more writes; post before the next read.
      post_writes();
    }
    active |= deliver_immediates();

    const auto now = clock_type::now();
    if (renew_pending_ && (inflight_ == 0 || now >= renew_deadline_)) {
      renew_endpoint();
      active = true;
    }
    if (!retired_.empty() && now >= next_retired_check_) {
      prune_retired(nullptr);
      next_retired_check_ = now + std::chrono::seconds(1);
    }
    if (active) {
      last_activity = now;
      sleep_step = sleep_first;
      continue;
    }
    // Spin only right after real activity; a wake-up that finds nothing goes back to sleep.
    if (now - last_activity < spin_budget) continue;
    block(now - last_activity, sleep_step);
  }
  drain_and_fail_all();
  // Thread ids are reused after join; a later thread must not pass for the progress thread.
  progress_thread_id_.store(std::thread::id{}, std::memory_order_release);
  log_->debug("progress thread stopped provider={}", provider_);
}

bool fabric_engine::take_queue() {
  if (!queue_nonempty_.load()) return false;
  std::deque<work_item> items;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    items.swap(queue_);
    queue_nonempty_.store(false);
  }
  for (auto& item : items) {
    if (item.batch) {
      admit(std::move(item.batch));
    } else if (item.task) {
      item.task();
    }
  }
  return !items.empty();
}

void fabric_engine::admit(std::unique_ptr<batch_state> b) {
  batch_state* raw = b.get();
  live_.push_back(std::move(b));
  raw->self = std::prev(live_.end());
  const peer_handle peer = raw->batch.peer;
  if (removed_peers_.count(peer) != 0) {
    raw->abort_unposted({errc::peer_lost, "peer removed (peer " + std::to_string(peer) + ")"});
  } else if (peers_.count(peer) == 0) {
    raw->abort_unposted(
        {errc::invalid_request, "unknown peer " + std::to_string(peer) + " (not inserted)"});
  } else if (raw->cancel_due()) {
    raw->truncate(split_commit_);  // its room failed before it reached us: nothing is posted
  }
  if (raw->all_posted()) {
    maybe_finish(raw);  // empty or rejected: done right away
  } else {
    raw->in_pending = true;
    pending_.push(peer, raw);
  }
}

void fabric_engine::do_cancel_writes(const write_cancel* cancel) {
  std::vector<batch_state*> finished;
  pending_.for_each([&](batch_state* b) {
    if (b->batch.cancel.get() == cancel) b->truncate(split_commit_);
  });
  pending_.erase_if([&](batch_state* b) {
    if (b->batch.cancel.get() != cancel || !b->all_posted()) return false;
    finished.push_back(b);
    return true;
  });
  pending_.refresh();  // a batch left with only its marker to post goes first
  for (auto* b : finished) {
    b->in_pending = false;
    maybe_finish(b);
  }
}

bool fabric_engine::post_writes() {
  bool posted_any = false;
  if (renew_pending_) return false;  // held until the endpoint is renewed
  size_t peers_at_bound = 0;         // consecutive peers passed over for their bytes in flight
  while (inflight_ < write_contexts_.size() && !pending_.empty()) {
    batch_state* b = pending_.front();
    if (b->cancel_due()) b->truncate(split_commit_);  // cancelled since the sweep was queued
    if (b->all_posted()) {
      pending_.pop_front();
      b->in_pending = false;
      maybe_finish(b);
      continue;
    }
    const write_op& op = b->batch.ops[b->next];
    region* r = op.local_region < regions_.size() ? &regions_[op.local_region] : nullptr;
    if (b->marker_pending) {
      // The data is posted; its marker carries the immediate (split commit, tcp).
      if (!post_one(b, op, *r, true)) break;
      b->marker_pending = false;
      if (!b->all_posted()) b->advance();  // (a failed post gave up on the rest)
      posted_any = true;
      peers_at_bound = 0;
      pending_.next_turn();
      continue;
    }
    if (cfg_.max_inflight_bytes != 0) {
      const uint64_t in_flight = inflight_bytes_[b->batch.peer];
      if (in_flight != 0 && in_flight + op.length > cfg_.max_inflight_bytes) {
        if (++peers_at_bound >= pending_.peers()) break;  // every peer is at its bound
        pending_.skip_peer();
        continue;
      }
    }
    if (r != nullptr && r->deregistered) {
      b->abort_unposted(
          {errc::invalid_request,
           "invalid write: local region " + std::to_string(op.local_region) + " is deregistered"});
      continue;
    }
    if (r == nullptr || op.length == 0 || op.local_offset > r->length ||
        op.length > r->length - op.local_offset) {
      b->abort_unposted({errc::invalid_request,
                         "invalid write: local region " + std::to_string(op.local_region) +
                             " offset " + std::to_string(op.local_offset) + " length " +
                             std::to_string(op.length) + " is outside the registered regions"});
      continue;
    }
    if (!post_one(b, op, *r, false)) break;
    posted_any = true;
    peers_at_bound = 0;
    if (split_commit_ && !b->all_posted() && b->marked(b->next)) {
      b->marker_pending = true;  // the marker goes next, before any other write of this peer
      continue;
    }
    if (!b->all_posted()) b->advance();
    pending_.next_turn();
  }
  return posted_any;
}

bool fabric_engine::post_one(batch_state* b, const write_op& op, region& r, bool marker) {
  op_context* ctx = free_contexts_.back();
  ctx->batch = b;
  ctx->source = op.local_region;
  ctx->marker = marker;
  void* local = static_cast<char*>(r.base) + op.local_offset;
  const char* call = "fi_writedata";
  ssize_t rc;
  if (renew_on_cut_ && op.length <= shm_inject_size) {
    // shm would copy a write this small through an inject buffer of the *target's* region; a
    // target that rejects the write (a closed key: it fenced us) never returns that buffer, and
    // after ~1024 such leaks every initiator writing small pieces to it crashes. Asking for
    // delivery completion makes shm copy it by cross-memory attach instead, like a large write:
    // a rejection then leaks nothing (it never completes; see renew_on_cut_).
    call = "fi_writemsg";
    iovec iov{local, op.length};
    fi_rma_iov rma{op.remote_addr, op.length, op.remote_key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &r.desc;
    msg.iov_count = 1;
    msg.addr = b->batch.peer;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &ctx->provider_scratch;
    msg.data = op.imm;
    rc = fi_writemsg(ep_.get(), &msg, FI_REMOTE_CQ_DATA | FI_COMPLETION | FI_DELIVERY_COMPLETE);
  } else if (!split_commit_) {
    rc = fi_writedata(ep_.get(), local, op.length, r.desc, op.imm, b->batch.peer, op.remote_addr,
                      op.remote_key, &ctx->provider_scratch);
  } else if (!marker) {
    call = "fi_write";
    rc = fi_write(ep_.get(), local, op.length, r.desc, b->batch.peer, op.remote_addr, op.remote_key,
                  &ctx->provider_scratch);
  } else {
    rc = fi_writedata(ep_.get(), local, 0, r.desc, op.imm, b->batch.peer, op.remote_addr,
                      op.remote_key, &ctx->provider_scratch);
  }
  writer_ = true;          // taken or refused: shm introduced this endpoint to the peer
  if (rc == -FI_EAGAIN) {  // provider queue full: progress the CQ, retry next round
    if (renew_on_cut_ && !unanswered_.contains(b->batch.peer))
      if (auto p = peers_.find(b->batch.peer); p != peers_.end())
        unanswered_.emplace(b->batch.peer, p->second.address);  // maybe its introduction
    const auto now = clock_type::now();
    if (!refused_since_) refused_since_ = now;
    if (!refused_logged_ && now - *refused_since_ > refused_warn_after) {
      refused_logged_ = true;
      log_->warn(
          "rail {}: the provider has refused every write for {} ms ({} to peer {}, {} in "
          "flight): the peer may not be taking writes",
          label_,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - *refused_since_).count(),
          call, b->batch.peer, inflight_);
    }
    return false;
  }
  if (refused_logged_)
    log_->info("rail {}: the provider takes writes again (peer {})", label_, b->batch.peer);
  refused_since_.reset();
  refused_logged_ = false;
  if (rc != 0) {
    const error why{errc_of_fi(rc, errc::fabric_write_failed),
                    fi_error_text(call, rc) + " (peer " + std::to_string(b->batch.peer) +
                        ", length " + std::to_string(op.length) + ")"};
    log_->error("{}", why.message);
    b->abort_unposted(why);  // a data part already posted completes on its own
    return true;
  }
  free_contexts_.pop_back();
  ctx->peer = b->batch.peer;
  ctx->bytes = marker ? 0 : op.length;
  if (ctx->bytes != 0) inflight_bytes_[ctx->peer] += ctx->bytes;
  stat_writes_posted_.fetch_add(1, std::memory_order_relaxed);
  stat_bytes_posted_.fetch_add(ctx->bytes, std::memory_order_relaxed);
  stat_writes_in_flight_.fetch_add(1, std::memory_order_relaxed);
  stat_bytes_in_flight_.fetch_add(ctx->bytes, std::memory_order_relaxed);
  if (renew_on_cut_) {
    if (auto p = peers_.find(b->batch.peer); p != peers_.end()) {
      ++p->second.writes_posted;
      if (!unanswered_.empty()) unanswered_.erase(b->batch.peer);
      if (!retired_.empty()) prune_retired(&p->second.address);
    }
  }
  ++r.posted;
  ++inflight_;
  ++b->outstanding;
  return true;
}

size_t fabric_engine::read_completions() {
  if (!cq_) return 0;  // a failed endpoint renewal
  fi_cq_data_entry entries[cq_batch];
  ssize_t n = fi_cq_read(cq_.get(), entries, cq_batch);
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    handle_error_entry();
    return 1;
  }
  if (n < 0) {
    // Once per distinct code: a broken CQ would otherwise log on every loop iteration.
    if (n != last_cq_error_) log_->error("{}", fi_error_text("fi_cq_read", n));
    last_cq_error_ = n;
    return 0;
  }
  last_cq_error_ = 0;
  for (ssize_t i = 0; i < n; ++i) {
    const fi_cq_data_entry& e = entries[i];
    auto* ctx = static_cast<op_context*>(e.op_context);
    if ((e.flags & FI_REMOTE_CQ_DATA) != 0) {
      auto [it, fresh] = imm_index_.try_emplace(e.data, imm_batch_.size());
      if (fresh) {
        imm_batch_.emplace_back(e.data, 1);
      } else {
        ++imm_batch_[it->second].second;
      }
      // Without FI_RX_CQ_DATA the op_context of a remote entry is meaningless.
      if (rx_cq_data_ && ctx != nullptr) repost_receive(ctx);
      continue;
    }
    if (ctx == nullptr) continue;
    if (ctx->what == op_context::kind::receive) {
      repost_receive(ctx);
    } else {
      complete_op(ctx, true, {});
    }
  }
  return static_cast<size_t>(n);
}

void fabric_engine::handle_error_entry() {
  fi_cq_err_entry err{};
  ssize_t rc = fi_cq_readerr(cq_.get(), &err, 0);
  if (rc < 0) {
    if (rc != -FI_EAGAIN) log_->error("{}", fi_error_text("fi_cq_readerr", rc));
    return;
  }
  char buf[256] = {};
  const char* prov_text = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, buf, sizeof buf);
  auto* ctx = static_cast<op_context*>(err.op_context);
  if (ctx != nullptr && ctx->what == op_context::kind::write) {
    const error why{errc_of_fi(err.err, errc::fabric_write_failed),
                    std::string("write completion error: ") + fi_strerror(err.err) +
                        " (prov_errno " + std::to_string(err.prov_errno) + ": " +
                        (prov_text ? prov_text : "?") + ")"};
    // Warn once per batch (its first failure); a dead peer can fail thousands of writes.
    const bool first = ctx->batch != nullptr && ctx->batch->result.ok();
    log_->log(first ? spdlog::level::warn : spdlog::level::debug, "{} peer={}", why.message,
              ctx->batch ? ctx->batch->batch.peer : 0);
    complete_op(ctx, false, why);
    return;
  }
  if (ctx != nullptr && ctx->what == op_context::kind::receive) {
    if (err.err != FI_ECANCELED) {
      log_->debug("receive completion error: {} (prov_errno {}: {})", fi_strerror(err.err),
                  err.prov_errno, prov_text ? prov_text : "?");
      repost_receive(ctx);
    }
    return;
  }
  log_->warn("completion error without context: {} (prov_errno {}: {})", fi_strerror(err.err),
             err.prov_errno, prov_text ? prov_text : "?");
}

void fabric_engine::repost_receive(op_context* ctx) {
  // The consumed receive's own context: a context must never be posted twice at once. (No
  // endpoint: it is being renewed, and the new one posts every receive afresh.)
  if (!ep_) return;
  ssize_t rc = fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &ctx->provider_scratch);
  if (rc != 0) log_->error("{}", fi_error_text("fi_recv", rc));
}

void fabric_engine::complete_op(op_context* ctx, bool ok, const error& why) {
  batch_state* b = ctx->batch;
  ctx->batch = nullptr;
  free_contexts_.push_back(ctx);
  --inflight_;
  stat_writes_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  stat_bytes_in_flight_.fetch_sub(ctx->bytes, std::memory_order_relaxed);
  if (ctx->bytes != 0) {
    auto in_flight = inflight_bytes_.find(ctx->peer);
    if ((in_flight->second -= ctx->bytes) == 0) inflight_bytes_.erase(in_flight);
    ctx->bytes = 0;
  }
  region& r = regions_[ctx->source];
  // The deferred close; a failure is logged there, and nobody waits for it.
  if (--r.posted == 0 && r.deregistered && r.mr) (void)close_region_mr(ctx->source);
  if (b == nullptr) return;
  --b->outstanding;
  // A write counts once: by its marker in a split commit (the data part only reports errors).
  // With notify::batch_end one marker stands for every write of the batch, so a failed data
  // write counts as failed itself: `failed` > 0 says some write may not have landed.
  const bool counts = !split_commit_ || ctx->marker;
  if (ok) {
    if (counts) ++b->result.completed;
  } else {
    if (counts || b->batch.mode == notify::batch_end) {
      b->fail(1, why);
    } else {
      b->note(why);
    }
    // First error: do not post the rest of this batch.
    b->abort_unposted(why);
  }
  maybe_finish(b);
}

void fabric_engine::maybe_finish(batch_state* b) {
  // A batch aborted while still queued in pending_ is dropped from there lazily (post_writes
  // checks all_posted() first); it finishes once it has left the queue.
  if (!b->all_posted() || b->outstanding != 0 || b->in_pending) return;
  std::unique_ptr<batch_state> owned = std::move(*b->self);
  live_.erase(b->self);
  invoke_callback(*log_, "batch_done", owned->batch.done, std::move(owned->result));
}

bool fabric_engine::deliver_immediates() {
  if (credit_returned_.load(std::memory_order_relaxed) && credit_returned_.exchange(false)) {
    credit_ = true;
  }
  if (imm_batch_.empty()) return false;
  if (!immediates_) {
    // Nobody consumes immediates (a pure initiator): drop them instead of aggregating forever.
    imm_batch_.clear();
    imm_index_.clear();
    return false;
  }
  if (!credit_) return false;
  credit_ = false;
  immediate_counts out;
  out.swap(imm_batch_);
  imm_index_.clear();
  invoke_callback(*log_, "immediates", immediates_, std::move(out));
  return true;
}

std::vector<rail_stats> fabric_engine::rail_activity() const {
  rail_stats s;
  s.name = label_;
  s.express = express_;
  s.writes_in_flight = stat_writes_in_flight_.load(std::memory_order_relaxed);
  s.bytes_in_flight = stat_bytes_in_flight_.load(std::memory_order_relaxed);
  s.writes_posted = stat_writes_posted_.load(std::memory_order_relaxed);
  s.bytes_posted = stat_bytes_posted_.load(std::memory_order_relaxed);
  return {s};
}

void fabric_engine::block(clock_type::duration idle_for, clock_type::duration& sleep_step) {
  sleeping_.store(true);
  // Re-check after announcing sleep: a submitter that missed sleeping_ set its flag first.
  const bool credit_pending = credit_returned_.load() && !imm_batch_.empty();
  if (queue_nonempty_.load() || stop_requested_.load() || credit_pending) {
    sleeping_.store(false);
    return;
  }

  pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {cq_wait_fd_, POLLIN, 0}};
  nfds_t nfds = 1;
  std::chrono::nanoseconds timeout{};
  if (wait_kind_ == wait_kind::fd && cq_) {
    // fi_trywait drives pending progress and says whether the fd is armed; if events are
    // already queued it returns -FI_EAGAIN and we must read the CQ instead of blocking.
    fid* f = &cq_->fid;
    int rc = fi_trywait(fabric_.get(), &f, 1);
    if (rc == -FI_EAGAIN) {
      sleeping_.store(false);
      return;
    }
    if (rc == 0) {
      nfds = 2;
      const bool busy = inflight_ > 0 || !pending_.empty();
      timeout =
          busy ? clock_type::duration(fd_wait_cap_busy) : clock_type::duration(fd_wait_cap_idle);
    } else {
      log_->debug("{}; sleeping instead", fi_error_text("fi_trywait", rc));
      timeout = sleep_cap_recent;
    }
  } else {
    const bool expecting =
        clock_type::now().time_since_epoch() <
        std::chrono::nanoseconds(expect_until_ns_.load(std::memory_order_relaxed));
    const clock_type::duration cap =
        idle_for < recent_window || expecting ? clock_type::duration(sleep_cap_recent)
        : idle_for < warm_window              ? clock_type::duration(sleep_cap_warm)
                                              : clock_type::duration(sleep_cap_cold);
    timeout = std::min(sleep_step, cap);
    sleep_step = std::min<clock_type::duration>(sleep_step * 2, cap);
  }

  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  int rc = ::ppoll(fds, nfds, &ts, nullptr);
  sleeping_.store(false);
  if (rc < 0 && errno != EINTR) log_->error("ppoll: {}", std::strerror(errno));
  if (fds[0].revents & POLLIN) {
    uint64_t value = 0;
    [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &value, sizeof value);
  }
}

void fabric_engine::drain_and_fail_all() {
  // Refuse new work; what is already queued is handled below.
  std::deque<work_item> items;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    state_ = run_state::draining;
    items.swap(queue_);
    queue_nonempty_.store(false);
  }
  for (auto& item : items) {
    if (item.batch) {
      admit(std::move(item.batch));
    } else if (item.task) {
      item.task();  // insert/remove/register still work while the fabric is open
    }
  }
  if (cfg_.on_drain_start) cfg_.on_drain_start();
  std::vector<batch_state*> to_finish = pending_.take_all();
  for (batch_state* b : to_finish) {
    b->abort_unposted(stopped_error);
    b->in_pending = false;
  }
  for (batch_state* b : to_finish) maybe_finish(b);

  // Posted writes reference memory the caller may free once done() ran: wait (bounded) for the
  // provider to finish with them, progressing the CQ.
  const auto deadline = clock_type::now() + stop_drain_limit;
  while (inflight_ > 0 && clock_type::now() < deadline) {
    run_late_tasks();
    if (read_completions() == 0) {
      timespec ts{0, 100000};  // 100 µs: no busy spin on a 2-core machine
      ::nanosleep(&ts, nullptr);
    }
  }
  if (inflight_ > 0) {
    log_->warn("stop: {} writes still posted after {} s; failing their batches", inflight_,
               std::chrono::duration_cast<std::chrono::seconds>(stop_drain_limit).count());
  }
  // Whatever is left never completed in time. Their contexts stay reserved (the provider may
  // still hold them until the endpoint is closed); the engine is not restartable.
  while (!live_.empty()) {
    std::unique_ptr<batch_state> owned = std::move(live_.front());
    live_.pop_front();
    owned->fail(owned->outstanding, stopped_error);
    owned->abort_unposted(stopped_error);
    owned->outstanding = 0;
    invoke_callback(*log_, "batch_done", owned->batch.done, std::move(owned->result));
  }
  // Calls queued while draining run here, on this thread, before callers run them directly.
  std::deque<work_item> late;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    state_ = run_state::stopped;
    late.swap(queue_);
    queue_nonempty_.store(false);
  }
  run_items(late);
}

void fabric_engine::run_late_tasks() {
  std::deque<work_item> late;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    late.swap(queue_);
    queue_nonempty_.store(false);
  }
  run_items(late);
}

void fabric_engine::run_items(std::deque<work_item>& items) {
  for (auto& item : items) {
    if (item.task) {
      item.task();
    } else if (item.batch) {  // submit() queues none once draining; for completeness
      item.batch->abort_unposted(stopped_error);
      invoke_callback(*log_, "batch_done", item.batch->batch.done, std::move(item.batch->result));
    }
  }
}

}  // namespace ferry::transport::detail
