#pragma once
/// What the raw-fabric baseline (raw_fabric.cpp) and the raw latency reference (raw_latency.cpp)
/// share: their own minimal RAII over libfabric, one RDM endpoint with a CQ and one registered
/// buffer, and the framed messages their two processes exchange on a stream socket. Like the
/// rest of raw_fabric.*, it shares no code with Ferry's transport on purpose, so the reference
/// cannot be flattered (or slowed) by Ferry's own code; errors are texts.
///
/// Not thread-safe: one endpoint per thread, except that the latency reference reads its socket
/// on another thread than the one driving the endpoint (raw_latency.cpp).

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench/raw_fabric.hpp"

namespace ferry::bench::raw_detail {

using clock_type = std::chrono::steady_clock;

// Members of raw_endpoint are declared in open order so they close ep, cq, mr, av, domain,
// fabric.
template <class T>
struct closer {
  void operator()(T* p) const noexcept {
    if (p != nullptr) fi_close(&p->fid);
  }
};
template <class T>
using owned = std::unique_ptr<T, closer<T>>;
struct info_freer {
  void operator()(fi_info* p) const noexcept {
    if (p != nullptr) fi_freeinfo(p);
  }
};

/// "call: fi_strerror(rc)".
std::string fi_text(const char* call, long long rc);

// ----- socket messages -----------------------------------------------------------------------

inline constexpr uint32_t magic = 0x57415246;  // "FRAW"
/// hello/start/done: the baseline; hello/ready/go/bye: the latency reference; error: either.
enum class msg_kind : uint32_t {
  hello = 1,
  start = 2,
  done = 3,
  error = 4,
  ready = 5,
  go = 6,
  bye = 7
};

struct msg_header {
  uint32_t magic;
  uint32_t kind;
  uint64_t length;
};
struct hello_body {
  uint64_t key;
  uint64_t remote_base;
  uint64_t length;
};
struct start_body {
  uint64_t expected;  ///< remote CQ data entries the target is to count
};
struct grant_body {
  uint64_t room;  ///< the paced baseline's `go`: this room may go (raw_options::room_writes)
};
struct done_body {
  uint64_t writes;
  uint64_t checksum;
};

std::string send_all(int fd, const void* data, size_t len);
/// One message: header, body, then `extra` (e.g. a fabric address after a hello).
std::string send_msg(int fd, msg_kind kind, const void* body, size_t len,
                     const void* extra = nullptr, size_t extra_len = 0);
/// Best effort: tell the peer process why this one stops.
void send_error(int fd, const std::string& text);
int remaining_ms(clock_type::time_point deadline);
std::string recv_all(int fd, void* data, size_t len, clock_type::time_point deadline);
/// Receive one message; an `error` message from the peer becomes the returned error.
std::string recv_msg(int fd, msg_kind expected, std::string& body, clock_type::time_point deadline);
/// Receive one message of either kind `a` or `b`; its kind in `kind`.
std::string recv_either(int fd, msg_kind a, msg_kind b, msg_kind& kind, std::string& body,
                        clock_type::time_point deadline);

// ----- endpoint ------------------------------------------------------------------------------

/// One RDM endpoint, its CQ (FI_WAIT_FD where the provider offers it, else none) and one
/// registered buffer.
struct raw_endpoint {
  std::unique_ptr<fi_info, info_freer> info;
  owned<fid_fabric> fabric;
  owned<fid_domain> domain;
  owned<fid_av> av;
  owned<fid_mr> mr;
  owned<fid_cq> cq;
  owned<fid_ep> ep;
  int cq_fd = -1;  ///< FI_WAIT_FD fd (owned by the CQ), or -1: poll with sleeps
  void* desc = nullptr;
  uint64_t mr_mode = 0;
  clock_type::duration sleep_step{};

  /// Open on `o.provider`; the error text names the call that failed.
  std::string open(const raw_options& o);
  std::string register_buffer(void* base, uint64_t length);
  /// This endpoint's fabric address.
  std::vector<uint8_t> name() const;
  /// The text of the CQ's error entry.
  std::string cq_error();
  /// The baseline's idle wait: until the CQ may have entries, `sock` is readable, or a short
  /// timeout. Returns true if `sock` is readable.
  bool wait(int sock);
};

}  // namespace ferry::bench::raw_detail
