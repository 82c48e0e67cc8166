// libfabric implementation of transport::engine.
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
#include "transport/engine.hpp"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <list>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "transport/fabric_handles.hpp"
#include "transport/log.hpp"
#include "transport/peer_queues.hpp"

namespace ferry::transport {
namespace {

using clock_type = std::chrono::steady_clock;

/// mr_mode bits the engine knows how to honour (requested in the hints, checked on read-back).
constexpr uint64_t handled_mr_mode =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
/// Mode bits the engine supports: its contexts start with an fi_context2, and it can pre-post
/// receives for providers that consume one per arriving remote CQ data.
constexpr uint64_t handled_mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;

/// Completions read per fi_cq_read: one batch amortises the provider's progress call.
constexpr size_t cq_batch = 64;
/// Receives kept posted when the provider needs FI_RX_CQ_DATA.
constexpr size_t rx_posted = 256;
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
/// shm endpoint renewal: how long the writes in flight get to complete before it (healthy ones
/// complete in microseconds to milliseconds; a write a fenced peer dropped never does).
constexpr auto renew_wait = std::chrono::seconds(1);
/// shm (libfabric 1.17): writes up to this size are copied through inject buffers.
constexpr uint64_t shm_inject_size = 4096;

const char* const stopped_text = "engine stopped";

/// libfabric 1.17's ofi_rxm closes its connection to a peer in fi_av_remove only when
/// FI_AV_REMOVE_CLEANUP=1 was in the environment at the process's first libfabric call; the
/// fence (fence_peer) depends on that cut. Set it when this library is loaded, before main.
const bool av_remove_cleanup_set = [] { return ::setenv("FI_AV_REMOVE_CLEANUP", "1", 1) == 0; }();

/// Attempts at finding a key the provider accepts (a random 64-bit key practically never
/// collides; a provider with a 1- or 2-byte key space can run out).
constexpr int key_attempts = 64;

/// 64 unpredictable bits from the kernel CSPRNG (keys must not be derivable from other keys a
/// peer has seen, which rules out a seeded PRNG such as mt19937_64).
uint64_t random_u64() {
  uint64_t v = 0;
  for (int tries = 0; tries < 8; ++tries) {
    const ssize_t n = ::getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
    if (n < 0 && errno != EINTR) break;
  }
  // getrandom unavailable (ENOSYS in an old sandbox): random_device reads the same pool.
  static std::mutex m;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(m);
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

bool is_ip_addr_format(uint32_t fmt) {
  return fmt == FI_SOCKADDR || fmt == FI_SOCKADDR_IN || fmt == FI_SOCKADDR_IN6;
}

std::string mr_mode_text(uint64_t bits) {
  static const std::pair<uint64_t, const char*> names[] = {
      {FI_MR_BASIC, "FI_MR_BASIC"},         {FI_MR_SCALABLE, "FI_MR_SCALABLE"},
      {FI_MR_LOCAL, "FI_MR_LOCAL"},         {FI_MR_RAW, "FI_MR_RAW"},
      {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"}, {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"},
      {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},   {FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
      {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"}, {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},
      {FI_MR_HMEM, "FI_MR_HMEM"},           {FI_MR_COLLECTIVE, "FI_MR_COLLECTIVE"}};
  std::string out;
  for (const auto& [bit, name] : names) {
    if ((bits & bit) != 0) out += (out.empty() ? "" : "|") + std::string(name);
  }
  return out.empty() ? "0" : out;
}

/// Per-batch bookkeeping, owned by the engine from `submit` until `done` has run.
struct batch_state {
  explicit batch_state(write_batch b) : batch(std::move(b)) {}
  write_batch batch;
  size_t next = 0;              ///< index of the next op to post
  bool marker_pending = false;  ///< split commit: op `next`'s data is posted, its marker not yet
  uint32_t outstanding = 0;     ///< posts (data or marker) not yet completed
  bool in_pending = false;      ///< still referenced by pending_ (must not finish yet)
  batch_result result;
  std::list<std::unique_ptr<batch_state>>::iterator self;  ///< position in live_

  /// Whether every op has been posted or given up on.
  bool all_posted() const { return next >= batch.ops.size(); }
  /// Record a failure; the first one names the batch's error.
  void fail(uint32_t count, const std::string& why) {
    result.ok = false;
    result.failed += count;
    if (result.error.empty()) result.error = why;
  }
  /// Give up on the ops not yet posted.
  void abort_unposted(const std::string& why) {
    if (all_posted()) return;
    fail(static_cast<uint32_t>(batch.ops.size() - next), why);
    next = batch.ops.size();
    marker_pending = false;
  }
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
};

/// A queued request for the progress thread; FIFO order between submissions and commands keeps
/// e.g. "submit to P, remove P" failing that submission with "peer removed".
struct work_item {
  std::unique_ptr<batch_state> batch;  ///< a submission, or
  std::function<void()> task;          ///< a command to run on the progress thread
};

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

  std::string init(const engine_config& cfg);

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

  void start(std::function<void(immediate_counts)> immediates) override;
  void stop() override;

  result<peer_handle> insert_peer(const std::vector<uint8_t>& address) override;
  void insert_peer_async(std::vector<uint8_t> address,
                         std::function<void(result<peer_handle>)> done) override;
  void remove_peer(peer_handle peer) override;
  void fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                  std::function<void()> done) override;

  void submit(write_batch batch) override;
  void return_immediate_credit() override;

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

  std::string open_cq();
  /// Open the endpoint on the domain, bind it to the AV and the CQ, enable it, read its address
  /// and post its receives.
  std::string open_endpoint();
  std::string post_receives(size_t count);

  /// Run `fn` with exclusive use of the fabric objects: on the progress thread if it is running
  /// (waiting for the result), else directly on the caller's thread.
  template <class R>
  R run_exclusive(std::function<R()> fn);

  bool on_progress_thread() const {
    return progress_thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }
  void wake();

  result<region_id> do_register_region(void* base, uint64_t length, region_access access);
  result<bool> do_deregister_region(region_id id);
  std::string close_region_mr(region_id id);
  result<uint64_t> choose_key() const;
  result<peer_handle> do_insert_peer(const std::vector<uint8_t>& address);
  void do_remove_peer(peer_handle peer);
  void do_fence_peer(std::optional<peer_handle> peer, const std::vector<region_id>& regions);
  /// Run `task` on the progress thread after what is queued, or directly when it is not running.
  void run_queued(std::function<void()> task);

  void run();
  bool take_queue();
  void admit(std::unique_ptr<batch_state> b);
  bool post_writes();
  /// Post one operation of op `b->next`: its write, or (split commit) its data or marker.
  /// False: the provider is full (-FI_EAGAIN), retry later; true: posted or given up on.
  bool post_one(batch_state* b, const write_op& op, region& r, bool marker);
  size_t read_completions();
  void handle_error_entry();
  void repost_receive(op_context* ctx);
  void complete_op(op_context* ctx, bool ok, const std::string& why);
  void maybe_finish(batch_state* b);
  bool deliver_immediates();
  void block(clock_type::duration idle_for, clock_type::duration& sleep_step);
  void drain_and_fail_all();
  /// shm: hold new writes once a peer that was written to is cut, so the endpoint can be
  /// renewed (`renew_endpoint`) as soon as the writes in flight have completed.
  void request_renewal(peer_handle peer);
  /// shm: replace the endpoint and CQ (same domain, AV and registrations), failing the writes
  /// that never completed. See `renew_on_cut_`.
  void renew_endpoint();

  engine_config cfg_;
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
  /// peer; each rejected smaller one leaks an inject buffer (the 1025th crashes). Only closing
  /// the endpoint ends that. So when a peer this engine wrote to is cut (its connection ended:
  /// it may have fenced us), new writes are held, the writes in flight get `renew_wait` to
  /// complete, and the endpoint is replaced; writes still posted then fail.
  bool renew_on_cut_ = false;
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

  // Waiting.
  wait_kind wait_kind_ = wait_kind::sleep;
  int cq_wait_fd_ = -1;  ///< owned by the CQ
  unique_fd wake_fd_;
  std::atomic<bool> sleeping_{false};

  // Cross-thread state.
  std::mutex lifecycle_mutex_;  ///< serialises start/stop
  std::mutex fabric_mutex_;     ///< held by the progress thread for its lifetime; direct calls
                                ///< before start / after stop take it to stay exclusive
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
  peer_queues<batch_state*> pending_;             ///< batches with ops left to post: FIFO per peer,
                                                  ///< peers served round-robin one write at a time
  std::vector<op_context*> free_contexts_;
  uint32_t inflight_ = 0;
  ssize_t last_cq_error_ = 0;
  bool credit_ = true;
  immediate_counts imm_batch_;
  std::unordered_map<uint64_t, size_t> imm_index_;  ///< imm -> position in imm_batch_
};

// ---------------------------------------------------------------------------------------------
// Opening

std::string fabric_engine::init(const engine_config& cfg) {
  cfg_ = cfg;
  log_ = transport_log();
  if (cfg.max_inflight_writes == 0) {
    return "fabric.max_inflight_writes: expected a positive integer, got 0";
  }

  info_ptr hints(fi_allocinfo());
  if (!hints) return "fi_allocinfo: out of memory";
  hints->ep_attr->type = FI_EP_RDM;
  // FI_MSG keeps ofi_rxm willing to layer over tcp; we never send messages.
  hints->caps = FI_RMA | FI_MSG | FI_WRITE | FI_REMOTE_WRITE;
  hints->mode = handled_mode;
  hints->domain_attr->mr_mode = handled_mr_mode;
  // Only one thread touches the domain at a time (progress thread, or callers before start),
  // so the provider may skip its own locking.
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = ::strdup(cfg.provider.c_str());
  // The split commit needs writes placed in order: the marker after its data.
  if (cfg.provider == "tcp") hints->tx_attr->msg_order = FI_ORDER_WAW;

  fi_info* raw = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &raw);
  if (rc != 0) {
    return "fabric provider '" + cfg.provider +
           "' is not available on this machine (fi_getinfo: " + fi_strerror(-rc) + ")";
  }
  info_.reset(raw);

  // IP-addressed providers (tcp, sockets, verbs) bind to the configured interface; others (shm)
  // name endpoints themselves and get no node.
  if (is_ip_addr_format(info_->addr_format) && !cfg.address.empty()) {
    raw = nullptr;
    rc = fi_getinfo(FI_VERSION(1, 17), cfg.address.c_str(), nullptr, FI_SOURCE, hints.get(), &raw);
    if (rc != 0) {
      return "fabric provider '" + cfg.provider + "' cannot bind fabric.address '" + cfg.address +
             "' (fi_getinfo: " + fi_strerror(-rc) + ")";
    }
    info_.reset(raw);
  }

  fi_info* info = info_.get();
  provider_ = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : cfg.provider;
  mr_mode_ = info->domain_attr->mr_mode;
  if ((mr_mode_ & ~handled_mr_mode) != 0) {
    return "fabric provider '" + provider_ + "' requires mr_mode " + mr_mode_text(mr_mode_) +
           ", ferry handles only " + mr_mode_text(handled_mr_mode);
  }
  if ((info->mode & ~handled_mode) != 0) {
    return "fabric provider '" + provider_ + "' requires unsupported mode bits 0x" +
           std::to_string(info->mode & ~handled_mode);
  }
  if (info->domain_attr->cq_data_size < sizeof(uint64_t)) {
    return "fabric provider '" + provider_ + "' carries " +
           std::to_string(info->domain_attr->cq_data_size) +
           " bytes of remote CQ data, ferry needs 8";
  }
  rx_cq_data_ = (info->mode & FI_RX_CQ_DATA) != 0;
  split_commit_ = provider_.rfind("tcp", 0) == 0;
  if (split_commit_ && ((info->tx_attr->msg_order & FI_ORDER_WAW) == 0 ||
                        info->ep_attr->max_order_waw_size < (uint64_t{1} << 30))) {
    return "fabric provider '" + provider_ +
           "' does not order writes after writes (FI_ORDER_WAW), which the tcp commit needs";
  }
  // Application-chosen keys must fit the domain's key size (0 = not reported: assume 8 bytes).
  const size_t key_size = info->domain_attr->mr_key_size;
  if (key_size > 0 && key_size < sizeof(uint64_t)) key_mask_ = (uint64_t{1} << (8 * key_size)) - 1;

  fid_fabric* fabric = nullptr;
  if ((rc = fi_fabric(info->fabric_attr, &fabric, nullptr)) != 0) {
    return fi_error_text("fi_fabric", rc);
  }
  fabric_.reset(fabric);

  fid_domain* domain = nullptr;
  if ((rc = fi_domain(fabric_.get(), info, &domain, nullptr)) != 0) {
    return fi_error_text("fi_domain", rc);
  }
  domain_.reset(domain);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_UNSPEC;
  av_attr.count = 64;  // a hint only; the AV grows
  fid_av* av = nullptr;
  if ((rc = fi_av_open(domain_.get(), &av_attr, &av, nullptr)) != 0) {
    return fi_error_text("fi_av_open", rc);
  }
  av_.reset(av);

  // A split commit posts two operations per write.
  write_contexts_.resize(size_t{cfg.max_inflight_writes} * (split_commit_ ? 2 : 1));
  free_contexts_.reserve(write_contexts_.size());
  for (auto& c : write_contexts_) free_contexts_.push_back(&c);
  if (rx_cq_data_) {
    receive_contexts_.resize(rx_posted);
    for (auto& c : receive_contexts_) c.what = op_context::kind::receive;
  }

  if (auto err = open_cq(); !err.empty()) return err;

  if (auto err = open_endpoint(); !err.empty()) return err;
  renew_on_cut_ = provider_ == "shm" && (mr_mode_ & FI_MR_ENDPOINT) == 0;

  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake_fd_.get() < 0) return std::string("eventfd: ") + std::strerror(errno);

