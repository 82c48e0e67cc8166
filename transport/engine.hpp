#pragma once
/// Ferry's data-plane transport: one libfabric `FI_EP_RDM` endpoint per daemon, driven by one
/// progress thread that owns every libfabric call after start-up.
///
/// Threading: `open`, `register_region` and `local_address` are called before `start` from one
/// thread. After `start`, `insert_peer`, `remove_peer`, `submit` and `return_immediate_credit` are
/// thread-safe and never block on the fabric: they queue work for the progress thread and wake it.
/// Callbacks (`batch_done`, `immediates`) run on the progress thread; they must be cheap and
/// non-blocking (e.g. one `caf::anon_send`).
///
/// Back-pressure: at most `max_inflight_writes` writes are posted and uncompleted; the rest wait
/// in the submission queue (never an error). `-FI_EAGAIN` from a post means "progress and retry".
///
/// Commit semantics: every write carries 8 bytes of remote CQ data (`imm`). The target's progress
/// thread reports each arrived immediate (only after its payload is placed) through the
/// `immediates` callback, aggregated as (imm, count) pairs, at most one undelivered batch at a
/// time (credit = 1): after consuming a batch the consumer calls `return_immediate_credit`;
/// immediates arriving meanwhile are aggregated into the next batch, never dropped.
///
/// Lifetimes: a submitted batch is owned by the engine until its `batch_done` callback has run;
/// the submitter may die meanwhile. Registered regions must outlive the engine.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ferry::transport {

/// Engine settings (from the daemon config).
struct engine_config {
  std::string provider = "tcp";
  std::string address = "127.0.0.1";  ///< node/interface to bind (ignored by providers without one)
  uint32_t max_inflight_writes = 64;
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

/// Local region handle returned by `register_region`.
using region_id = uint32_t;

/// One one-sided write with immediate data.
struct write_op {
  region_id local_region = 0;
  uint64_t local_offset = 0;  ///< offset inside the local region
  uint64_t length = 0;
  uint64_t remote_addr = 0;  ///< remote region's remote_base + offset
  uint64_t remote_key = 0;
  uint64_t imm = 0;  ///< remote CQ data delivered to the target
};

/// Outcome of a batch: all writes locally completed, or the first error.
struct batch_result {
  bool ok = true;
  uint32_t completed = 0;  ///< writes locally completed successfully
  uint32_t failed = 0;     ///< writes that completed with an error or were never posted
  std::string error;       ///< first error: the libfabric call, fi_strerror text, and context
};

/// A group of writes to one peer; `done` runs once on the progress thread when every write has
/// completed (or failed). Writes of one batch may be posted and complete in any order.
struct write_batch {
  peer_handle peer = 0;
  std::vector<write_op> ops;
  std::function<void(batch_result)> done;
};

/// Aggregated arrived immediates: (imm value, number of writes carrying it).
using immediate_counts = std::vector<std::pair<uint64_t, uint32_t>>;

/// Result of fallible engine calls: empty error string = success.
template <class T>
struct result {
  T value{};
  std::string error;
  explicit operator bool() const { return error.empty(); }
};

class engine {
 public:
  /// Open fabric, domain, endpoint, CQ and AV for `cfg.provider`. Error text names the provider
  /// and the failing call; a provider missing from this machine says so.
  static result<std::unique_ptr<engine>> open(const engine_config& cfg);

  virtual ~engine() = default;

  /// Register [base, base+length) for local writes and remote writes into it. Once per pool.
  virtual result<region_id> register_region(void* base, uint64_t length) = 0;
  /// Description of a registered region for peers (remote_base, key, length).
  virtual region_desc describe(region_id id) const = 0;
  /// This endpoint's fabric address (fi_getname), to send to peers.
  virtual std::vector<uint8_t> local_address() const = 0;
  /// Provider name actually in use (e.g. "tcp;ofi_rxm", "shm").
  virtual std::string provider_name() const = 0;

  /// Start the progress thread. `immediates` receives arrived remote CQ data (see contract).
  virtual void start(std::function<void(immediate_counts)> immediates) = 0;
  /// Stop the progress thread; pending batches complete with an error "engine stopped".
  virtual void stop() = 0;

  /// Insert a peer address into the AV (blocks the caller only for the AV insert).
  virtual result<peer_handle> insert_peer(const std::vector<uint8_t>& address) = 0;
  /// Remove a peer; its queued batches fail with "peer removed".
  virtual void remove_peer(peer_handle peer) = 0;

  /// Queue a batch for posting. Never blocks on the fabric.
  virtual void submit(write_batch batch) = 0;
  /// The consumer finished with the last `immediates` batch; the next may be delivered.
  virtual void return_immediate_credit() = 0;
};

}  // namespace ferry::transport
