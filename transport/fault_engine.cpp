// The fault-injecting engine wrapper (transport/fault_engine.hpp): forwarding, counting, and the
// faults a test arms.
#include "transport/fault_engine.hpp"

#include <algorithm>
#include <type_traits>

namespace ferry::transport {
namespace {

/// The one place the wrapper makes an error: the fault's code, or what the real engine gives
/// such a failure (`fallback`), and its message marked as injected.
error injected_error(const fault& f, errc fallback, const char* call) {
  return {f.code != errc::ok ? f.code : fallback,
          "injected: " + (f.message.empty() ? std::string(call) + " failed" : f.message)};
}

}  // namespace

fault_engine::fault_engine(std::unique_ptr<engine> inner) : inner_(std::move(inner)) {}

fault_engine::~fault_engine() {
  stop();
  if (delivery_.joinable()) delivery_.join();
}

void fault_engine::arm(fault f) {
  std::lock_guard lock(mutex_);
  armed_.push_back(std::move(f));
}

void fault_engine::disarm() {
  std::lock_guard lock(mutex_);
  armed_.clear();
}

std::optional<fault> fault_engine::take(fault::kind what,
                                        const std::function<bool(const fault&)>& matches) {
  for (auto it = armed_.begin(); it != armed_.end(); ++it) {
    if (it->what != what || !matches(*it)) continue;
    fault copy = *it;
    if (it->times != fault::always && --it->times == 0) armed_.erase(it);
    return copy;
  }
  return std::nullopt;
}

result<> fault_engine::call_fault(fault::kind what, const char* call) {
  std::lock_guard lock(mutex_);
  auto f = take(what, [](const fault&) { return true; });
  if (!f) return {};
  ++stats_.failed_calls;
  changed();
  return injected_error(*f, errc::fabric_error, call);
}

fault_stats fault_engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

bool fault_engine::wait_for(const std::function<bool(const fault_stats&)>& pred,
                            std::chrono::milliseconds limit) const {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, limit, [&] { return pred(stats_); });
}

// ----- registrations ----------------------------------------------------------------------

result<region_id> fault_engine::register_region(void* base, uint64_t length, region_access access) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.register_region;
  }
  if (auto e = call_fault(fault::kind::fail_register, "register_region"); !e)
    return std::move(e).error();
  return inner_->register_region(base, length, access);
}

result<bool> fault_engine::deregister_region(region_id id) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.deregister_region;
  }
  return inner_->deregister_region(id);
}

void fault_engine::register_regions(std::vector<region_request> regions,
                                    std::function<void(result<std::vector<region_id>>)> done) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.register_regions;
  }
  if (auto e = call_fault(fault::kind::fail_register, "register_regions"); !e) {
    if (done) done(std::move(e).error());
    return;
  }
  inner_->register_regions(std::move(regions), std::move(done));
}

region_desc fault_engine::describe(region_id id) const {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.describe;
  }
  return inner_->describe(id);
}

std::vector<uint8_t> fault_engine::local_address() const {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.local_address;
  }
  return inner_->local_address();
}

std::string fault_engine::provider_name() const {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.provider_name;
  }
  return inner_->provider_name();
}

std::vector<rail_desc> fault_engine::rails() const { return inner_->rails(); }

std::vector<rail_stats> fault_engine::rail_activity() const { return inner_->rail_activity(); }

// ----- peers ---------------------------------------------------------------------------------

result<peer_handle> fault_engine::insert_peer(const std::vector<uint8_t>& address) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.insert_peer;
  }
  if (auto e = call_fault(fault::kind::fail_insert, "insert_peer"); !e) return std::move(e).error();
  return inner_->insert_peer(address);
}

void fault_engine::insert_peer_async(std::vector<uint8_t> address,
                                     std::function<void(result<peer_handle>)> done) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.insert_peer_async;
  }
  if (auto e = call_fault(fault::kind::fail_insert, "insert_peer_async"); !e) {
    if (done) done(std::move(e).error());
    return;
  }
  inner_->insert_peer_async(std::move(address), std::move(done));
}