  log_->info("opened fabric provider={} fabric={} domain={} mr_mode={} threading={} wait={}{}",
             provider_, info->fabric_attr->name ? info->fabric_attr->name : "?",
             info->domain_attr->name ? info->domain_attr->name : "?", mr_mode_text(mr_mode_),
             static_cast<int>(info->domain_attr->threading),
             wait_kind_ == wait_kind::fd ? "fd" : "sleep",
             rx_cq_data_ ? " rx_cq_data=posted-receives" : "");
  return {};
}

std::string fabric_engine::open_cq() {
  fi_cq_attr attr{};
  attr.format = FI_CQ_FORMAT_DATA;
  attr.size = std::max<size_t>(1024, 2 * (write_contexts_.size() + receive_contexts_.size()));

  // Preferred: a pollable fd, so the idle loop sleeps in ppoll together with the wake eventfd.
  // FI_WAIT_UNSPEC is deliberately not used: on shm (1.17) it is a sched_yield loop whose
  // fi_cq_sread ignores the timeout and burns a core. Without an fd we poll with sleeps.
  attr.wait_obj = FI_WAIT_FD;
  fid_cq* cq = nullptr;
  int rc = fi_cq_open(domain_.get(), &attr, &cq, nullptr);
  if (rc == 0) {
    cq_.reset(cq);
    int fd = -1;
    rc = fi_control(&cq_->fid, FI_GETWAIT, &fd);
    if (rc == 0 && fd >= 0) {
      wait_kind_ = wait_kind::fd;
      cq_wait_fd_ = fd;
      return {};
    }
    log_->debug("provider={} fi_control(FI_GETWAIT) failed ({}); polling CQ without wait object",
                provider_, fi_strerror(-rc));
    cq_.reset();
  } else {
    log_->debug("provider={} has no FI_WAIT_FD CQ ({}); polling CQ without wait object", provider_,
                fi_strerror(-rc));
  }

  attr.wait_obj = FI_WAIT_NONE;
  cq = nullptr;
  if ((rc = fi_cq_open(domain_.get(), &attr, &cq, nullptr)) != 0) {
    return fi_error_text("fi_cq_open", rc);
  }
  cq_.reset(cq);
  wait_kind_ = wait_kind::sleep;
  return {};
}

std::string fabric_engine::open_endpoint() {
  fid_ep* ep = nullptr;
  int rc = fi_endpoint(domain_.get(), info_.get(), &ep, nullptr);
  if (rc != 0) return fi_error_text("fi_endpoint", rc);
  ep_.reset(ep);
  if ((rc = fi_ep_bind(ep_.get(), &av_->fid, 0)) != 0) return fi_error_text("fi_ep_bind(av)", rc);
  // FI_RECV too: arriving remote CQ data is reported on the receive side.
  if ((rc = fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return fi_error_text("fi_ep_bind(cq)", rc);
  }
  if ((rc = fi_enable(ep_.get())) != 0) return fi_error_text("fi_enable", rc);

  size_t len = 0;
  rc = fi_getname(&ep_->fid, nullptr, &len);
  if (rc != -FI_ETOOSMALL && rc != 0) return fi_error_text("fi_getname", rc);
  std::vector<uint8_t> address(len);
  if ((rc = fi_getname(&ep_->fid, address.data(), &len)) != 0) {
    return fi_error_text("fi_getname", rc);
  }
  address.resize(len);
  {
    std::lock_guard<std::mutex> lock(address_mutex_);
    address_ = std::move(address);
  }
  if (rx_cq_data_) return post_receives(receive_contexts_.size());
  return {};
}

std::string fabric_engine::post_receives(size_t count) {
  // Zero-length receives: with FI_RX_CQ_DATA each arriving remote CQ data consumes one.
  for (size_t i = 0; i < count; ++i) {
    op_context& c = receive_contexts_[i];
    ssize_t rc = fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &c.provider_scratch);
    if (rc != 0) return fi_error_text("fi_recv", rc);
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Control path

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
  std::lock_guard<std::mutex> guard(fabric_mutex_);
  return fn();
}

result<region_id> fabric_engine::register_region(void* base, uint64_t length,
                                                 region_access access) {
  return run_exclusive<result<region_id>>(
      [this, base, length, access] { return do_register_region(base, length, access); });
}

result<uint64_t> fabric_engine::choose_key() const {
  result<uint64_t> out;
  for (int i = 0; i < key_attempts; ++i) {
    const uint64_t key = random_u64() & key_mask_;
    // 0 is what an unset key looks like; FI_KEY_NOTAVAIL is reserved.
    if (key == 0 || key == FI_KEY_NOTAVAIL || issued_keys_.count(key) != 0) continue;
    out.value = key;
    return out;
  }
  out.error = "register_region: no unused memory key after " + std::to_string(key_attempts) +
              " random draws (key space of " + std::to_string(key_mask_) + ", " +
              std::to_string(issued_keys_.size()) + " keys issued)";
  return out;
}

result<region_id> fabric_engine::do_register_region(void* base, uint64_t length,
                                                    region_access access) {
  result<region_id> out;
  if (base == nullptr || length == 0) {
    out.error = "register_region: expected a non-empty region, got base=" +
                std::to_string(reinterpret_cast<uintptr_t>(base)) +
                " length=" + std::to_string(length);
    return out;
  }
  // Least privilege: FI_WRITE lets the region be the source of our writes (FI_READ the sink of
  // reads, kept for providers that check it on local descriptors); only a remote_write region
  // accepts peers' writes. No FI_REMOTE_READ: the engine issues no reads. (tcp;ofi_rxm and shm
  // on 1.17 enforce exactly these bits: see tests/fabric/test_fencing.cpp.)
  uint64_t flags = FI_WRITE | FI_READ;
  if (access == region_access::remote_write) flags |= FI_REMOTE_WRITE;
  const bool prov_key = (mr_mode_ & FI_MR_PROV_KEY) != 0;

  fid_mr* raw = nullptr;
  int rc = 0;
  for (int attempt = 0;; ++attempt) {
    // Without FI_MR_PROV_KEY the application chooses keys, unique per domain: random ones, so
    // a peer cannot guess the key of a registration it was not given.
    uint64_t requested_key = 0;
    if (!prov_key) {
      auto key = choose_key();
      if (!key) {
        out.error = key.error;
        log_->error("{}", out.error);
        return out;
      }
      requested_key = key.value;
    }
    raw = nullptr;
    rc = fi_mr_reg(domain_.get(), base, length, flags, 0, requested_key, 0, &raw, nullptr);
    // -FI_ENOKEY: the key is taken in this domain (not by us): draw another.
    if (rc == -FI_ENOKEY && !prov_key && attempt + 1 < key_attempts) continue;
    break;
  }
  if (rc != 0) {
    out.error = fi_error_text("fi_mr_reg", rc) + " (length " + std::to_string(length) + ")";
    log_->error("{}", out.error);
    return out;
  }
  region r;
  r.mr.reset(raw);
  if (mr_mode_ & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(r.mr.get(), &ep_->fid, 0)) != 0) {
      out.error = fi_error_text("fi_mr_bind", rc);
      log_->error("{}", out.error);
      return out;
    }
    if ((rc = fi_mr_enable(r.mr.get())) != 0) {
      out.error = fi_error_text("fi_mr_enable", rc);
      log_->error("{}", out.error);
      return out;
    }
  }
  const uint64_t key = fi_mr_key(r.mr.get());
  if (key == FI_KEY_NOTAVAIL) {
    out.error = "fi_mr_key: key not available (provider needs FI_MR_RAW, unsupported)";
    log_->error("{}", out.error);
    return out;
  }
  if (prov_key && issued_keys_.count(key) != 0) {
    // The provider recycled the key of a closed registration: a fenced peer holding the old
    // key could write into this one. Nothing in the contract lets us prevent it here.
    log_->warn("provider {} reissued memory key {:#x} of a closed registration", provider_, key);
  }
  issued_keys_.insert(key);
  r.base = base;
  r.length = length;
  r.desc = (mr_mode_ & FI_MR_LOCAL) ? fi_mr_desc(r.mr.get()) : nullptr;
  r.remote.remote_base = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(base) : 0;
  r.remote.key = key;
  r.remote.length = length;

