// Opening the libfabric objects (fi_getinfo, fabric, domain, AV, CQ, endpoint, posted receives)
// and engine::open. Closing them is the handles' job (fabric_handles.hpp), in the member order
// of fabric_engine.hpp.
//
// The process-wide settings below (FI_AV_REMOVE_CLEANUP, the LeakSanitizer suppressions) live
// in this file because it holds engine::open, which every binary that uses the engine calls. The
// linker takes an object file out of a static library only to resolve a symbol used and not yet
// defined; these two define none (the sanitizer runtime has its own weak
// __lsan_default_suppressions), so in a file of their own they would silently be left out.
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/cma_check.hpp"
#include "transport/fabric_engine.hpp"
#include "transport/rail_engine.hpp"
#include "transport/shm_files.hpp"

namespace ferry::transport {
namespace detail {
namespace {

/// mr_mode bits the engine knows how to honour (requested in the hints, checked on read-back).
constexpr uint64_t handled_mr_mode =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
/// Mode bits the engine supports: its contexts start with an fi_context2, and it can pre-post
/// receives for providers that consume one per arriving remote CQ data.
constexpr uint64_t handled_mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;

/// Receives kept posted when the provider needs FI_RX_CQ_DATA.
constexpr size_t rx_posted = 256;

/// libfabric 1.17's ofi_rxm closes its connection to a peer in fi_av_remove only when
/// FI_AV_REMOVE_CLEANUP=1 was in the environment at the process's first libfabric call; the
/// fence (fence_peer) depends on that cut. Set it when this library is loaded, before main.
const bool av_remove_cleanup_set = [] { return ::setenv("FI_AV_REMOVE_CLEANUP", "1", 1) == 0; }();

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

}  // namespace

result<> fabric_engine::init(const engine_config& cfg, std::string label, bool express) {
  cfg_ = cfg;
  label_ = std::move(label);
  express_ = express;
  log_ = transport_log();
  if (cfg.max_inflight_writes == 0) {
    return error{errc::config_invalid,
                 "fabric.max_inflight_writes: expected a positive integer, got 0"};
  }

  info_ptr hints(fi_allocinfo());
  if (!hints) return error{errc::system_error, "fi_allocinfo: out of memory"};
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
    return error{errc::fabric_unavailable,
                 "fabric provider '" + cfg.provider +
                     "' is not available on this machine (fi_getinfo: " + fi_strerror(-rc) + ")"};
  }
  info_.reset(raw);

  // IP-addressed providers (tcp, sockets, verbs) bind to the configured interface; others (shm)
  // name endpoints themselves and get no node.
  if (is_ip_addr_format(info_->addr_format) && !cfg.address.empty()) {
    raw = nullptr;
    rc = fi_getinfo(FI_VERSION(1, 17), cfg.address.c_str(), nullptr, FI_SOURCE, hints.get(), &raw);
    if (rc != 0) {
      return error{errc::fabric_unavailable, "fabric provider '" + cfg.provider +
                                                 "' cannot bind fabric.address '" + cfg.address +
                                                 "' (fi_getinfo: " + fi_strerror(-rc) + ")"};
    }
    info_.reset(raw);
  }

  fi_info* info = info_.get();
  provider_ = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : cfg.provider;
  mr_mode_ = info->domain_attr->mr_mode;
  if ((mr_mode_ & ~handled_mr_mode) != 0) {
    return error{errc::fabric_unavailable, "fabric provider '" + provider_ + "' requires mr_mode " +
                                               mr_mode_text(mr_mode_) + ", ferry handles only " +
                                               mr_mode_text(handled_mr_mode)};
  }
  if ((info->mode & ~handled_mode) != 0) {
    return error{errc::fabric_unavailable, "fabric provider '" + provider_ +
                                               "' requires unsupported mode bits 0x" +
                                               std::to_string(info->mode & ~handled_mode)};
  }
  if (info->domain_attr->cq_data_size < sizeof(uint64_t)) {
    return error{errc::fabric_unavailable, "fabric provider '" + provider_ + "' carries " +
                                               std::to_string(info->domain_attr->cq_data_size) +
                                               " bytes of remote CQ data, ferry needs 8"};
  }
  rx_cq_data_ = (info->mode & FI_RX_CQ_DATA) != 0;
  split_commit_ = provider_.rfind("tcp", 0) == 0;
  if (split_commit_ && ((info->tx_attr->msg_order & FI_ORDER_WAW) == 0 ||
                        info->ep_attr->max_order_waw_size < (uint64_t{1} << 30))) {
    return error{
        errc::fabric_unavailable,
        "fabric provider '" + provider_ +
            "' does not order writes after writes (FI_ORDER_WAW), which the tcp commit needs"};
  }
  // Application-chosen keys must fit the domain's key size (0 = not reported: assume 8 bytes).
  const size_t key_size = info->domain_attr->mr_key_size;
  if (key_size > 0 && key_size < sizeof(uint64_t)) key_mask_ = (uint64_t{1} << (8 * key_size)) - 1;

  fid_fabric* fabric = nullptr;
  if ((rc = fi_fabric(info->fabric_attr, &fabric, nullptr)) != 0) {
    return fi_error("fi_fabric", rc, errc::fabric_unavailable);
  }
  fabric_.reset(fabric);