void fault_engine::add_peer_rails(peer_handle peer, std::vector<peer_rail> rails,
                                  std::function<void(result<uint32_t>)> done) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.add_peer_rails;
  }
  inner_->add_peer_rails(peer, std::move(rails), std::move(done));
}

std::vector<uint32_t> fault_engine::peer_rails(peer_handle peer) const {
  return inner_->peer_rails(peer);
}

void fault_engine::remove_peer(peer_handle peer) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.remove_peer;
    // After stop nothing is held: the call is forwarded (and runs at once).
    if (!stopping_ && take(fault::kind::hold_removals,
                           [&](const fault& f) { return !f.peer || *f.peer == peer; })) {
      held_removals_.push_back(peer);
      ++stats_.removals_held;
      changed();
      return;
    }
  }
  inner_->remove_peer(peer);
}

void fault_engine::fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                              std::function<void()> done) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.fence_peer;
    if (!stopping_ && take(fault::kind::hold_fences,
                           [&](const fault& f) { return !f.peer || (peer && *f.peer == *peer); })) {
      held_fences_.push_back({peer, std::move(regions), std::move(done)});
      ++stats_.fences_held;
      changed();
      return;
    }
  }
  inner_->fence_peer(peer, std::move(regions), std::move(done));
}

size_t fault_engine::release_fences() {
  std::deque<held_fence> go;
  {
    std::lock_guard lock(mutex_);
    go.swap(held_fences_);
    stats_.fences_held = 0;
    changed();
  }
  for (auto& h : go) inner_->fence_peer(h.peer, std::move(h.regions), std::move(h.done));
  return go.size();
}

size_t fault_engine::release_removals() {
  std::deque<peer_handle> go;
  {
    std::lock_guard lock(mutex_);
    go.swap(held_removals_);
    stats_.removals_held = 0;
    changed();
  }
  for (auto peer : go) inner_->remove_peer(peer);
  return go.size();
}

// ----- writes --------------------------------------------------------------------------------

uint32_t fault_engine::submit(write_batch batch) {
  // What the real engine answers: the notifications of the whole batch, as submitted.
  const uint32_t notes = inner_->notifications(batch);
  std::optional<fault> f;
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.submit;
    const auto n = batch.ops.size();
    f = take(fault::kind::fail_writes, [&](const fault& x) {
      return (!x.peer || *x.peer == batch.peer) && (x.write ? *x.write < n : n > 0);
    });
    if (f) {
      ++stats_.failed_batches;
      stats_.failed_writes += f->write && batch.mode != notify::batch_end ? 1 : n;
      changed();
    }
    if (auto c = take(fault::kind::corrupt_writes, [&](const fault& x) {
          return (!x.peer || *x.peer == batch.peer) && (x.write ? *x.write < n : n > 0);
        })) {
      for (size_t i = 0; i < n; ++i) {
        if (c->write && *c->write != i) continue;
        auto& op = batch.ops[i];
        op.local_offset = op.local_offset > 0 ? op.local_offset - 1 : 1;
        ++stats_.corrupted_writes;
      }
      changed();
    }
  }
  uint32_t injected = 0;
  error why;
  if (f) {
    // The failed writes are never posted; the rest of the batch goes on as usual, and the
    // batch completes once they have (an empty batch completes at once, on the progress thread).
    const bool whole = !f->write || batch.mode == notify::batch_end;
    injected = whole ? static_cast<uint32_t>(batch.ops.size()) : 1;
    if (whole)
      batch.ops.clear();
    else
      batch.ops.erase(batch.ops.begin() + *f->write);
    why = injected_error(*f, errc::fabric_write_failed, "write");
  }
  batch.done = [this, done = std::move(batch.done), injected,
                why = std::move(why)](batch_result r) mutable {
    {
      std::lock_guard lock(mutex_);
      stats_.writes_completed += r.completed;
      changed();
    }
    if (injected > 0) {
      batch_result out;
      out.code = why.code;
      out.message = why.message;
      out.completed = r.completed;
      out.failed = r.failed + injected;
      r = std::move(out);
    }
    if (done) done(std::move(r));
  };
  inner_->submit(std::move(batch));
  return notes;
}

