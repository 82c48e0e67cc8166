#pragma once
/// Ferry's data-plane transport: libfabric `FI_EP_RDM` endpoints ("rails"), each driven by its
/// own progress thread that owns every libfabric call of its endpoint after start-up. One rail is
/// the plain engine; several (`engine_config::rails`, `express_bytes`) stripe a batch's writes
/// across the rails a peer shares with us, and send small batches on an express rail of their
/// own (transport/rail_engine.hpp). The contract below holds for both.
///
/// Threading: `open` and `local_address` are called before `start` from one thread. Every other
/// call is thread-safe before and after `start`. After `start`, the calls that touch the fabric
/// run on the progress thread. Two kinds:
/// - asynchronous (`register_regions`, `insert_peer_async`, `remove_peer`, `fence_peer`,
///   `submit`, `return_immediate_credit`): they queue work, wake the thread and return; a
///   completion callback reports the outcome. These are what an actor calls: an actor worker
///   never waits on the fabric.
/// - synchronous (`register_region`, `deregister_region`, `insert_peer`): the caller waits for
///   the progress thread to run them. For start-up, tests and threads of their own only.
/// Callbacks (`batch_done`, `immediates`, completions) run on a progress thread (or on the
/// caller's, when the engine is not running); they must be cheap and non-blocking (e.g. one
/// `caf::anon_send`).
///
/// Back-pressure: at most `max_inflight_writes` writes per rail are posted and uncompleted; the
/// rest wait in the submission queue (never an error). `-FI_EAGAIN` from a post means "progress and
/// retry".
///
/// Commit semantics: every write carries 8 bytes of remote CQ data (`imm`). The target's progress
/// thread reports each arrived immediate (only after its payload is placed) through the
/// `immediates` callback, aggregated as (imm, count) pairs, at most one undelivered batch at a
/// time (credit = 1), whichever rail they arrived on: after consuming a batch the consumer calls
/// `return_immediate_credit` (from within the callback too); immediates arriving meanwhile are
/// aggregated into the next batch, never dropped.
///
/// Lifetimes: a submitted batch is owned by the engine until its `batch_done` callback has run;
/// the submitter may die meanwhile. Registered memory must outlive the engine. After
/// `deregister_region` it may be freed once (a) no batch of this engine that uses it as a
/// source is pending and (b) for a remote_write region, no write a peer started before the
/// close can still be placed (tcp: until that peer's connection is gone; see below).
///
/// Fencing: each registration has its own remote key; `deregister_region` closes it, after which
/// the fabric rejects writes carrying that key (see `deregister_region` for the exact guarantee).
/// Keys are random where the application chooses them (no FI_MR_PROV_KEY), so a peer cannot
/// derive another registration's key from its own. With several rails a registration is made on
/// every rail under one key (each rail has its own domain), so a key and address a peer learnt
/// for rail 0 address every rail, and closing the registration closes it on every rail.
///
/// Rails with a peer: `insert_peer` makes the peer known on rail 0 (the address a hello
/// carries); `add_peer_rails` adds the peer's other endpoints on ours. A batch uses only rails on
/// which its peer is known. Removal and the fence act on every rail of the peer.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"

