// Several rails as one engine: the design is at the top of rail_engine.hpp.
#include "transport/rail_engine.hpp"

#include <rdma/fi_domain.h>

#include <atomic>

#include "core/rails.hpp"

namespace ferry::transport::detail {
namespace {

/// Draws per key before giving up (a random 64-bit key practically never collides).
constexpr int key_attempts = 64;

/// Runs `done` once, when the last of `left` parts has called it.
struct countdown {
  countdown(size_t n, std::function<void()> f) : left(n), done(std::move(f)) {}
  std::atomic<size_t> left;
  std::function<void()> done;
  void arrive() {
    if (left.fetch_sub(1) == 1) invoke_callback(*transport_log(), "fence_peer", done);
  }
};

/// A batch's parts' results, joined into its one `done`.
struct batch_join {
  batch_join(size_t n, std::function<void(batch_result)> f) : left(n), done(std::move(f)) {}
  std::mutex m;
  size_t left;
  batch_result result;
  std::function<void(batch_result)> done;
  void arrive(batch_result r) {
    std::unique_lock<std::mutex> lock(m);
    result.completed += r.completed;
    result.failed += r.failed;
    result.skipped += r.skipped;
    if (!r.ok() && result.ok()) {
      result.code = r.code;
      result.message = std::move(r.message);
    }
    if (--left != 0) return;
    batch_result out = std::move(result);
    auto f = std::move(done);
    lock.unlock();
    invoke_callback(*transport_log(), "batch_done", f, std::move(out));
  }
};

}  // namespace

result<> rail_engine::init(const engine_config& cfg) {
  bulk_ = cfg.rails;
  express_bytes_ = cfg.express_bytes;
  const uint32_t total = bulk_ + (express_bytes_ != 0 ? 1 : 0);
  for (uint32_t i = 0; i < total; ++i) {
    const bool express = i >= bulk_;
    const std::string label = express ? "express" : std::to_string(i);
    auto rail = std::make_unique<fabric_engine>();
    if (auto opened = rail->init(cfg, label, express); !opened)
      return error{opened.code, "rail " + label + ": " + opened.message};
    if (rail->provider_keys())
      return error{errc::fabric_unavailable,
                   "fabric provider '" + rail->provider_name() +
                       "' issues its own memory keys (FI_MR_PROV_KEY), and several rails "
                       "(fabric.rails, fabric.express_bytes) need one key on every rail: set "
                       "fabric.rails 1 and fabric.express_bytes 0"};
    key_mask_ &= rail->key_mask();
    rails_.push_back(std::move(rail));
  }
  if (express_bytes_ != 0) express_ = bulk_;
  transport_log()->info(
      "rails: {} bulk{}, each with its own domain, CQ and progress thread", bulk_,
      express_ ? " + express (batches of at most " + std::to_string(express_bytes_) + " bytes)"
               : std::string());
  return {};
}

result<std::vector<uint64_t>> rail_engine::choose_keys(size_t n) {
  result<std::vector<uint64_t>> out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t k = 0; k < n; ++k) {
    bool found = false;
    for (int i = 0; i < key_attempts && !found; ++i) {
      const uint64_t key = random_u64() & key_mask_;
      // 0 is what an unset key looks like; FI_KEY_NOTAVAIL is reserved.
      if (key == 0 || key == FI_KEY_NOTAVAIL || !issued_keys_.insert(key).second) continue;
      out.value.push_back(key);
      found = true;
    }
    if (!found)
      return error{errc::fabric_error,
                   "register_region: no unused memory key after " + std::to_string(key_attempts) +
                       " random draws (key space of " + std::to_string(key_mask_) + ", " +
                       std::to_string(issued_keys_.size()) + " keys issued)"};
  }
  return out;
}

