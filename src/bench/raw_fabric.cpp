#include "raw_fabric.hpp"

#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

namespace ferry::bench {
namespace {

using clock_type = std::chrono::steady_clock;

// Own minimal RAII (this file must not depend on Ferry's transport): members of raw_endpoint are
// declared in open order so they close ep, cq, mr, av, domain, fabric.
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

std::string fi_text(const char* call, long long rc) {
  return std::string(call) + ": " + fi_strerror(static_cast<int>(rc < 0 ? -rc : rc));
}

// ----- socket messages -----------------------------------------------------------------------

constexpr uint32_t magic = 0x57415246;  // "FRAW"
enum class msg_kind : uint32_t { hello = 1, start = 2, done = 3, error = 4 };

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
struct done_body {
  uint64_t writes;
  uint64_t checksum;
};

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

std::string send_msg(int fd, msg_kind kind, const void* body, size_t len,
                     const void* extra = nullptr, size_t extra_len = 0) {
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
std::string recv_msg(int fd, msg_kind expected, std::string& body,
                     clock_type::time_point deadline) {
  msg_header h{};
  if (auto e = recv_all(fd, &h, sizeof h, deadline); !e.empty()) return e;
  if (h.magic != magic || h.length > (1u << 20)) return "malformed message from peer process";
  body.resize(h.length);
  if (auto e = recv_all(fd, body.data(), body.size(), deadline); !e.empty()) return e;
  if (h.kind == static_cast<uint32_t>(msg_kind::error)) return "peer process failed: " + body;
  if (h.kind != static_cast<uint32_t>(expected)) return "unexpected message from peer process";
  return {};
}

// ----- endpoint ------------------------------------------------------------------------------

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

  std::string open(const raw_options& o) {
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

  std::string register_buffer(void* base, uint64_t length) {
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

  std::vector<uint8_t> name() const {
    size_t len = 0;
    fi_getname(&ep->fid, nullptr, &len);
    std::vector<uint8_t> out(len);
    if (fi_getname(&ep->fid, out.data(), &len) != 0) return {};
    out.resize(len);
    return out;
  }

  std::string cq_error() {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq.get(), &err, 0) < 0) return "fi_cq_read: error entry unavailable";
    char buf[256] = {};
    const char* text = fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, buf, sizeof buf);
    return std::string("completion error: ") + fi_strerror(err.err) + " (prov_errno " +
           std::to_string(err.prov_errno) + ": " + (text ? text : "?") + ")";
  }