namespace ferry::transport {

/// The most endpoints `engine_config::rails` may ask for.
inline constexpr uint32_t max_rails = 16;

/// Engine settings (from the daemon config).
struct engine_config {
  std::string provider = "tcp";
  std::string address = "127.0.0.1";  ///< node/interface to bind (ignored by providers without one)
  uint32_t max_inflight_writes = 64;
  /// Payload bytes posted and not yet completed to one peer (0: bounded by the write count
  /// alone); a write larger than the bound goes out alone. Per rail.
  uint64_t max_inflight_bytes = 0;
  /// Endpoints that carry bulk writes, each with its own domain, CQ and progress thread; a
  /// batch's writes are striped across those its peer shares.
  uint32_t rails = 1;
  /// Batches of at most this many payload bytes go on an endpoint of their own (the express
  /// rail), so they never queue behind bulk writes; 0: no express rail.
  uint64_t express_bytes = 0;
  /// Peers write into this engine (ferryd: role decode or both), so its endpoints keep the
  /// addresses those peers hold: on shm a cut renews a rail only if it wrote to the cut peer.
  /// false (a prefill, and the default): every cut renews a rail that has ever written
  /// (transport/fabric_engine.hpp, `renew_on_cut_`).
  bool keep_address = false;
  /// Test hook: runs on the progress thread when a stop begins its drain (never in ferryd).
  std::function<void()> on_drain_start;
};

/// A locally registered memory region, as described to peers.
struct region_desc {
  uint64_t remote_base = 0;  ///< address peers put in fi_write: the virtual address if the
                             ///< provider uses FI_MR_VIRT_ADDR, else 0 (offset addressing)
  uint64_t key = 0;          ///< the rkey peers use
  uint64_t length = 0;
};

/// Opaque handle of a peer endpoint inserted into the address vector.
using peer_handle = uint64_t;

/// Local region handle returned by `register_region`. Never reused, also after deregistration.
using region_id = uint32_t;

/// What a registration allows (least privilege: the engine never asks for FI_REMOTE_READ).
enum class region_access : uint8_t {
  local,         ///< FI_READ|FI_WRITE: a local source of writes; not remotely writable
  remote_write,  ///< also FI_REMOTE_WRITE: peers holding its key may write into it
};

/// One one-sided write with immediate data.
struct write_op {
  region_id local_region = 0;
  uint64_t local_offset = 0;  ///< offset inside the local region
  uint64_t length = 0;
  uint64_t remote_addr = 0;  ///< remote region's remote_base + offset
  uint64_t remote_key = 0;
  uint64_t imm = 0;  ///< remote CQ data delivered to the target
};

/// Outcome of a batch: all writes locally completed, or the first error. Counted in
/// notifications (what `submit` returned): with notify::batch_end on tcp, 1 for the whole batch.
struct batch_result {
  uint32_t completed = 0;  ///< notifying writes locally completed successfully
  /// Writes that completed with an error or were never posted: more than 0 whenever a write
  /// of the batch may not have landed.
  uint32_t failed = 0;
  /// Writes never posted because the batch was cancelled (`engine::cancel_writes`): they never
  /// land, and the notifications they would have carried never arrive. Not a failure.
  uint32_t skipped = 0;
  /// The first error, as in result<T>: ok, or fabric_write_failed unless the code says more
  /// (peer_lost, ...), with the libfabric call, fi_strerror text and context.
  errc code = errc::ok;
  std::string message;
  bool ok() const { return code == errc::ok; }
};

/// Which writes of a batch deliver their immediate at the target (see `engine::submit`).
enum class notify : uint8_t {
  every_write,  ///< each write's immediate is delivered: the target counts ops.size()
  /// Where the engine can order writes (tcp: FI_ORDER_WAW), one immediate after the batch's
  /// last write, placed only after every write of the batch: the target counts 1. Elsewhere
  /// (shm) the same as every_write. All ops must carry the same `imm`.
  batch_end,
};

/// Shared by the batches of one sender (a room): once passed to `engine::cancel_writes`, what
/// of those batches is not posted yet never is.
struct write_cancel {
  std::atomic<bool> cancelled{false};
};

/// A group of writes to one peer; `done` runs once on the progress thread when every write has
/// completed (or failed, or was skipped by a cancel). Writes of one batch may be posted and
/// complete in any order.
struct write_batch {
  peer_handle peer = 0;
  std::vector<write_op> ops;
  std::function<void(batch_result)> done;
  notify mode = notify::every_write;
  std::shared_ptr<write_cancel> cancel;  ///< optional: lets `cancel_writes` stop the batch
};

/// Aggregated arrived immediates: (imm value, number of writes carrying it).
using immediate_counts = std::vector<std::pair<uint64_t, uint32_t>>;

/// One of this engine's endpoints, as described to peers. Rail 0 is `local_address()`.
struct rail_desc {
  std::vector<uint8_t> address;
  bool express = false;  ///< carries only batches of at most `engine_config::express_bytes`
};

/// A peer's endpoint to pair with one of ours (`add_peer_rails`).
struct peer_rail {
  uint32_t rail = 0;  ///< our rail (index into `rails()`, never 0)
  std::vector<uint8_t> address;
};

/// What one rail is doing, for metrics and status documents.
struct rail_stats {
  std::string name;  ///< "0", "1", ... for bulk rails, "express"
  bool express = false;
  uint64_t writes_in_flight = 0;  ///< posted and not yet completed (a tcp marker counts)
  uint64_t bytes_in_flight = 0;
  uint64_t writes_posted = 0;  ///< since start (a tcp marker counts)
  uint64_t bytes_posted = 0;
};

/// One registration asked of `register_regions`.
struct region_request {
  void* base = nullptr;
  uint64_t length = 0;
  region_access access = region_access::local;
};

class engine {
 public:
  /// Open fabric, domain, endpoint, CQ and AV for `cfg.provider`. Error text names the provider
  /// and the failing call; a provider missing from this machine says so.
  static result<std::unique_ptr<engine>> open(const engine_config& cfg);