  std::lock_guard<std::mutex> lock(regions_mutex_);
  out.value = static_cast<region_id>(regions_.size());
  regions_.push_back(std::move(r));
  log_->debug("registered region={} length={} access={} key={:#x}", out.value, length,
              access == region_access::remote_write ? "remote_write" : "local", key);
  return out;
}

void fabric_engine::register_regions(std::vector<region_request> regions,
                                     std::function<void(result<std::vector<region_id>>)> done) {
  run_queued([this, regions = std::move(regions), done = std::move(done)]() mutable {
    result<std::vector<region_id>> out;
    for (const auto& q : regions) {
      auto r = do_register_region(q.base, q.length, q.access);
      if (!r) {
        for (auto id : out.value) do_deregister_region(id);
        out.value.clear();
        out.error = std::move(r.error);
        break;
      }
      out.value.push_back(r.value);
    }
    invoke_callback(*log_, "register_regions", done, std::move(out));
  });
}

result<bool> fabric_engine::deregister_region(region_id id) {
  return run_exclusive<result<bool>>([this, id] { return do_deregister_region(id); });
}

result<bool> fabric_engine::do_deregister_region(region_id id) {
  result<bool> out;
  if (id >= regions_.size()) {
    out.error = "deregister_region: unknown region " + std::to_string(id) + " (never registered)";
    log_->warn("{}", out.error);
    return out;
  }
  region& r = regions_[id];
  if (r.deregistered) {
    log_->warn("deregister_region: region {} is already deregistered; ignored", id);
    out.value = false;
    return out;
  }
  {
    std::lock_guard<std::mutex> lock(regions_mutex_);
    r.deregistered = true;
    r.remote = region_desc{};
  }
  out.value = true;
  // Posted writes from this region hold its local descriptor where the provider needs one;
  // closing the MR under them is undefined. Without FI_MR_LOCAL the provider reads the memory
  // directly and the MR only admits remote writes: close it now, which is the fence.
  if ((mr_mode_ & FI_MR_LOCAL) != 0 && r.posted > 0) {
    log_->debug("deregistered region={}; MR closes after its {} posted writes complete", id,
                r.posted);
    return out;
  }
  out.error = close_region_mr(id);
  return out;
}