result<region_id> rail_engine::register_region(void* base, uint64_t length, region_access access) {
  auto keys = choose_keys(1);
  if (!keys) return std::move(keys).error();
  std::vector<region_id> ids;
  for (size_t i = 0; i < rails_.size(); ++i) {
    auto r = rails_[i]->register_region_keyed(base, length, access, keys.value[0]);
    if (!r) {
      for (size_t j = 0; j < ids.size(); ++j) (void)rails_[j]->deregister_region(ids[j]);
      return std::move(r).error();
    }
    ids.push_back(r.value);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  regions_.push_back(std::move(ids));
  return static_cast<region_id>(regions_.size() - 1);
}

result<bool> rail_engine::deregister_region(region_id id) {
  std::vector<region_id> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (id < regions_.size()) ids = regions_[id];
  }
  if (ids.empty())
    return error{errc::invalid_request,
                 "deregister_region: unknown region " + std::to_string(id) + " (never registered)"};
  result<bool> out;
  for (size_t i = 0; i < rails_.size(); ++i) {
    auto r = rails_[i]->deregister_region(ids[i]);
    if (i == 0 || (!r && out)) out = std::move(r);
  }
  return out;
}

void rail_engine::register_regions(std::vector<region_request> regions,
                                   std::function<void(result<std::vector<region_id>>)> done) {
  auto keys = choose_keys(regions.size());
  if (!keys) {
    invoke_callback(*transport_log(), "register_regions", done,
                    result<std::vector<region_id>>(std::move(keys).error()));
    return;
  }
  struct join {
    std::mutex m;
    size_t left;
    std::vector<result<std::vector<region_id>>> got;
    std::function<void(result<std::vector<region_id>>)> done;
  };
  auto j = std::make_shared<join>();
  j->left = rails_.size();
  j->got.resize(rails_.size());
  j->done = std::move(done);
  for (size_t i = 0; i < rails_.size(); ++i) {
    rails_[i]->register_regions_keyed(
        regions, keys.value, [this, j, i](result<std::vector<region_id>> r) {
          {
            std::lock_guard<std::mutex> lock(j->m);
            j->got[i] = std::move(r);
            if (--j->left != 0) return;
          }
          // The last rail answered (on its progress thread): all made, or none kept.
          result<std::vector<region_id>> out;
          for (const auto& g : j->got)
            if (!g) {
              out = error{g.code, g.message};
              break;
            }
          if (out) {
            std::lock_guard<std::mutex> lock(mutex_);
            for (size_t k = 0; k < j->got[0].value.size(); ++k) {
              std::vector<region_id> ids;
              for (const auto& g : j->got) ids.push_back(g.value[k]);
              regions_.push_back(std::move(ids));
              out.value.push_back(static_cast<region_id>(regions_.size() - 1));
            }
          } else {
            for (size_t r = 0; r < j->got.size(); ++r)
              if (j->got[r] && !j->got[r].value.empty())
                rails_[r]->fence_peer(std::nullopt, j->got[r].value, nullptr);
          }
          invoke_callback(*transport_log(), "register_regions", j->done, std::move(out));
        });
  }
}

std::vector<region_id> rail_engine::ids_on(uint32_t rail, const std::vector<region_id>& ids) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<region_id> out;
  for (auto id : ids)
    if (id < regions_.size())
      out.push_back(regions_[id][rail]);
    else
      transport_log()->warn("rails: region {} was never registered; not closed", id);
  return out;
}

region_desc rail_engine::describe(region_id id) const {
  region_id on_rail0 = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (id >= regions_.size()) return {};
    on_rail0 = regions_[id][0];
  }
  // The same key and base on every rail (one key chosen for all; the memory is the same).
  return rails_[0]->describe(on_rail0);
}

std::vector<rail_desc> rail_engine::rails() const {
  std::vector<rail_desc> out;
  for (size_t i = 0; i < rails_.size(); ++i)
    out.push_back({rails_[i]->local_address(), express_ && *express_ == i});
  return out;
}

std::vector<rail_stats> rail_engine::rail_activity() const {
  std::vector<rail_stats> out;
  for (const auto& r : rails_)
    for (auto& s : r->rail_activity()) out.push_back(std::move(s));
  return out;
}