  virtual ~engine() = default;

  /// Register [base, base+length) as a source of local writes and, with `remote_write`, as a
  /// target of remote writes. Each call yields a new registration with its own key, also for
  /// memory that is already registered (one registration per peer fences peers separately).
  /// Works before and after `start`. The default (remote_write) is the pre-fencing behaviour
  /// for existing callers; pass the access explicitly. (Default argument of a virtual: it binds
  /// to the static type; the override declares none, so call it through `engine`.)
  virtual result<region_id> register_region(void* base, uint64_t length,
                                            region_access access = region_access::remote_write) = 0;
  /// Close a registration. From its return on, `describe(id)` is empty, batches using `id` as a
  /// local source fail ("local region N is deregistered"), and a write whose header reaches
  /// the target later is rejected there (nothing placed, no immediate). Safe while peers write.
  /// NOT fenced: a write the provider accepted before the close. tcp streams a write into
  /// memory across progress calls and finishes it after the close -- however late, e.g. when
  /// the writer was SIGSTOPped mid-write and resumes -- and delivers its immediate; shm (CMA)
  /// copies a write in one progress call, so it lands wholly before the close or not at all.
  /// The initiator of a rejected write is not told (tcp: its write completes OK, the target
  /// drops the connection; shm: it never completes, nor do the initiator's later writes, until
  /// the initiator cuts that peer, see `remove_peer`); see tests/transport/test_fencing.cpp. Where
  /// the provider needs local descriptors (FI_MR_LOCAL) and posted writes still use the region as a
  /// source, the MR is closed as soon as they complete. Returns true if this call closed the
  /// registration, false (and logs a warning) if it was already closed; an error for an id never
  /// issued or a failed fi_close.
  virtual result<bool> deregister_region(region_id id) = 0;
  /// Asynchronous `register_region` of several regions, in one step of the progress thread:
  /// `done` gets their ids in order, or the first error (and then the ones registered before it
  /// are closed again, so a failure leaves nothing registered).
  virtual void register_regions(std::vector<region_request> regions,
                                std::function<void(result<std::vector<region_id>>)> done) = 0;
  /// Description of a registered region for peers (remote_base, key, length); all zero for an
  /// unknown or deregistered region.
  virtual region_desc describe(region_id id) const = 0;
  /// This endpoint's fabric address (fi_getname), to send to peers.
  virtual std::vector<uint8_t> local_address() const = 0;
  /// Provider name actually in use (e.g. "tcp;ofi_rxm", "shm").
  virtual std::string provider_name() const = 0;
  /// Every endpoint of this engine, rail 0 first (its address is `local_address()`), then the
  /// other bulk rails, then the express rail if there is one.
  virtual std::vector<rail_desc> rails() const = 0;
  /// What each rail of `rails()` is doing now.
  virtual std::vector<rail_stats> rail_activity() const = 0;

  /// Start the progress thread. `immediates` receives arrived remote CQ data (see contract).
  virtual void start(std::function<void(immediate_counts)> immediates) = 0;
  /// Stop the progress thread; pending batches complete with an error "engine stopped".
  virtual void stop() = 0;

