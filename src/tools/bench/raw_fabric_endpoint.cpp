// The raw-fabric pieces shared by the baseline and the latency reference
// (raw_fabric_endpoint.hpp).
#include "tools/bench/raw_fabric_endpoint.hpp"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry::bench::raw_detail {

std::string fi_text(const char* call, long long rc) {
  return std::string(call) + ": " + fi_strerror(static_cast<int>(rc < 0 ? -rc : rc));
}

std::string send_all(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::string("send: ") + std::strerror(errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return {};
}

std::string send_msg(int fd, msg_kind kind, const void* body, size_t len, const void* extra,
                     size_t extra_len) {
  msg_header h{magic, static_cast<uint32_t>(kind), len + extra_len};
  if (auto e = send_all(fd, &h, sizeof h); !e.empty()) return e;
  if (len > 0) {
    if (auto e = send_all(fd, body, len); !e.empty()) return e;
  }
  if (extra_len > 0) return send_all(fd, extra, extra_len);
  return {};
}

void send_error(int fd, const std::string& text) {
  send_msg(fd, msg_kind::error, text.data(), text.size());  // best effort
}

int remaining_ms(clock_type::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
  return static_cast<int>(std::max<long long>(0, left.count()));
}

std::string recv_all(int fd, void* data, size_t len, clock_type::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return "timed out waiting for the peer process";
    if (rc < 0) return std::string("poll: ") + std::strerror(errno);
    ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return "peer process closed the socket";
    if (n < 0) return std::string("recv: ") + std::strerror(errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return {};
}

/// Receive one message; an `error` message from the peer becomes the returned error.
std::string recv_either(int fd, msg_kind a, msg_kind b, msg_kind& kind, std::string& body,
                        clock_type::time_point deadline) {
  msg_header h{};
  if (auto e = recv_all(fd, &h, sizeof h, deadline); !e.empty()) return e;
  if (h.magic != magic || h.length > (1u << 20)) return "malformed message from peer process";
  body.resize(h.length);
  if (auto e = recv_all(fd, body.data(), body.size(), deadline); !e.empty()) return e;
  if (h.kind == static_cast<uint32_t>(msg_kind::error)) return "peer process failed: " + body;
  if (h.kind != static_cast<uint32_t>(a) && h.kind != static_cast<uint32_t>(b))
    return "unexpected message from peer process";
  kind = static_cast<msg_kind>(h.kind);
  return {};
}

std::string recv_msg(int fd, msg_kind expected, std::string& body,
                     clock_type::time_point deadline) {
  msg_kind kind{};
  return recv_either(fd, expected, expected, kind, body, deadline);
}

// ----- endpoint ------------------------------------------------------------------------------

std::string raw_endpoint::open(const raw_options& o) {
  std::unique_ptr<fi_info, info_freer> hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_MSG | FI_WRITE | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = ::strdup(o.provider.c_str());
  fi_info* raw = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &raw);
  if (rc != 0) {
    return "fabric provider '" + o.provider + "' is not available on this machine (" +
           fi_text("fi_getinfo", rc) + ")";
  }
  info.reset(raw);
  const uint32_t fmt = info->addr_format;
  if ((fmt == FI_SOCKADDR || fmt == FI_SOCKADDR_IN || fmt == FI_SOCKADDR_IN6) &&
      !o.address.empty()) {
    raw = nullptr;
    rc = fi_getinfo(FI_VERSION(1, 17), o.address.c_str(), nullptr, FI_SOURCE, hints.get(), &raw);
    if (rc != 0) return "address " + o.address + ": " + fi_text("fi_getinfo", rc);
    info.reset(raw);
  }
  mr_mode = info->domain_attr->mr_mode;

  fid_fabric* f = nullptr;
  if ((rc = fi_fabric(info->fabric_attr, &f, nullptr)) != 0) return fi_text("fi_fabric", rc);
  fabric.reset(f);
  fid_domain* d = nullptr;
  if ((rc = fi_domain(fabric.get(), info.get(), &d, nullptr)) != 0) {
    return fi_text("fi_domain", rc);
  }
  domain.reset(d);
  fi_av_attr av_attr{};
  fid_av* a = nullptr;
  if ((rc = fi_av_open(domain.get(), &av_attr, &a, nullptr)) != 0) {
    return fi_text("fi_av_open", rc);
  }
  av.reset(a);

  // FI_WAIT_FD where offered (tcp); shm's FI_WAIT_UNSPEC sread ignores its timeout, so
  // providers without an fd get FI_WAIT_NONE and a sleep backoff.
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = 4096;
  cq_attr.wait_obj = FI_WAIT_FD;
  fid_cq* c = nullptr;
  if (fi_cq_open(domain.get(), &cq_attr, &c, nullptr) == 0) {
    cq.reset(c);
    if (fi_control(&cq->fid, FI_GETWAIT, &cq_fd) != 0) {
      cq_fd = -1;
      cq.reset();
    }
  }
  if (!cq) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    c = nullptr;
    if ((rc = fi_cq_open(domain.get(), &cq_attr, &c, nullptr)) != 0) {
      return fi_text("fi_cq_open", rc);
    }
    cq.reset(c);
  }

  fid_ep* e = nullptr;
  if ((rc = fi_endpoint(domain.get(), info.get(), &e, nullptr)) != 0) {
    return fi_text("fi_endpoint", rc);
  }
  ep.reset(e);
  if ((rc = fi_ep_bind(ep.get(), &av->fid, 0)) != 0) return fi_text("fi_ep_bind(av)", rc);
  if ((rc = fi_ep_bind(ep.get(), &cq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return fi_text("fi_ep_bind(cq)", rc);
  }
  if ((rc = fi_enable(ep.get())) != 0) return fi_text("fi_enable", rc);
  return {};
}

std::string raw_endpoint::register_buffer(void* base, uint64_t length) {
  fid_mr* m = nullptr;
  const uint64_t access = FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
  int rc = fi_mr_reg(domain.get(), base, length, access, 0, 1, 0, &m, nullptr);
  if (rc != 0) return fi_text("fi_mr_reg", rc);
  mr.reset(m);
  if (mr_mode & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(mr.get(), &ep->fid, 0)) != 0) return fi_text("fi_mr_bind", rc);
    if ((rc = fi_mr_enable(mr.get())) != 0) return fi_text("fi_mr_enable", rc);
  }
  desc = (mr_mode & FI_MR_LOCAL) ? fi_mr_desc(mr.get()) : nullptr;
  return {};
}