void rail_engine::start(std::function<void(immediate_counts)> immediates) {
  const bool consume = static_cast<bool>(immediates);
  {
    std::lock_guard<std::mutex> lock(imm_mutex_);
    consumer_ = std::move(immediates);
  }
  for (uint32_t i = 0; i < rails_.size(); ++i) {
    if (!consume) {
      rails_[i]->start(nullptr);  // a pure initiator: each rail drops what arrives
      continue;
    }
    rails_[i]->start([this, i](immediate_counts c) { on_immediates(i, std::move(c)); });
  }
}

void rail_engine::stop() {
  for (auto& r : rails_) r->stop();
  std::lock_guard<std::mutex> lock(imm_mutex_);
  pending_.clear();
  pending_index_.clear();
  held_.clear();
}

void rail_engine::on_immediates(uint32_t rail, immediate_counts counts) {
  {
    std::lock_guard<std::mutex> lock(imm_mutex_);
    for (auto& [imm, n] : counts) {
      auto [it, fresh] = pending_index_.try_emplace(imm, pending_.size());
      if (fresh)
        pending_.emplace_back(imm, n);
      else
        pending_[it->second].second += n;
    }
    held_.push_back(rail);
    if (consumer_busy_) return;  // merged; goes out when the consumer returns the credit
    consumer_busy_ = true;
  }
  deliver_pending();
}

void rail_engine::return_immediate_credit() {
  uint32_t rail = 0;
  {
    std::lock_guard<std::mutex> lock(imm_mutex_);
    if (pending_.empty()) {
      consumer_busy_ = false;
      return;
    }
    rail = held_.front();  // pending_ holds a batch of this rail: it is awake and not waiting
  }
  // The credit stays taken: what arrived meanwhile goes out on that rail's progress thread,
  // never on this one (a consumer may return the credit while holding a lock its callback
  // takes).
  rails_[rail]->post([this] { deliver_pending(); });
}

void rail_engine::deliver_pending() {
  immediate_counts out;
  std::vector<uint32_t> rails;
  {
    std::lock_guard<std::mutex> lock(imm_mutex_);
    if (pending_.empty()) {
      consumer_busy_ = false;
      return;
    }
    out.swap(pending_);
    pending_index_.clear();
    rails.swap(held_);
  }
  invoke_callback(*transport_log(), "immediates", consumer_, std::move(out));
  for (auto r : rails) rails_[r]->return_immediate_credit();
}

result<peer_handle> rail_engine::insert_peer(const std::vector<uint8_t>& address) {
  auto r = rails_[0]->insert_peer(address);
  if (r) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++entry(r.value).users;
  }
  return r;
}

void rail_engine::insert_peer_async(std::vector<uint8_t> address,
                                    std::function<void(result<peer_handle>)> done) {
  rails_[0]->insert_peer_async(
      std::move(address), [this, done = std::move(done)](result<peer_handle> r) mutable {
        if (r) {
          std::lock_guard<std::mutex> lock(mutex_);
          ++entry(r.value).users;
        }
        invoke_callback(*transport_log(), "insert_peer", done, std::move(r));
      });
}

