#pragma once
// libfabric implementation of transport::engine: the declaration of `fabric_engine`, shared by
// the files that implement it. Private to transport/ (engine.hpp is the interface), so the
// implementation can be split by idea without widening the public API:
// - fabric_bring_up.cpp: opening the libfabric objects, engine::open;
// - fabric_registry.cpp: memory registrations and their keys;
// - fabric_peers.cpp: the address vector, removal, the fence, shm endpoint renewal;
// - fabric_control.cpp: handing work to the progress thread, start and stop;
// - fabric_progress.cpp: the progress thread (posting, completions, immediates, waiting);
// - shm_files.cpp: shm provider files and the CMA probe.
// With several rails (rail_engine.hpp) each rail is one fabric_engine with its own fabric,
// domain, AV, CQ, endpoint and progress thread; the `*_keyed` and `*_resolved` calls below are
// what the rail engine needs beyond the engine interface.
//
// Design: after `start`, one progress thread owns every libfabric call. Callers hand it work
// through one FIFO (submissions and commands in order; commands that return a value wait on a
// future). Before `start` and after the thread has exited, callers run commands directly under
// `fabric_mutex_`, which the thread holds for its whole life, so the domain is never used by two
// threads at once (FI_THREAD_DOMAIN suffices).
//
// Waiting: the loop polls while there is activity, keeps polling for `spin_budget` after the last
// activity, then blocks: in ppoll on the CQ's FI_WAIT_FD fd plus a wake eventfd (after
// fi_trywait) where the provider has one (tcp;ofi_rxm), else in ppoll on the eventfd alone with
// a doubling timeout (shm, which has no usable wait object).

#include <rdma/fabric.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "transport/engine.hpp"
#include "transport/fabric_handles.hpp"
#include "transport/log.hpp"
#include "transport/peer_queues.hpp"

namespace ferry::transport::detail {

using clock_type = std::chrono::steady_clock;

inline const error stopped_error{errc::fabric_unavailable, "engine stopped"};

/// Per-batch bookkeeping, owned by the engine from `submit` until `done` has run.
struct batch_state {
  explicit batch_state(write_batch b) : batch(std::move(b)), end(batch.ops.size()) {
    for (const auto& op : batch.ops) unposted_bytes += op.length;
  }
  write_batch batch;
  size_t next = 0;              ///< index of the next op to post
  size_t end;                   ///< one past the last op to post (fewer once cancelled)
  uint64_t unposted_bytes = 0;  ///< bytes of the ops from `next` on: its place in its peer's queue
  bool marker_pending = false;  ///< split commit: op `next`'s data is posted, its marker not yet
  /// Split commit: whether op `i`'s data write is followed by a marker (every op, or with
  /// notify::batch_end only the last one posted).
  bool marked(size_t i) const { return batch.mode == notify::every_write || i + 1 == end; }
  uint32_t outstanding = 0;  ///< posts (data or marker) not yet completed
  bool in_pending = false;   ///< still referenced by pending_ (must not finish yet)
  batch_result result;
  std::list<std::unique_ptr<batch_state>>::iterator self;  ///< position in live_