std::string fabric_engine::close_region_mr(region_id id) {
  region& r = regions_[id];
  if (!r.mr) return {};
  fid_mr* mr = r.mr.release();
  const int rc = fi_close(&mr->fid);
  if (rc != 0) {
    // The provider still knows the key: writes with it keep landing. Loud, and surfaced.
    const std::string why = fi_error_text("fi_close(mr)", rc) + " (region " + std::to_string(id) +
                            "): the registration stays open in the provider";
    log_->error("{}", why);
    return why;
  }
  log_->debug("deregistered region={} (MR closed)", id);
  return {};
}

region_desc fabric_engine::describe(region_id id) const {
  std::lock_guard<std::mutex> lock(regions_mutex_);
  if (id >= regions_.size()) return {};
  return regions_[id].remote;  // zeroed on deregistration
}

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
  if (address.empty()) {
    out.error = "insert_peer: empty fabric address";
    return out;
  }
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
    out.error = rc < 0 ? fi_error_text("fi_av_insert", rc)
                       : "fi_av_insert: address of " + std::to_string(address.size()) +
                             " bytes rejected by provider " + provider_;
    log_->error("{}", out.error);
    return out;
  }
  peers_[addr] = peer_entry{1, address};
  removed_peers_.erase(addr);
  out.value = addr;
  log_->debug("inserted peer={}", addr);
  return out;
}