void rail_engine::add_peer_rails(peer_handle peer, std::vector<peer_rail> rails,
                                 std::function<void(result<uint32_t>)> done) {
  for (const auto& r : rails)
    if (r.rail == 0 || r.rail >= rails_.size()) {
      invoke_callback(
          *transport_log(), "add_peer_rails", done,
          result<uint32_t>(error{errc::invalid_request,
                                 "add_peer_rails: no rail " + std::to_string(r.rail) +
                                     " to add (rails 1 to " + std::to_string(rails_.size() - 1) +
                                     " take a peer's endpoints)"}));
      return;
    }
  if (rails.empty()) {
    invoke_callback(*transport_log(), "add_peer_rails", done, result<uint32_t>{});
    return;
  }
  struct join {
    std::mutex m;
    size_t left;
    result<uint32_t> out;
    std::function<void(result<uint32_t>)> done;
  };
  auto j = std::make_shared<join>();
  j->left = rails.size();
  j->done = std::move(done);
  for (auto& r : rails) {
    const uint32_t rail = r.rail;
    rails_[rail]->insert_peer_async(
        std::move(r.address), [this, j, peer, rail](result<peer_handle> h) {
          if (h) {
            std::lock_guard<std::mutex> lock(mutex_);
            auto& p = entry(peer);
            if (p.handle[rail] && *p.handle[rail] != h.value)
              transport_log()->warn(
                  "rails: peer={} is known on rail {} under two addresses; the older one stays "
                  "in that rail's address vector",
                  peer, rail);
            p.handle[rail] = h.value;
            ++p.refs[rail];
          }
          std::unique_lock<std::mutex> lock(j->m);
          if (!h && j->out)
            j->out = error{h.code, "rail " + std::to_string(rail) + ": " + h.message};
          if (h && j->out) ++j->out.value;
          if (--j->left != 0) return;
          auto out = std::move(j->out);
          auto f = std::move(j->done);
          lock.unlock();
          invoke_callback(*transport_log(), "add_peer_rails", f, std::move(out));
        });
  }
}

std::vector<uint32_t> rail_engine::peer_rails(peer_handle peer) const {
  std::vector<uint32_t> out{0};
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = peers_.find(peer); it != peers_.end())
    for (uint32_t i = 1; i < it->second.handle.size(); ++i)
      if (it->second.usable(i)) out.push_back(i);
  return out;
}

rail_engine::peer_state& rail_engine::entry(peer_handle peer) {
  auto& p = peers_[peer];
  p.handle.resize(rails_.size());
  p.refs.resize(rails_.size());
  p.leaving.resize(rails_.size());
  return p;
}

void rail_engine::leave(peer_handle peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;  // never inserted here: the rails have nothing to remove
  auto& p = it->second;
  if (p.users > 0) --p.users;
  for (uint32_t i = 1; i < rails_.size(); ++i) ++p.leaving[i];
}

std::optional<peer_handle> rail_engine::take_rail(peer_handle peer, uint32_t rail) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return std::nullopt;
  auto& p = it->second;
  if (p.leaving[rail] > 0) --p.leaving[rail];
  std::optional<peer_handle> out;
  if (p.refs[rail] > 0) {
    out = p.handle[rail];
    if (--p.refs[rail] == 0) p.handle[rail].reset();
  }
  forget_if_unused(peer);
  return out;
}

void rail_engine::forget_if_unused(peer_handle peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.users != 0) return;
  for (size_t i = 0; i < rails_.size(); ++i)
    if (it->second.refs[i] != 0 || it->second.leaving[i] != 0) return;
  peers_.erase(it);
}

void rail_engine::remove_peer(peer_handle peer) {
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    known = peers_.count(peer) != 0;
    leave(peer);
  }
  rails_[0]->remove_peer(peer);
  if (!known) return;
  for (uint32_t i = 1; i < rails_.size(); ++i)
    rails_[i]->remove_peer_resolved([this, peer, i] { return take_rail(peer, i); });
}

void rail_engine::fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                             std::function<void()> done) {
  bool known = false;
  if (peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    known = peers_.count(*peer) != 0;
    leave(*peer);
  }
  // Every rail closes its registrations and cuts the peer in one step of its own thread; the
  // fence is done when the last rail's step is.
  auto all = std::make_shared<countdown>(rails_.size(), std::move(done));
  std::vector<std::vector<region_id>> ids;
  for (uint32_t i = 0; i < rails_.size(); ++i) ids.push_back(ids_on(i, regions));
  rails_[0]->fence_peer(peer, std::move(ids[0]), [all] { all->arrive(); });
  for (uint32_t i = 1; i < rails_.size(); ++i) {
    std::function<std::optional<peer_handle>()> resolve;
    if (known)
      resolve = [this, p = *peer, i] { return take_rail(p, i); };
    else
      resolve = [] { return std::optional<peer_handle>(); };
    rails_[i]->fence_peer_resolved(std::move(resolve), std::move(ids[i]), [all] { all->arrive(); });
  }
}

