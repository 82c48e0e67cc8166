#pragma once
// Several rails as one transport::engine (engine.hpp): `fabric.rails` bulk endpoints and,
// with `fabric.express_bytes`, an express endpoint for small batches. Private to transport/;
// engine::open makes one when more than one endpoint is configured.
//
// Design: each rail is a whole fabric_engine (its own fabric, domain, AV, CQ, endpoint and
// progress thread), so each rail's libfabric objects are still used by one thread only
// (FI_THREAD_DOMAIN, read back from fi_info as before) and a rail's fence, removal and shm
// endpoint renewal are the single engine's, unchanged. This class owns no thread; it maps and
// joins:
// - regions: one registration per rail under ONE key this class chooses (random, never
//   reused, the same rules as a single engine's), so a peer's writes need no per-rail keys;
//   region ids are this class's, mapped to each rail's.
// - peers: a peer handle is rail 0's (what `insert_peer` answers); `add_peer_rails` inserts the
//   peer's other endpoints on ours. Removal and the fence run on every rail; on a rail other
//   than 0 the peer is named when that rail's progress thread runs the call
//   (`*_resolved`), so an insertion queued before it has answered by then.
// - batches: split at submit into per-rail parts (core/rails.hpp's `stripe`; a small batch goes
//   whole on the express rail), each a batch of its rail with its own notifications; the parts'
//   results are joined into the one `done`.
// - immediates: each rail hands its batch here; they are merged and delivered under one credit
//   (a rail's own credit is returned once its batch has gone to the consumer; what arrived
//   while the consumer held the credit goes out on the progress thread of a rail that had a
//   part of it, never on the thread returning the credit).
//
// Locking: `mutex_` guards the maps and `imm_mutex_` the immediates; neither is held while a
// rail is called, since a rail may run a callback (that takes them) on the calling thread.

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transport/fabric_engine.hpp"

namespace ferry::transport::detail {

class rail_engine final : public engine {
 public:
  rail_engine() = default;
  ~rail_engine() override { stop(); }

  /// Open `cfg.rails` bulk rails and, with `cfg.express_bytes`, the express rail.
  result<> init(const engine_config& cfg);

  result<region_id> register_region(void* base, uint64_t length, region_access access) override;
  result<bool> deregister_region(region_id id) override;
  void register_regions(std::vector<region_request> regions,
                        std::function<void(result<std::vector<region_id>>)> done) override;
  region_desc describe(region_id id) const override;
  std::vector<uint8_t> local_address() const override { return rails_[0]->local_address(); }
  std::string provider_name() const override { return rails_[0]->provider_name(); }
  std::vector<rail_desc> rails() const override;
  std::vector<rail_stats> rail_activity() const override;

  void start(std::function<void(immediate_counts)> immediates) override;
  void stop() override;

  result<peer_handle> insert_peer(const std::vector<uint8_t>& address) override;
  void insert_peer_async(std::vector<uint8_t> address,
                         std::function<void(result<peer_handle>)> done) override;
  void add_peer_rails(peer_handle peer, std::vector<peer_rail> rails,
                      std::function<void(result<uint32_t>)> done) override;
  std::vector<uint32_t> peer_rails(peer_handle peer) const override;
  void remove_peer(peer_handle peer) override;
  void fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                  std::function<void()> done) override;

  uint32_t notifications(const write_batch& batch) const override;
  uint32_t submit(write_batch batch) override;
  void cancel_writes(std::shared_ptr<write_cancel> cancel) override;
  void return_immediate_credit() override;
  /// Every rail: a peer's writes may come on any of them.
  void expect_writes(std::chrono::milliseconds window) override {
    for (auto& r : rails_) r->expect_writes(window);
  }

 private:
  /// A peer as the rails know it. Rail 0's insertions are counted by rail 0 itself; `users`
  /// only says when the entry may go.
  struct peer_state {
    uint32_t users = 0;                              ///< insert_peer not yet removed
    std::vector<std::optional<peer_handle>> handle;  ///< on each rail ([0] unused)
    std::vector<uint32_t> refs;                      ///< add_peer_rails not yet removed, by rail
    /// Removals (or fences) asked and not yet run on each rail: a rail whose every user is
    /// being removed carries no new batch, so a batch racing the removal fails on rail 0
    /// ("peer removed") like on a single rail.
    std::vector<uint32_t> leaving;
    /// Whether new batches may use rail `i`.
    bool usable(uint32_t i) const { return handle[i] && refs[i] > leaving[i]; }
  };
  /// The entry of `peer`, made if need be; caller holds mutex_.
  peer_state& entry(peer_handle peer);
  /// One user of `peer` is being removed: on each rail beyond 0, the removal that will run
  /// there (`take_rail`) is counted now. Caller holds mutex_.
  void leave(peer_handle peer);
  /// One rail's share of a batch: the indices of its ops.
  struct part {
    uint32_t rail = 0;
    peer_handle peer = 0;  ///< the peer's handle on that rail
    std::vector<size_t> ops;
  };

  /// How `b` is split; caller holds mutex_.
  std::vector<part> plan(const write_batch& b) const;
  /// Part `p` of `b` as a batch of its rail (local regions mapped to the rail's ids).
  write_batch part_batch(const write_batch& b, const part& p) const;
  /// The rail's ids of `ids` (ids this engine never issued are left out).
  std::vector<region_id> ids_on(uint32_t rail, const std::vector<region_id>& ids) const;
  /// Keys for `n` registrations: random, within every rail's key size, never issued before.
  result<std::vector<uint64_t>> choose_keys(size_t n);
  /// On rail `rail`'s progress thread, when its removal or fence of `peer` runs: the peer's
  /// handle there (one user of it ends), or nullopt if it was never added there.
  std::optional<peer_handle> take_rail(peer_handle peer, uint32_t rail);
  void forget_if_unused(peer_handle peer);  ///< caller holds mutex_
  void on_immediates(uint32_t rail, immediate_counts counts);
  /// Hand what is pending to the consumer (the credit is taken), then give the rails whose
  /// batches it holds their credit back; nothing pending: the credit is free again.
  void deliver_pending();

  std::vector<std::unique_ptr<fabric_engine>> rails_;  ///< bulk rails, then the express rail
  uint32_t bulk_ = 1;
  std::optional<uint32_t> express_;  ///< index of the express rail
  uint64_t express_bytes_ = 0;
  uint64_t key_mask_ = ~uint64_t{0};

  mutable std::mutex mutex_;
  std::unordered_map<peer_handle, peer_state> peers_;
  std::deque<std::vector<region_id>> regions_;  ///< our id -> the id on each rail
  std::unordered_set<uint64_t> issued_keys_;

  std::mutex imm_mutex_;
  std::function<void(immediate_counts)> consumer_;
  bool consumer_busy_ = false;  ///< a delivered batch's credit is not back yet
  immediate_counts pending_;
  std::unordered_map<uint64_t, size_t> pending_index_;  ///< imm -> position in pending_
  std::vector<uint32_t> held_;  ///< rails whose batch is in pending_ (their credit held)
};

}  // namespace ferry::transport::detail