void fabric_engine::run_queued(std::function<void()> task) {
  if (on_progress_thread()) return task();
  {
    std::unique_lock<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::running) {
      // Asynchronous: the caller must not block on the fabric; FIFO order with submissions
      // makes everything submitted before this call see the task's effect.
      queue_.push_back(work_item{nullptr, std::move(task)});
      queue_nonempty_.store(true);
      lock.unlock();
      wake();
      return;
    }
  }
  std::lock_guard<std::mutex> guard(fabric_mutex_);
  task();
}

void fabric_engine::remove_peer(peer_handle peer) {
  run_queued([this, peer] { do_remove_peer(peer); });
}

void fabric_engine::fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                               std::function<void()> done) {
  run_queued([this, peer, regions = std::move(regions), done = std::move(done)]() mutable {
    do_fence_peer(peer, regions);
    invoke_callback(*log_, "fence_peer", done);
  });
}

void fabric_engine::do_fence_peer(std::optional<peer_handle> peer,
                                  const std::vector<region_id>& regions) {
  // One task, no completion read in between: once the keys are closed, the connection is cut
  // before the provider can place another byte of a write it had begun to receive.
  for (auto id : regions)
    if (auto r = do_deregister_region(id); !r)
      log_->error("fence: closing region {} failed: {}", id, r.error);
  if (peer) do_remove_peer(*peer);
}