std::vector<rail_engine::part> rail_engine::plan(const write_batch& b) const {
  const auto it = peers_.find(b.peer);
  const peer_state* p = it == peers_.end() ? nullptr : &it->second;
  std::vector<part> out;
  auto whole = [&](uint32_t rail, peer_handle h) {
    part one{rail, h, {}};
    for (size_t i = 0; i < b.ops.size(); ++i) one.ops.push_back(i);
    out.push_back(std::move(one));
    return out;
  };
  if (p == nullptr || b.ops.empty()) return whole(0, b.peer);
  uint64_t bytes = 0;
  std::vector<uint64_t> lengths;
  lengths.reserve(b.ops.size());
  for (const auto& op : b.ops) {
    bytes += op.length;
    lengths.push_back(op.length);
  }
  if (express_ && bytes <= express_bytes_ && p->usable(*express_))
    return whole(*express_, *p->handle[*express_]);
  std::vector<std::pair<uint32_t, peer_handle>> lanes{{0, b.peer}};
  for (uint32_t i = 1; i < bulk_; ++i)
    if (p->usable(i)) lanes.emplace_back(i, *p->handle[i]);
  if (lanes.size() == 1) return whole(0, b.peer);
  const auto lane = rails::stripe(lengths, static_cast<uint32_t>(lanes.size()));
  std::vector<part> parts(lanes.size());
  for (size_t l = 0; l < lanes.size(); ++l) parts[l] = part{lanes[l].first, lanes[l].second, {}};
  for (size_t i = 0; i < lane.size(); ++i) parts[lane[i]].ops.push_back(i);
  for (auto& q : parts)
    if (!q.ops.empty()) out.push_back(std::move(q));
  return out;
}

write_batch rail_engine::part_batch(const write_batch& b, const part& p) const {
  write_batch out;
  out.peer = p.peer;
  out.mode = b.mode;
  out.cancel = b.cancel;
  out.ops.reserve(p.ops.size());
  for (size_t i : p.ops) {
    write_op op = b.ops[i];
    // A region this engine never issued keeps its id: the rail refuses it by that id.
    if (op.local_region < regions_.size()) op.local_region = regions_[op.local_region][p.rail];
    out.ops.push_back(op);
  }
  return out;
}

uint32_t rail_engine::notifications(const write_batch& b) const {
  std::vector<part> parts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    parts = plan(b);
  }
  uint32_t n = 0;
  for (const auto& p : parts) {
    write_batch shape;  // what a rail counts: the mode and the number of writes
    shape.mode = b.mode;
    shape.ops.resize(p.ops.size());
    n += rails_[p.rail]->notifications(shape);
  }
  return n;
}

uint32_t rail_engine::submit(write_batch b) {
  std::vector<part> parts;
  std::vector<write_batch> batches;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    parts = plan(b);
    for (const auto& p : parts) batches.push_back(part_batch(b, p));
  }
  if (batches.size() == 1) {
    batches[0].done = std::move(b.done);
    return rails_[parts[0].rail]->submit(std::move(batches[0]));
  }
  auto j = std::make_shared<batch_join>(batches.size(), std::move(b.done));
  uint32_t n = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    batches[i].done = [j](batch_result r) { j->arrive(std::move(r)); };
    n += rails_[parts[i].rail]->submit(std::move(batches[i]));
  }
  return n;
}

void rail_engine::cancel_writes(std::shared_ptr<write_cancel> cancel) {
  for (auto& rail : rails_) rail->cancel_writes(cancel);
}

}  // namespace ferry::transport::detail