  /// Whether every op has been posted or given up on.
  bool all_posted() const { return next >= end; }
  /// Whether its room cancelled it (engine::cancel_writes) and it still has ops to drop.
  bool cancel_due() const {
    return batch.cancel && !all_posted() && batch.cancel->cancelled.load(std::memory_order_relaxed);
  }
  /// Record a failure; the first one names the batch's error.
  void fail(uint32_t count, const error& why) {
    result.failed += count;
    note(why);
  }
  /// Keep the first error as the batch's.
  void note(const error& why) {
    if (!result.ok()) return;
    result.code = why.code;
    result.message = why.message;
  }
  /// Give up on the ops not yet posted.
  void abort_unposted(const error& why) {
    if (all_posted()) return;
    fail(static_cast<uint32_t>(end - next), why);
    next = end;
    unposted_bytes = 0;
    marker_pending = false;
  }
  /// Cancelled: post nothing more of it than the notification that covers what was posted. In
  /// a split commit (tcp) a data write whose marker is pending keeps it; with notify::batch_end
  /// a batch part of which was posted still sends its one marker, now after op `next` - 1, so
  /// the target's count still orders after every byte of it that may land.
  void truncate(bool split_commit) {
    if (all_posted()) return;
    size_t keep = next + (marker_pending ? 1 : 0);
    if (split_commit && batch.mode == notify::batch_end && !marker_pending && next > 0) {
      --next;  // op next - 1's data is posted; its marker carries the batch's notification
      marker_pending = true;
      keep = next + 1;
    }
    result.skipped += static_cast<uint32_t>(end - keep);
    end = keep;
    unposted_bytes = 0;  // (a pending marker carries no bytes)
  }
  /// Op `next` is posted (with its marker, in a split commit).
  void advance() { unposted_bytes -= std::min(unposted_bytes, batch.ops[next++].length); }
};

/// A batch's place in its peer's posting queue: its bytes not yet posted.
struct unposted_bytes_of {
  uint64_t operator()(const batch_state* b) const { return b->unposted_bytes; }
};

/// Context handed to the provider with every operation. FI_CONTEXT/FI_CONTEXT2 let the provider
/// use the first bytes, so the fi_context2 comes first and stays untouched by us.
struct op_context {
  enum class kind : uint8_t { write, receive };
  fi_context2 provider_scratch{};
  kind what = kind::write;
  batch_state* batch = nullptr;
  region_id source = 0;  ///< local region of a posted write (its MR stays open until completion)
  bool marker = false;   ///< split commit: the 0-byte write carrying the op's immediate
  uint64_t bytes = 0;    ///< payload bytes of a posted write, counted in its peer's bytes in flight
  uint64_t peer = 0;
};

/// A queued request for the progress thread; FIFO order between submissions and commands keeps
/// e.g. "submit to P, remove P" failing that submission with "peer removed".
struct work_item {
  std::unique_ptr<batch_state> batch;  ///< a submission, or
  std::function<void()> task;          ///< a command to run on the progress thread
};

/// 64 unpredictable bits from the kernel CSPRNG: memory keys must not be derivable from other
/// keys a peer has seen, which rules out a seeded PRNG such as mt19937_64.
uint64_t random_u64();

/// Run a user callback without letting an exception kill the progress thread.
template <class F, class... A>
void invoke_callback(spdlog::logger& log, const char* what, F& f, A&&... args) {
  if (!f) return;
  try {
    f(std::forward<A>(args)...);
  } catch (const std::exception& e) {
    log.error("{} callback threw: {}", what, e.what());
  } catch (...) {
    log.error("{} callback threw a non-standard exception", what);
  }
}

class fabric_engine final : public engine {
 public:
  fabric_engine() = default;
  ~fabric_engine() override { stop(); }

  /// Open the libfabric objects. `label` names the rail in logs and `rail_activity` ("0" for a
  /// daemon's only or first rail); `express`: this rail carries only small batches.
  result<> init(const engine_config& cfg, std::string label = "0", bool express = false);

  result<region_id> register_region(void* base, uint64_t length, region_access access) override;
  result<bool> deregister_region(region_id id) override;
  void register_regions(std::vector<region_request> regions,
                        std::function<void(result<std::vector<region_id>>)> done) override;
  region_desc describe(region_id id) const override;
  std::vector<uint8_t> local_address() const override {
    std::lock_guard<std::mutex> lock(address_mutex_);
    return address_;
  }
  std::string provider_name() const override { return provider_; }
  std::vector<rail_desc> rails() const override { return {{local_address(), express_}}; }
  std::vector<rail_stats> rail_activity() const override;

  void start(std::function<void(immediate_counts)> immediates) override;
  void stop() override;

  result<peer_handle> insert_peer(const std::vector<uint8_t>& address) override;
  void insert_peer_async(std::vector<uint8_t> address,
                         std::function<void(result<peer_handle>)> done) override;
  void add_peer_rails(peer_handle peer, std::vector<peer_rail> rails,
                      std::function<void(result<uint32_t>)> done) override;
  std::vector<uint32_t> peer_rails(peer_handle) const override { return {0}; }
  void remove_peer(peer_handle peer) override;
  void fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                  std::function<void()> done) override;

  // For the rail engine (rail_engine.cpp), which registers a region on every rail under one key
  // it chose, and names a rail's peer only once the rail's progress thread runs the call (its
  // insertion, queued before, has answered by then).