void fabric_engine::do_remove_peer(peer_handle peer) {
  const std::string why = "peer removed (peer " + std::to_string(peer) + ")";
  std::vector<batch_state*> touched;
  pending_.for_each([&](batch_state* b) {
    if (b->batch.peer == peer) {
      b->abort_unposted(why);
      touched.push_back(b);
    }
  });
  pending_.erase_if([](batch_state* b) { return b->all_posted(); });
  for (batch_state* b : touched) b->in_pending = false;
  // Posted writes to the peer complete (or fail) through the CQ as the provider decides.
  for (batch_state* b : touched) maybe_finish(b);

  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    log_->warn("remove_peer: peer={} is not inserted", peer);
    return;
  }
  if (renew_on_cut_ && it->second.writes_posted > 0) request_renewal(peer);
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

void fabric_engine::submit(write_batch batch) {
  auto b = std::make_unique<batch_state>(std::move(batch));
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::idle || state_ == run_state::running) {
      queue_.push_back(work_item{std::move(b), nullptr});
      queue_nonempty_.store(true);
    }
  }
  if (b) {
    // Stopped: nobody will post it; fail here, on the caller's thread.
    b->abort_unposted(stopped_text);
    invoke_callback(*log_, "batch_done", b->batch.done, std::move(b->result));
    return;
  }
  wake();
}

void fabric_engine::return_immediate_credit() {
  credit_returned_.store(true);
  wake();
}

void fabric_engine::wake() {
  // Pairs with the sleeping_ store / queue re-check in block(): one of the two sides always sees
  // the other (both seq_cst), so a wake-up is never lost and the common case costs no syscall.
  if (sleeping_.load()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  }
}

void fabric_engine::start(std::function<void(immediate_counts)> immediates) {
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (state_ != run_state::idle) {
      log_->warn("engine::start called twice or after stop; ignored");
      return;
    }
    state_ = run_state::running;
  }
  immediates_ = std::move(immediates);
  // The thread takes fabric_mutex_ before touching anything; direct callers cannot interleave
  // because state_ is already running.
  thread_ = std::thread([this] { run(); });
}