std::vector<uint8_t> raw_endpoint::name() const {
  size_t len = 0;
  fi_getname(&ep->fid, nullptr, &len);
  std::vector<uint8_t> out(len);
  if (fi_getname(&ep->fid, out.data(), &len) != 0) return {};
  out.resize(len);
  return out;
}

std::string raw_endpoint::cq_error() {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq.get(), &err, 0) < 0) return "fi_cq_read: error entry unavailable";
  char buf[256] = {};
  const char* text = fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, buf, sizeof buf);
  return std::string("completion error: ") + fi_strerror(err.err) + " (prov_errno " +
         std::to_string(err.prov_errno) + ": " + (text ? text : "?") + ")";
}

bool raw_endpoint::wait(int sock) {
  pollfd fds[2] = {{sock, POLLIN, 0}, {cq_fd, POLLIN, 0}};
  nfds_t n = 1;
  std::chrono::nanoseconds timeout = std::chrono::milliseconds(10);
  if (cq_fd >= 0) {
    fid* f = &cq->fid;
    if (fi_trywait(fabric.get(), &f, 1) != 0) return false;  // events pending: read the CQ
    n = 2;
  } else {
    // Grow from 20 µs to 500 µs: fast reaction within a burst, little CPU between runs.
    sleep_step = std::clamp<clock_type::duration>(sleep_step * 2, std::chrono::microseconds(20),
                                                  std::chrono::microseconds(500));
    timeout = sleep_step;
  }
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::ppoll(fds, n, &ts, nullptr);
  return (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace ferry::bench::raw_detail