  /// Whether the provider issues memory keys itself (FI_MR_PROV_KEY): then a key cannot be
  /// the same on every rail.
  bool provider_keys() const { return (mr_mode_ & FI_MR_PROV_KEY) != 0; }
  /// The bits a key may use on this domain (mr_key_size).
  uint64_t key_mask() const { return key_mask_; }
  /// `register_region` under `key` (never FI_MR_PROV_KEY); -FI_ENOKEY is an error, not a retry.
  result<region_id> register_region_keyed(void* base, uint64_t length, region_access access,
                                          uint64_t key);
  /// `register_regions`, region i under keys[i].
  void register_regions_keyed(std::vector<region_request> regions, std::vector<uint64_t> keys,
                              std::function<void(result<std::vector<region_id>>)> done);
  /// `remove_peer` of the peer `resolve` names when the progress thread runs it (nullopt:
  /// nothing to remove).
  void remove_peer_resolved(std::function<std::optional<peer_handle>()> resolve);
  /// Run `task` on the progress thread, after what is queued (or directly when not running).
  void post(std::function<void()> task) { run_queued(std::move(task)); }
  /// `fence_peer`, with the peer named by `resolve` when the progress thread runs it.
  void fence_peer_resolved(std::function<std::optional<peer_handle>()> resolve,
                           std::vector<region_id> regions, std::function<void()> done);

  uint32_t notifications(const write_batch& b) const override {
    if (split_commit_ && b.mode == notify::batch_end) return b.ops.empty() ? 0 : 1;
    return static_cast<uint32_t>(b.ops.size());
  }
  uint32_t submit(write_batch batch) override;
  void cancel_writes(std::shared_ptr<write_cancel> cancel) override;
  void return_immediate_credit() override;
  void expect_writes(std::chrono::milliseconds window) override;

 private:
  struct region {
    void* base = nullptr;
    uint64_t length = 0;
    mr_ptr mr;                  ///< null once closed
    void* desc = nullptr;       ///< fi_mr_desc when the provider wants FI_MR_LOCAL, else null
    region_desc remote;         ///< zeroed by deregistration
    bool deregistered = false;  ///< no new writes from it; describe() is empty
    uint32_t posted = 0;        ///< writes posted from it, not yet completed
  };

  enum class run_state { idle, running, draining, stopped };
  enum class wait_kind { fd, sleep };

  result<> open_cq();
  /// Open the endpoint on the domain, bind it to the AV and the CQ, enable it, read its address
  /// and post its receives.
  result<> open_endpoint();
  result<> post_receives(size_t count);

  /// Run `fn` with exclusive use of the fabric objects: on the progress thread if it is running
  /// (waiting for the result), else directly on the caller's thread.
  template <class R>
  R run_exclusive(std::function<R()> fn);

  bool on_progress_thread() const {
    return progress_thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }
  void wake();

  /// `chosen`: the rail engine's key; none: a random key of this engine's own.
  result<region_id> do_register_region(void* base, uint64_t length, region_access access,
                                       std::optional<uint64_t> chosen = std::nullopt);
  void do_register_regions(const std::vector<region_request>& regions,
                           const std::vector<uint64_t>& keys,
                           std::function<void(result<std::vector<region_id>>)>& done);
  result<bool> do_deregister_region(region_id id);
  result<> close_region_mr(region_id id);
  result<uint64_t> choose_key() const;
  result<peer_handle> do_insert_peer(const std::vector<uint8_t>& address);
  void do_remove_peer(peer_handle peer);
  void do_fence_peer(std::optional<peer_handle> peer, const std::vector<region_id>& regions);
  /// Run `task` on the progress thread after what is queued, or directly when it is not running.
  void run_queued(std::function<void()> task);

  void run();
  bool take_queue();
  void admit(std::unique_ptr<batch_state> b);
  /// Drop from the posting queue what the batches carrying `cancel` have not posted yet.
  void do_cancel_writes(const write_cancel* cancel);
  bool post_writes();
  /// Post one operation of op `b->next`: its write, or (split commit) its data or marker.
  /// False: the provider is full (-FI_EAGAIN), retry later; true: posted or given up on.
  bool post_one(batch_state* b, const write_op& op, region& r, bool marker);
  size_t read_completions();
  void handle_error_entry();
  void repost_receive(op_context* ctx);
  void complete_op(op_context* ctx, bool ok, const error& why);
  void maybe_finish(batch_state* b);
  bool deliver_immediates();
  void block(clock_type::duration idle_for, clock_type::duration& sleep_step);
  void drain_and_fail_all();
  /// While draining: run the calls queued since (they are never run on a caller's thread).
  void run_late_tasks();
  void run_items(std::deque<work_item>& items);
  /// shm: hold new writes once a peer is cut, so the endpoint can be
  /// renewed (`renew_endpoint`) as soon as the writes in flight have completed.
  void request_renewal(peer_handle peer);
  /// shm: replace the endpoint and CQ (same domain, AV and registrations), failing the writes
  /// that never completed. See `renew_on_cut_`.
  void renew_endpoint();
  /// shm: closes the retired endpoints whose introductions can no longer be read by a peer
  /// that outlives them (see `retired_`): with `answered` (the address a post was just taken
  /// for), those waiting on that peer; without (once a second), those whose peers are gone.
  void prune_retired(const std::vector<uint8_t>* answered);