// ----- immediates ----------------------------------------------------------------------------

void fault_engine::start(std::function<void(immediate_counts)> immediates) {
  bool wrap = false;
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.start;
    if (immediates && !stopping_ && !delivery_.joinable()) {
      consumer_ = std::move(immediates);
      delivery_ = std::thread([this] { delivery_loop(); });
      wrap = true;
    }
  }
  // A pure initiator (no consumer) keeps the engine's own handling of immediates; a second
  // start is the wrapped engine's to refuse.
  if (wrap)
    inner_->start([this](immediate_counts c) { on_immediates(std::move(c)); });
  else
    inner_->start(nullptr);
}

void fault_engine::on_immediates(immediate_counts counts) {
  {
    std::lock_guard lock(mutex_);
    for (const auto& [imm, n] : counts) {
      stats_.immediates_arrived += n;
      uint64_t left = n;
      // Each immediate (one per write) uses one of a fault's `times`, in the order armed.
      for (auto it = armed_.begin(); left > 0 && it != armed_.end();) {
        const bool hold = it->what == fault::kind::hold_immediates;
        if ((!hold && it->what != fault::kind::drop_immediates) || (it->imm && *it->imm != imm)) {
          ++it;
          continue;
        }
        const uint64_t taken =
            it->times == fault::always ? left : std::min<uint64_t>(left, it->times);
        if (hold) held_imms_[imm] += taken;
        (hold ? stats_.immediates_held : stats_.immediates_dropped) += taken;
        left -= taken;
        if (it->times != fault::always && (it->times -= static_cast<uint32_t>(taken)) == 0)
          it = armed_.erase(it);
      }
      if (left > 0) pending_imms_[imm] += left;
    }
    changed();
  }
  // The wrapper aggregates for its consumer (credit 1 towards it), so the wrapped engine gets
  // its credit back at once and may report more meanwhile.
  inner_->return_immediate_credit();
}

void fault_engine::return_immediate_credit() {
  std::lock_guard lock(mutex_);
  ++stats_.calls.return_immediate_credit;
  consumer_busy_ = false;
  changed();
}

uint64_t fault_engine::release_immediates() {
  std::lock_guard lock(mutex_);
  uint64_t n = 0;
  for (auto [imm, count] : held_imms_) {
    pending_imms_[imm] += count;
    n += count;
  }
  held_imms_.clear();
  stats_.immediates_held = 0;
  changed();
  return n;
}

void fault_engine::delivery_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (!consumer_busy_ && !pending_imms_.empty()); });
    if (stopping_) return;
    immediate_counts batch;
    for (auto [imm, n] : pending_imms_) {
      // A count above 2^32 - 1 writes goes in parts (never in practice).
      for (uint64_t left = n; left > 0;) {
        const auto part = static_cast<uint32_t>(std::min<uint64_t>(left, UINT32_MAX));
        batch.emplace_back(imm, part);
        left -= part;
      }
      stats_.immediates_delivered += n;
    }
    pending_imms_.clear();
    consumer_busy_ = true;
    changed();
    lock.unlock();
    consumer_(std::move(batch));
    lock.lock();
  }
}

void fault_engine::stop() {
  {
    std::lock_guard lock(mutex_);
    ++stats_.calls.stop;
  }
  inner_->stop();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    held_imms_.clear();
    pending_imms_.clear();
    stats_.immediates_held = 0;
    changed();
  }
  // From a consumer's callback (on the delivery thread) it cannot join itself: the destructor
  // does, after the callback has returned.
  if (delivery_.joinable() && std::this_thread::get_id() != delivery_.get_id()) delivery_.join();
  // Whatever is held completes now, exactly once (the stopped engine runs it on this thread).
  release_fences();
  release_removals();
}

}  // namespace ferry::transport