  /// Idle wait: until the CQ may have entries, `sock` is readable, or a short timeout.
  /// Returns true if `sock` is readable.
  bool wait(int sock) {
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
};

}  // namespace

uint64_t raw_checksum(const void* data, uint64_t length) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ length;
  uint64_t i = 0;
  for (; i + 8 <= length; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  for (; i < length; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

raw_target_result raw_target(const raw_options& options, int fd, void* buffer, uint64_t length,
                             bool checksum) {
  raw_target_result out;
  const auto deadline = clock_type::now() + std::chrono::milliseconds(options.timeout_ms);
  raw_endpoint ep;
  out.error = ep.open(options);
  if (out.error.empty()) out.error = ep.register_buffer(buffer, length);
  if (!out.error.empty()) {
    send_error(fd, out.error);
    return out;
  }
  const std::vector<uint8_t> name = ep.name();
  hello_body hello{fi_mr_key(ep.mr.get()),
                   (ep.mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(buffer) : 0, length};
  if (auto e = send_msg(fd, msg_kind::hello, &hello, sizeof hello, name.data(), name.size());
      !e.empty()) {
    out.error = e;
    return out;
  }
  // Writes may already be arriving; their CQ entries wait in the CQ meanwhile.
  std::string body;
  if (auto e = recv_msg(fd, msg_kind::start, body, deadline); !e.empty()) {
    out.error = e;
    return out;
  }
  if (body.size() < sizeof(start_body)) {
    out.error = "short start message from initiator";
    send_error(fd, out.error);
    return out;
  }
  start_body start;
  std::memcpy(&start, body.data(), sizeof start);
  const uint64_t expected_writes = start.expected;

  fi_cq_data_entry entries[64];
  auto last_progress = clock_type::now();
  uint64_t empty_polls = 0;
  while (out.writes < expected_writes) {
    ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (entries[i].flags & FI_REMOTE_CQ_DATA) ++out.writes;
      }
      last_progress = clock_type::now();
      ep.sleep_step = {};
      continue;
    }
    if (n == -FI_EAVAIL) {
      out.error = ep.cq_error();
      break;
    }
    if (n != -FI_EAGAIN) {
      out.error = fi_text("fi_cq_read", n);
      break;
    }
    const auto now = clock_type::now();
    if (now > deadline) {
      out.error = "timed out after " + std::to_string(out.writes) + " of " +
                  std::to_string(expected_writes) + " writes";
      break;
    }
    bool initiator_spoke = false;
    if (options.poll_us < 0 || now - last_progress < std::chrono::microseconds(options.poll_us)) {
      // Busy-polling still notices a failed initiator, without a syscall per poll.
      if ((++empty_polls & 4095) != 0) continue;
      pollfd pfd{fd, POLLIN, 0};
      initiator_spoke = ::poll(&pfd, 1, 0) > 0;
    } else {
      initiator_spoke = ep.wait(fd);
    }
    if (initiator_spoke) {
      // The initiator only speaks here to report its own failure (or it exited).
      out.error = recv_msg(fd, msg_kind::done, body, deadline);
      if (out.error.empty()) out.error = "unexpected message from initiator";
      return out;
    }
  }
  if (!out.error.empty()) {
    send_error(fd, out.error);
    return out;
  }
  if (checksum) out.checksum = raw_checksum(buffer, length);
  done_body done{out.writes, out.checksum};
  out.error = send_msg(fd, msg_kind::done, &done, sizeof done);
  return out;
}

raw_initiator_result raw_initiator(const raw_options& options, int fd, const void* source,
                                   uint64_t length, const std::vector<raw_write>& writes,
                                   uint32_t window) {
  raw_initiator_result out;
  const auto deadline = clock_type::now() + std::chrono::milliseconds(options.timeout_ms);
  auto fail = [&](std::string e) {
    out.error = std::move(e);
    send_error(fd, out.error);
    return out;
  };
  window = std::max<uint32_t>(window, 1);
  for (const raw_write& w : writes) {
    if (w.length == 0 || w.src_offset > length || w.length > length - w.src_offset) {
      return fail("write outside the source buffer");
    }
    out.bytes += w.length;
  }

  raw_endpoint ep;
  if (auto e = ep.open(options); !e.empty()) return fail(e);
  out.provider = ep.info->fabric_attr->prov_name;
  if (auto e = ep.register_buffer(const_cast<void*>(source), length); !e.empty()) return fail(e);

  std::string body;
  if (auto e = recv_msg(fd, msg_kind::hello, body, deadline); !e.empty()) {
    out.error = e;
    return out;
  }
  if (body.size() < sizeof(hello_body)) return fail("short hello from target");
  hello_body hello;
  std::memcpy(&hello, body.data(), sizeof hello);
  fi_addr_t peer = FI_ADDR_NOTAVAIL;
  int rc = fi_av_insert(ep.av.get(), body.data() + sizeof hello, 1, &peer, 0, nullptr);
  if (rc != 1) return fail(fi_text("fi_av_insert", rc < 0 ? rc : -FI_EINVAL));
  for (const raw_write& w : writes) {
    if (w.dst_offset > hello.length || w.length > hello.length - w.dst_offset) {
      return fail("write outside the target buffer");
    }
  }
  const bool per_write = options.cq_data_per_write;
  const start_body announce{writes.empty() ? 0 : (per_write ? writes.size() : 1)};
  if (auto e = send_msg(fd, msg_kind::start, &announce, sizeof announce); !e.empty()) {
    return fail(e);
  }

  // One fi_context per in-flight write (FI_CONTEXT lets the provider use it).
  std::vector<fi_context> contexts(window);
  std::vector<fi_context*> free_contexts;
  for (auto& c : contexts) free_contexts.push_back(&c);

  fi_cq_data_entry entries[64];
  size_t next = 0, completed = 0;
  bool got_done = false;  // the target's `done` may overtake our last local completions
  // The target's "done" (all writes counted) may arrive while we still post or progress.
  auto receive_done = [&] {
    out.error = recv_msg(fd, msg_kind::done, body, deadline);
    got_done = out.error.empty();
    return got_done;
  };
  auto last_progress = clock_type::now();
  const auto start = clock_type::now();
  const char* src = static_cast<const char*>(source);
  while (completed < writes.size()) {
    bool progressed = false;
    while (!free_contexts.empty() && next < writes.size()) {
      const raw_write& w = writes[next];
      void* buf = const_cast<char*>(src + w.src_offset);
      const uint64_t dst = hello.remote_base + w.dst_offset;
      ssize_t r = per_write ? fi_writedata(ep.ep.get(), buf, w.length, ep.desc, next, peer, dst,
                                           hello.key, free_contexts.back())
                            : fi_write(ep.ep.get(), buf, w.length, ep.desc, peer, dst, hello.key,
                                       free_contexts.back());
      if (r == -FI_EAGAIN) break;  // progress the CQ, then retry
      if (r != 0) return fail(fi_text("fi_writedata", r));
      free_contexts.pop_back();
      ++next;
      progressed = true;
    }
    ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (entries[i].flags & FI_REMOTE_CQ_DATA) continue;
        free_contexts.push_back(static_cast<fi_context*>(entries[i].op_context));
        ++completed;
      }
      progressed = true;
    } else if (n == -FI_EAVAIL) {
      return fail(ep.cq_error());
    } else if (n != -FI_EAGAIN) {
      return fail(fi_text("fi_cq_read", n));
    }
    const auto now = clock_type::now();
    if (progressed) {
      last_progress = now;
      ep.sleep_step = {};
      continue;
    }
    if (now > deadline) return fail("timed out with " + std::to_string(completed) + " completed");
    if (options.poll_us < 0 || now - last_progress < std::chrono::microseconds(options.poll_us)) {
      if (options.poll_us < 0 && !got_done) {
        pollfd pfd{fd, POLLIN, 0};
        if (::poll(&pfd, 1, 0) > 0) {
          if (!receive_done()) return out;
        }
      }
      continue;
    }
    if (ep.wait(got_done ? -1 : fd)) {
      if (!receive_done()) return out;
    }
  }