void fabric_engine::stop() {
  if (on_progress_thread()) {
    // From a callback: the thread cannot join itself; it winds down after this iteration and
    // the destructor joins it.
    stop_requested_.store(true);
    return;
  }
  std::lock_guard<std::mutex> lifecycle(lifecycle_mutex_);
  std::deque<work_item> never_started;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (state_ == run_state::idle) {
      state_ = run_state::stopped;
      never_started.swap(queue_);
    }
  }
  if (thread_.joinable()) {
    stop_requested_.store(true);
    wake();
    thread_.join();
  }
  // Work queued before a start that never came: fail batches, run commands directly.
  std::lock_guard<std::mutex> guard(fabric_mutex_);
  for (auto& item : never_started) {
    if (item.batch) {
      item.batch->abort_unposted(stopped_text);
      invoke_callback(*log_, "batch_done", item.batch->batch.done, std::move(item.batch->result));
    } else if (item.task) {
      item.task();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Progress thread

void fabric_engine::run() {
  std::lock_guard<std::mutex> exclusive(fabric_mutex_);
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
    raw->abort_unposted("peer removed (peer " + std::to_string(peer) + ")");
  } else if (peers_.count(peer) == 0) {
    raw->abort_unposted("unknown peer " + std::to_string(peer) + " (not inserted)");
  }
  if (raw->all_posted()) {
    maybe_finish(raw);  // empty or rejected: done right away
  } else {
    raw->in_pending = true;
    pending_.push(peer, raw);
  }
}

bool fabric_engine::post_writes() {
  bool posted_any = false;
  if (renew_pending_) return false;  // held until the endpoint is renewed
  while (inflight_ < write_contexts_.size() && !pending_.empty()) {
    batch_state* b = pending_.front();
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
      ++b->next;
      posted_any = true;
      pending_.next_turn();
      continue;
    }
    if (r != nullptr && r->deregistered) {
      b->abort_unposted("invalid write: local region " + std::to_string(op.local_region) +
                        " is deregistered");
      continue;
    }
    if (r == nullptr || op.length == 0 || op.local_offset > r->length ||
        op.length > r->length - op.local_offset) {
      b->abort_unposted("invalid write: local region " + std::to_string(op.local_region) +
                        " offset " + std::to_string(op.local_offset) + " length " +
                        std::to_string(op.length) + " is outside the registered regions");
      continue;
    }
    if (!post_one(b, op, *r, false)) break;
    posted_any = true;
    if (split_commit_ && !b->all_posted()) {
      b->marker_pending = true;  // the marker goes next, before any other write of this peer
      continue;
    }
    ++b->next;
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
  if (rc == -FI_EAGAIN) return false;  // provider queue full: progress the CQ, retry next round
  if (rc != 0) {
    const std::string why = fi_error_text(call, rc) + " (peer " + std::to_string(b->batch.peer) +
                            ", length " + std::to_string(op.length) + ")";
    log_->error("{}", why);
    b->abort_unposted(why);  // a data part already posted completes on its own
    return true;
  }
  free_contexts_.pop_back();
  if (renew_on_cut_)
    if (auto p = peers_.find(b->batch.peer); p != peers_.end()) ++p->second.writes_posted;
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
    const std::string why = std::string("write completion error: ") + fi_strerror(err.err) +
                            " (prov_errno " + std::to_string(err.prov_errno) + ": " +
                            (prov_text ? prov_text : "?") + ")";
    // Warn once per batch (its first failure); a dead peer can fail thousands of writes.
    const bool first = ctx->batch != nullptr && ctx->batch->result.ok;
    log_->log(first ? spdlog::level::warn : spdlog::level::debug, "{} peer={}", why,
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

void fabric_engine::complete_op(op_context* ctx, bool ok, const std::string& why) {
  batch_state* b = ctx->batch;
  ctx->batch = nullptr;
  free_contexts_.push_back(ctx);
  --inflight_;
  region& r = regions_[ctx->source];
  if (--r.posted == 0 && r.deregistered && r.mr) close_region_mr(ctx->source);  // deferred close
  if (b == nullptr) return;
  --b->outstanding;
  // A write counts once: by its marker in a split commit (the data part only reports errors).
  const bool counts = !split_commit_ || ctx->marker;
  if (ok) {
    if (counts) ++b->result.completed;
  } else {
    if (counts) {
      b->fail(1, why);
    } else {
      b->result.ok = false;
      if (b->result.error.empty()) b->result.error = why;
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
    const clock_type::duration cap =
        idle_for < recent_window ? clock_type::duration(sleep_cap_recent)
        : idle_for < warm_window ? clock_type::duration(sleep_cap_warm)
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

void fabric_engine::request_renewal(peer_handle peer) {
  for (auto& [addr, e] : peers_) e.writes_posted = 0;  // the new endpoint has sent nothing yet
  if (renew_pending_) return;
  renew_pending_ = true;
  renew_deadline_ = clock_type::now() + renew_wait;
  renew_reason_ = "peer " + std::to_string(peer) + " was cut";
  log_->info(
      "shm: peer={} was cut after this endpoint wrote to it; holding new writes until the "
      "endpoint is renewed ({} in flight)",
      peer, inflight_);
}

void fabric_engine::renew_endpoint() {
  renew_pending_ = false;
  // Closing the endpoint ends what its peers never answered; completions it had already
  // queued are read first, so only writes that truly never completed fail.
  ep_.reset();
  for (int i = 0; i < 64 && read_completions() > 0; ++i) {
  }
  const std::string why = "fabric endpoint renewed (" + renew_reason_ +
                          ", which may have fenced this endpoint): write never completed";
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
  std::string err = open_cq();
  if (err.empty()) err = open_endpoint();
  if (!err.empty()) {
    // Without an endpoint nothing can be sent: fail what waits, and stop.
    log_->error("shm endpoint renewal failed: {}; the engine stops", err);
    stop_requested_.store(true);
    return;
  }
  log_->info("shm endpoint renewed after {}: {} write(s) that never completed failed",
             renew_reason_, failed);
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
  std::vector<batch_state*> to_finish = pending_.take_all();
  for (batch_state* b : to_finish) {
    b->abort_unposted(stopped_text);
    b->in_pending = false;
  }
  for (batch_state* b : to_finish) maybe_finish(b);

  // Posted writes reference memory the caller may free once done() ran: wait (bounded) for the
  // provider to finish with them, progressing the CQ.
  const auto deadline = clock_type::now() + stop_drain_limit;
  while (inflight_ > 0 && clock_type::now() < deadline) {
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
    owned->fail(owned->outstanding, stopped_text);
    owned->abort_unposted(stopped_text);
    owned->outstanding = 0;
    invoke_callback(*log_, "batch_done", owned->batch.done, std::move(owned->result));
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    state_ = run_state::stopped;
  }
}

}  // namespace

/// The shm provider names its files /dev/shm/<pid>:<domain>:<endpoint> and reuses one that
/// exists. A file left by a crashed process whose pid we now have would be mapped as ours (seen:
/// SIGBUS), so remove every file with our own pid's prefix before opening: no live process can
/// own it.
void remove_stale_shm_files() {
  const std::string prefix = std::to_string(getpid()) + ":";
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const auto name = f.path().filename().string();
    if (name.rfind(prefix, 0) == 0) {
      std::filesystem::remove(f.path(), ec);
      transport_log()->warn(
          "removed stale shm provider file {} (left by an earlier process "
          "with this pid)",
          f.path().string());
    }
  }
}

/// Why shm would copy writes piecewise (its SAR protocol) instead of with cross-memory attach
/// (process_vm_writev), or "" when CMA is available. Piecewise copies reopen the window the
/// fence closes: a write could land partly before and partly after it.
std::string shm_without_cma() {
  if (const char* v = std::getenv("FI_SHM_DISABLE_CMA")) {
    const std::string s = v;
    if (s == "1" || s == "yes" || s == "true" || s == "on")
      return "FI_SHM_DISABLE_CMA=" + s + " is set";
  }
  int scope = 0;
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(f, "%d", &scope) != 1) scope = 0;
    std::fclose(f);
  }
  if (scope >= 3) return "kernel.yama.ptrace_scope is 3 (no process may attach to another)";
  if (scope >= 1) {
    // Scope 1 and 2 still let a process with CAP_SYS_PTRACE attach to its peers.
    uint64_t caps = 0;
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "CapEff: %lx", &caps) == 1) break;
      std::fclose(f);
    }
    if ((caps & (uint64_t{1} << 19)) == 0)  // CAP_SYS_PTRACE
      return "kernel.yama.ptrace_scope is " + std::to_string(scope) +
             " and ferryd lacks CAP_SYS_PTRACE, so it cannot attach to its peers";
  }
  return {};
}