  /// Insert a peer address into the AV (the caller waits for the progress thread). Inserting an
  /// address again returns the same handle and counts one more user of it.
  virtual result<peer_handle> insert_peer(const std::vector<uint8_t>& address) = 0;
  /// Asynchronous `insert_peer`: `done` gets the handle or the error.
  virtual void insert_peer_async(std::vector<uint8_t> address,
                                 std::function<void(result<peer_handle>)> done) = 0;
  /// Make the peer's other endpoints known on our rails (each `peer_rail` names one of ours,
  /// never rail 0), after `insert_peer` made it known on rail 0; batches to it use them from
  /// the next `submit` on. Each counts one user on its rail, which removal of the peer ends.
  /// `done` gets how many were added, or the first error (the others stay added). An engine
  /// with one rail accepts only an empty list.
  virtual void add_peer_rails(peer_handle peer, std::vector<peer_rail> rails,
                              std::function<void(result<uint32_t>)> done) = 0;
  /// Our rails that batches to `peer` may use now: 0, then those `add_peer_rails` added (for
  /// status documents; a removal in progress may not show yet).
  virtual std::vector<uint32_t> peer_rails(peer_handle peer) const = 0;
  /// Remove one user of a peer, on every rail: its queued batches fail with "peer removed", and
  /// its connection is cut (tcp: a write it had begun to send is not finished later). When other
  /// users remain, the address is inserted again under the same handle and their next writes
  /// reconnect. shm, on a rail that writes (the peer may have fenced us, and then never answers
  /// those writes, which blocks every later write of the endpoint, nor a later introduction of
  /// it to the peer): new writes are held,
  /// those in flight get a second to complete, then the endpoint is renewed (same domain, AV and
  /// registrations) and writes that never completed fail with "fabric endpoint renewed ...".
  /// Asynchronous (never blocks the caller on the fabric).
  virtual void remove_peer(peer_handle peer) = 0;
  /// The fence: close `regions` (the registrations this peer may write into) and then cut the
  /// peer's connection (`remove_peer`), in one step of the progress thread with no completion
  /// read in between, on every rail; `done` runs (on a progress thread, or the caller's when the
  /// engine is not running) once both have happened on every rail. From then on no byte of a write
  /// of that peer lands in those regions, on tcp as on shm, also a write it had begun to send (tcp:
  /// the connection carrying it is closed; shm with CMA: a write lands wholly before the close or
  /// not at all). Without `peer`, only the regions are closed.
  virtual void fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                          std::function<void()> done) = 0;

  /// The number of immediates the target receives once every write of `batch` has landed (its
  /// notifications): ops.size() with notify::every_write; with notify::batch_end 1 per rail the
  /// batch is striped across where the engine orders writes (tcp), else ops.size(). A commit
  /// counts these, never the writes. The rails a peer shares may grow (`add_peer_rails`), so
  /// what `submit` returns, not an earlier call of this, is the batch's count.
  virtual uint32_t notifications(const write_batch& batch) const = 0;
  /// Queue a batch for posting. Never blocks on the fabric. Returns `notifications(batch)`,
  /// whatever becomes of the batch later.
  virtual uint32_t submit(write_batch batch) = 0;
  /// Stop posting the batches that carry `cancel` (their room failed): from now on none of their
  /// ops not yet posted is, including batches submitted later with it. What was posted still
  /// completes and is counted; where one notification stands for a whole batch (tcp,
  /// notify::batch_end) and part of it was posted, that notification is still sent, after the
  /// posted part, so the target's count covers every byte that may land. The rest comes back
  /// as `batch_result::skipped`. Asynchronous; never blocks on the fabric.
  virtual void cancel_writes(std::shared_ptr<write_cancel> cancel) = 0;
  /// The consumer finished with the last `immediates` batch; the next may be delivered.
  virtual void return_immediate_credit() = 0;
  /// A hint: peers are about to write here (a decode room sent its prepares), so for `window`
  /// the progress thread notices arrivals as soon as it would right after traffic. Matters
  /// where the provider has no wait object (shm): an idle thread there sleeps in steps of up
  /// to 4 ms, the wait of a first write after a quiet second. Cheap; no effect on tcp.
  virtual void expect_writes(std::chrono::milliseconds window) = 0;
};

}  // namespace ferry::transport