  if (!per_write && !writes.empty()) {
    // Commit marker: after every plain write completed locally, re-write the first bytes of the
    // last one with remote CQ data (see "Commit styles" in the header).
    const raw_write& w = writes.back();
    fi_context marker_ctx{};
    for (;;) {
      ssize_t r = fi_writedata(ep.ep.get(), const_cast<char*>(src + w.src_offset),
                               std::min<uint64_t>(w.length, 8), ep.desc, writes.size() - 1, peer,
                               hello.remote_base + w.dst_offset, hello.key, &marker_ctx);
      if (r == 0) break;
      if (r != -FI_EAGAIN) return fail(fi_text("fi_writedata", r));
      if (fi_cq_read(ep.cq.get(), entries, 64) == -FI_EAVAIL) return fail(ep.cq_error());
      if (clock_type::now() > deadline) return fail("timed out posting the commit marker");
    }
    for (bool marker_done = false; !marker_done;) {
      ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
      if (n == -FI_EAVAIL) return fail(ep.cq_error());
      for (ssize_t i = 0; i < n; ++i) marker_done |= entries[i].op_context == &marker_ctx;
      if (clock_type::now() > deadline) return fail("timed out completing the commit marker");
      if (n == -FI_EAGAIN) ep.wait(-1);
    }
  }

  // Keep progressing our CQ while waiting for `done`: some providers need the initiator's
  // participation (acks) for the target to see the data.
  while (!got_done) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) > 0) {
      if (!receive_done()) return out;
      break;
    }
    if (clock_type::now() > deadline) return fail("timed out waiting for the target's done");
    ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
    if (n == -FI_EAVAIL) return fail(ep.cq_error());
    if (n == -FI_EAGAIN) ep.wait(fd);
  }
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  if (body.size() >= sizeof(done_body)) {
    done_body done;
    std::memcpy(&done, body.data(), sizeof done);
    out.target_writes = done.writes;
    out.target_checksum = done.checksum;
  }
  return out;
}

}  // namespace ferry::bench