result<std::unique_ptr<engine>> engine::open(const engine_config& cfg) {
  result<std::unique_ptr<engine>> out;
  if (cfg.provider == "shm") {
    if (auto why = shm_without_cma(); !why.empty()) {
      out.error = "fabric provider 'shm' needs cross-memory attach (process_vm_writev), and " +
                  why +
                  ": without it shm copies writes piecewise and a fenced peer's write could "
                  "land after its room failed; use tcp, or allow CMA (ptrace_scope 0, or "
                  "CAP_SYS_PTRACE)";
      transport_log()->error("engine::open provider=shm: {}", out.error);
      return out;
    }
    remove_stale_shm_files();
  }
  auto e = std::make_unique<fabric_engine>();
  std::string err = e->init(cfg);
  if (!err.empty()) {
    transport_log()->error("engine::open provider={}: {}", cfg.provider, err);
    out.error = std::move(err);
    return out;
  }
  out.value = std::move(e);
  return out;
}

}  // namespace ferry::transport

#if defined(__SANITIZE_ADDRESS__)
#define FERRY_LSAN_HOOK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_LSAN_HOOK 1
#endif
#endif
#ifdef FERRY_LSAN_HOOK
// LeakSanitizer suppressions compiled into every sanitized binary that links the engine (tests,
// ferryd, tools), so they hold however the binary is started. One entry, for a leak inside
// libfabric 1.17 that Ferry cannot reach: the tcp provider fi_dupinfo()s a connection request's
// fi_info while progress runs (seen under fi_trywait), and when the endpoint is closed before
// rxm has consumed that request the copy is never freed. It shows under CPU load, about one run
// in 40, in "fabric engine stop fails queued batches (tcp)". libfabric has no frame pointers, so
// the report's stack is only malloc <- fi_dupinfo and nothing narrower can be matched. The entry
// would also hide an fi_info list from fi_getinfo that Ferry forgot to free (libfabric builds
// those with fi_dupinfo); Ferry holds every one in an info_ptr (fabric_handles.hpp), which frees
// it. Leaks reachable only from a suppressed block are not reported either.
extern "C" const char* __lsan_default_suppressions() { return "leak:fi_dupinfo\n"; }
#endif