  engine_config cfg_;
  std::string label_ = "0";  ///< this rail, in logs and rail_activity
  bool express_ = false;
  std::shared_ptr<spdlog::logger> log_;
  std::string provider_;
  mutable std::mutex address_mutex_;  ///< address_ changes when the endpoint is renewed
  std::vector<uint8_t> address_;
  uint64_t mr_mode_ = 0;
  bool rx_cq_data_ = false;
  /// tcp: each write goes as a plain fi_write followed by a 0-byte fi_writedata carrying its
  /// immediate (ordered after it: FI_ORDER_WAW). In libfabric 1.17, cutting a peer's connection
  /// (fi_av_remove with FI_AV_REMOVE_CLEANUP) while an fi_writedata *with payload* is partly
  /// received crashes ofi_rxm (it reads the NULL context of the cancelled remote write); a plain
  /// write's cancellation is internal to the tcp provider. shm keeps one fi_writedata: it has
  /// no connection to cut, and its key check applies only to writes with CQ data.
  bool split_commit_ = false;
  /// shm: the target of a write with a closed key (a peer that fenced us) drops the command and
  /// never answers it. A rejected write above 4 KiB then never completes, and as the initiator
  /// consumes answers in order, neither does any later large write of this endpoint, to any
  /// peer; each rejected smaller one leaks an inject buffer (the 1025th crashes). And a peer
  /// that removed our address (its fence) has dropped the id it gave this endpoint, which this
  /// endpoint does not learn: once the peer's address is inserted again, its posts to it are
  /// refused forever (-FI_EAGAIN) or crash the peer (libfabric 1.17 reads the unmapped region of
  /// that id) -- also when this endpoint had only been introduced to it (renewed, inserted, cut
  /// before its first write went out; seen with tests/e2e/test_stop_stress.cpp). Only a new
  /// endpoint ends that. So whenever a peer is cut (its connection ended: it may have fenced
  /// us) on an endpoint that writes (`writer_`), new writes are held, the writes in flight get
  /// `renew_wait` to complete, and the endpoint is replaced; writes still posted then fail. An
  /// endpoint that never wrote (a decode's: a pure target) keeps its address, which its other
  /// peers write to; so does one whose peers write to it (`engine_config::keep_address`, a node
  /// of role both), which renews only when it had posted writes to the cut peer.
  bool renew_on_cut_ = false;
  /// shm: a new endpoint's first post to a peer is refused (-FI_EAGAIN) and queues a request in
  /// the peer's region naming this endpoint; the peer maps the endpoint's region by that name
  /// when its progress reads the request, and the endpoint's posts are taken from then on. In
  /// libfabric 1.17 a peer that reads the request once the endpoint is closed (its region
  /// unlinked) dereferences a null region and crashes: a peer that was hung when we wrote to it
  /// first, cut, then resumed; or, in one process, a target slower than the cut. So an endpoint
  /// is closed only once each peer it introduced itself to took a post from it (or the peer is
  /// gone): these are the peers it has not heard from yet (peer -> address), and an endpoint
  /// renewed with any left is retired, not closed.
  std::unordered_map<fi_addr_t, std::vector<uint8_t>> unanswered_;
  /// A replaced endpoint kept open, never read, until no peer can still read its introduction:
  /// each peer it waits on took a post from a later endpoint of ours (a peer reads its requests
  /// in order, so it has read the older one too; one that replaced its own region never will),
  /// or its process is gone.
  struct retired_endpoint {
    cq_ptr cq;  ///< declared first: the endpoint closes before its CQ
    ep_ptr ep;
    std::vector<std::vector<uint8_t>> waiting_on;  ///< the peers' addresses
  };
  bool writer_ = false;  ///< this endpoint has tried a write (shm: see renew_on_cut_)
  bool renew_pending_ = false;
  clock_type::time_point renew_deadline_{};
  std::string renew_reason_;
  uint64_t key_mask_ = ~uint64_t{0};  ///< keys the domain can carry (mr_key_size bytes)
  /// Every key this engine has registered, live or closed: a new registration never reuses the
  /// key of a closed one, so a fenced peer's stale key cannot match it.
  std::unordered_set<uint64_t> issued_keys_;