  fid_domain* domain = nullptr;
  if ((rc = fi_domain(fabric_.get(), info, &domain, nullptr)) != 0) {
    return fi_error("fi_domain", rc, errc::fabric_unavailable);
  }
  domain_.reset(domain);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_UNSPEC;
  av_attr.count = 64;  // a hint only; the AV grows
  fid_av* av = nullptr;
  if ((rc = fi_av_open(domain_.get(), &av_attr, &av, nullptr)) != 0) {
    return fi_error("fi_av_open", rc, errc::fabric_unavailable);
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

  if (auto cq = open_cq(); !cq) return cq;

  if (auto ep = open_endpoint(); !ep) return ep;
  renew_on_cut_ = provider_ == "shm" && (mr_mode_ & FI_MR_ENDPOINT) == 0;

  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake_fd_.get() < 0)
    return error{errc::system_error, std::string("eventfd: ") + std::strerror(errno)};

  log_->info(
      "opened fabric rail={} provider={} fabric={} domain={} mr_mode={} threading={} wait={}{}",
      label_, provider_, info->fabric_attr->name ? info->fabric_attr->name : "?",
      info->domain_attr->name ? info->domain_attr->name : "?", mr_mode_text(mr_mode_),
      static_cast<int>(info->domain_attr->threading), wait_kind_ == wait_kind::fd ? "fd" : "sleep",
      rx_cq_data_ ? " rx_cq_data=posted-receives" : "");
  return {};
}

result<> fabric_engine::open_cq() {
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
    return fi_error("fi_cq_open", rc, errc::fabric_unavailable);
  }
  cq_.reset(cq);
  wait_kind_ = wait_kind::sleep;
  return {};
}

result<> fabric_engine::open_endpoint() {
  // tcp binds its listener to port 0 with SO_REUSEADDR, as it does its connections: the kernel
  // may then hand it the local port of one of them, and fi_endpoint or fi_enable fails with
  // EADDRINUSE (seen under a loaded ctest -j2). Each attempt gets a new port from the kernel.
  constexpr int attempts = 8;
  int rc = 0;
  for (int attempt = 1;; ++attempt) {
    const char* call = "fi_endpoint";
    fid_ep* ep = nullptr;
    rc = fi_endpoint(domain_.get(), info_.get(), &ep, nullptr);
    if (rc == 0) {
      ep_.reset(ep);
      if ((rc = fi_ep_bind(ep_.get(), &av_->fid, 0)) != 0)
        return fi_error("fi_ep_bind(av)", rc, errc::fabric_unavailable);
      // FI_RECV too: arriving remote CQ data is reported on the receive side.
      if ((rc = fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0)
        return fi_error("fi_ep_bind(cq)", rc, errc::fabric_unavailable);
      call = "fi_enable";
      rc = fi_enable(ep_.get());
      if (rc == 0) break;
      ep_.reset();
    }
    if (rc != -FI_EADDRINUSE || attempt == attempts)
      return fi_error(call, rc, errc::fabric_unavailable);
    log_->info("rail {}: {}: the port the kernel gave is in use; another (attempt {} of {})",
               label_, call, attempt + 1, attempts);
  }

  size_t len = 0;
  rc = fi_getname(&ep_->fid, nullptr, &len);
  if (rc != -FI_ETOOSMALL && rc != 0) return fi_error("fi_getname", rc, errc::fabric_unavailable);
  std::vector<uint8_t> address(len);
  if ((rc = fi_getname(&ep_->fid, address.data(), &len)) != 0) {
    return fi_error("fi_getname", rc, errc::fabric_unavailable);
  }
  address.resize(len);
  {
    std::lock_guard<std::mutex> lock(address_mutex_);
    address_ = std::move(address);
  }
  if (rx_cq_data_) return post_receives(receive_contexts_.size());
  return {};
}

result<> fabric_engine::post_receives(size_t count) {
  // Zero-length receives: with FI_RX_CQ_DATA each arriving remote CQ data consumes one.
  for (size_t i = 0; i < count; ++i) {
    op_context& c = receive_contexts_[i];
    ssize_t rc = fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &c.provider_scratch);
    if (rc != 0) return fi_error("fi_recv", rc, errc::fabric_unavailable);
  }
  return {};
}

}  // namespace detail

using detail::fabric_engine;
using detail::rail_engine;

result<std::unique_ptr<engine>> engine::open(const engine_config& cfg) {
  // Logged for every provider, so an operator sees what a switch to shm would meet.
  const auto cma = check_cma();
  transport_log()->info("{}", cma.describe());
  if (cfg.provider == "shm") {
    if (auto why = cma.why_not(); !why.empty()) {
      const error refused{errc::fabric_unavailable,
                          "fabric provider 'shm' needs cross-memory attach (process_vm_writev), "
                          "and " +
                              why +
                              ": without it shm copies writes piecewise and a fenced peer's "
                              "write could land after its room failed; use tcp, or allow CMA "
                              "(ptrace_scope 0, or CAP_SYS_PTRACE)"};
      transport_log()->error("engine::open provider=shm: {}", refused.message);
      return refused;
    }
    remove_stale_shm_files();
  }
  if (cfg.rails == 0) {
    const error refused{errc::config_invalid,
                        "fabric.rails: expected 1 to " + std::to_string(max_rails) + ", got 0"};
    transport_log()->error("engine::open: {}", refused.message);
    return refused;
  }
  auto opened = [&]() -> result<std::unique_ptr<engine>> {
    // One endpoint: the plain engine, with nothing between it and its callers.
    if (cfg.rails == 1 && cfg.express_bytes == 0) {
      auto e = std::make_unique<fabric_engine>();
      if (auto r = e->init(cfg); !r) return std::move(r).error();
      return std::unique_ptr<engine>(std::move(e));
    }
    auto e = std::make_unique<rail_engine>();
    if (auto r = e->init(cfg); !r) return std::move(r).error();
    return std::unique_ptr<engine>(std::move(e));
  }();
  if (!opened) transport_log()->error("engine::open provider={}: {}", cfg.provider, opened.message);
  return opened;
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