  // libfabric objects, declared in open order so destruction closes ep, cq, mr, av, domain,
  // fabric. The op contexts are declared before cq/ep so the provider never outlives them.
  info_ptr info_;
  fabric_ptr fabric_;
  domain_ptr domain_;
  av_ptr av_;
  std::deque<region> regions_;  ///< deque: appends keep references stable
  mutable std::mutex regions_mutex_;
  std::vector<op_context> write_contexts_;
  std::vector<op_context> receive_contexts_;
  cq_ptr cq_;
  ep_ptr ep_;
  std::vector<retired_endpoint> retired_;  ///< after ep_: closed before it, the AV and domain
  clock_type::time_point next_retired_check_{};

  // Waiting.
  wait_kind wait_kind_ = wait_kind::sleep;
  int cq_wait_fd_ = -1;  ///< owned by the CQ
  unique_fd wake_fd_;
  std::atomic<bool> sleeping_{false};
  /// expect_writes: until then (steady clock, ns since epoch) the thread sleeps in its short
  /// steps, as right after traffic.
  std::atomic<int64_t> expect_until_ns_{0};

  // Cross-thread state.
  std::mutex lifecycle_mutex_;  ///< serialises start/stop
  /// Held by the progress thread for its lifetime; direct calls before start / after stop take
  /// it to stay exclusive. Recursive: a callback run under it (a direct call's) may call this
  /// engine again, as the rail engine's do.
  std::recursive_mutex fabric_mutex_;
  std::mutex queue_mutex_;
  std::deque<work_item> queue_;        ///< guarded by queue_mutex_
  run_state state_ = run_state::idle;  ///< guarded by queue_mutex_
  std::atomic<bool> queue_nonempty_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> credit_returned_{false};
  std::atomic<std::thread::id> progress_thread_id_{};
  std::thread thread_;
  std::function<void(immediate_counts)> immediates_;

  // Progress-thread state (or the direct caller's under fabric_mutex_).
  struct peer_entry {
    uint32_t refs = 0;             ///< insert_peer calls not yet matched by a removal
    std::vector<uint8_t> address;  ///< for re-inserting after a cut that others still use
    uint64_t writes_posted = 0;    ///< since insertion or the last endpoint renewal (shm)
  };
  std::unordered_map<fi_addr_t, peer_entry> peers_;
  /// shm: peers removed while the endpoint had writes to them posted; they leave the AV once
  /// the endpoint is renewed (address kept to reuse the entry if the peer is inserted again).
  std::unordered_map<fi_addr_t, std::vector<uint8_t>> av_removals_after_renewal_;
  std::unordered_set<fi_addr_t> removed_peers_;
  std::list<std::unique_ptr<batch_state>> live_;  ///< every batch not yet finished
  /// Batches with ops left to post: peers served round-robin one write at a time, and within a
  /// peer the batch with the fewest bytes left first (transport/peer_queues.hpp).
  peer_queues<batch_state*, unposted_bytes_of> pending_;
  /// Payload bytes posted and not yet completed, per peer: bounded by max_inflight_bytes, so
  /// a small room's writes wait behind that much of a large room's, not behind a whole window.
  std::unordered_map<uint64_t, uint64_t> inflight_bytes_;
  std::vector<op_context*> free_contexts_;
  uint32_t inflight_ = 0;
  // Read by rail_activity from any thread; written by the progress thread only.
  std::atomic<uint64_t> stat_writes_in_flight_{0}, stat_bytes_in_flight_{0};
  std::atomic<uint64_t> stat_writes_posted_{0}, stat_bytes_posted_{0};
  ssize_t last_cq_error_ = 0;
  /// Since when every post has been refused with -FI_EAGAIN (none: the last one went out), and
  /// whether that streak was logged.
  std::optional<clock_type::time_point> refused_since_;
  bool refused_logged_ = false;
  bool credit_ = true;
  immediate_counts imm_batch_;
  std::unordered_map<uint64_t, size_t> imm_index_;  ///< imm -> position in imm_batch_
};

// In the header: the registry and the peers both instantiate it.
template <class R>
R fabric_engine::run_exclusive(std::function<R()> fn) {
  if (on_progress_thread()) return fn();  // e.g. called from a callback
  {
    std::unique_lock<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::running) {
      auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
      std::future<R> f = task->get_future();
      queue_.push_back(work_item{nullptr, [task] { (*task)(); }});
      queue_nonempty_.store(true);
      lock.unlock();
      wake();
      return f.get();
    }
  }
  // Not started, or stopping: the progress thread releases fabric_mutex_ once it exits.
  std::lock_guard<std::recursive_mutex> guard(fabric_mutex_);
  return fn();
}

}  // namespace ferry::transport::detail
