// The raw latency reference (raw_fabric.hpp: raw_latency_reference): one TCP control message,
// a room's writes with remote CQ data and the target's notifications, between this process (the
// target, which measures) and a forked initiator, both waiting as Ferry's progress thread waits.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "tools/bench/raw_fabric_endpoint.hpp"

namespace ferry::bench {

using namespace raw_detail;
using namespace std::chrono_literals;

namespace {

// Ferry's progress thread's wait policy, copied from transport/fabric_progress.cpp (kept in step
// by hand, not shared: this reference must not run Ferry's code). See raw_fabric.hpp.
constexpr auto spin_budget = 30us;
constexpr auto fd_wait_cap_busy = 1ms;
constexpr auto fd_wait_cap_idle = 10ms;
constexpr auto sleep_first = 20us;
constexpr auto sleep_cap_recent = 200us;
constexpr auto recent_window = 20ms;
constexpr auto sleep_cap_warm = 1ms;
constexpr auto warm_window = 1s;
constexpr auto sleep_cap_cold = 4ms;
/// The decode's hint when its room sent its prepares (engine::expect_writes, window from
/// actors/receiver.cpp): for this long the shm sleeps stay at sleep_cap_recent.
constexpr auto expect_writes_window = 100ms;

/// A control read of the initiator waits at most this long for the target's next message.
constexpr auto control_wait = 600s;
/// How long the destructor waits for the initiator to exit before killing it.
constexpr auto exit_wait = 5s;

struct go_body {
  uint64_t seq;
  uint64_t single;  ///< 1: one write of every byte of the room
};

/// The wait state of one progress loop, as Ferry's progress thread keeps it.
struct waiter {
  raw_endpoint* ep = nullptr;
  int wake_fd = -1;
  clock_type::time_point last_activity = clock_type::now();
  clock_type::duration sleep_step = sleep_first;
  clock_type::time_point expect_until{};  ///< expect_writes: short sleeps until then (shm)

  void activity(clock_type::time_point now) {
    last_activity = now;
    sleep_step = sleep_first;
  }
  /// Empty polls go on this long after real activity before blocking.
  bool spinning(clock_type::time_point now) const { return now - last_activity < spin_budget; }
  /// Block as Ferry's progress thread blocks (`busy`: writes posted or queued), no later than
  /// `limit`; `extra_fd` (>= 0) is polled too. Returns whether `extra_fd` became readable.
  bool block(bool busy, int extra_fd, clock_type::time_point limit) {
    pollfd fds[3] = {{wake_fd, POLLIN, 0}, {extra_fd, POLLIN, 0}, {ep->cq_fd, POLLIN, 0}};
    nfds_t n = 2;  // (a negative fd is ignored by ppoll)
    const auto now = clock_type::now();
    clock_type::duration timeout{};
    if (ep->cq_fd >= 0) {
      fid* f = &ep->cq->fid;
      const int rc = fi_trywait(ep->fabric.get(), &f, 1);
      if (rc == -FI_EAGAIN) return false;  // entries already queued: read the CQ
      if (rc == 0) {
        n = 3;
        timeout =
            busy ? clock_type::duration(fd_wait_cap_busy) : clock_type::duration(fd_wait_cap_idle);
      } else {
        timeout = sleep_cap_recent;
      }
    } else {
      const auto idle_for = now - last_activity;
      const bool expecting = now < expect_until;
      const clock_type::duration cap =
          idle_for < recent_window || expecting ? clock_type::duration(sleep_cap_recent)
          : idle_for < warm_window              ? clock_type::duration(sleep_cap_warm)
                                                : clock_type::duration(sleep_cap_cold);
      timeout = std::min(sleep_step, cap);
      sleep_step = std::min<clock_type::duration>(sleep_step * 2, cap);
    }
    timeout = std::max<clock_type::duration>(0ns, std::min(timeout, limit - now));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::ppoll(fds, n, &ts, nullptr);
    if (fds[0].revents & POLLIN) {
      uint64_t value = 0;
      [[maybe_unused]] ssize_t r = ::read(wake_fd, &value, sizeof value);
    }
    return extra_fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
};

/// An anonymous, pre-faulted mapping, unmapped last (declared before the endpoint that
/// registers it).
struct mapping {
  uint8_t* p = nullptr;
  uint64_t len = 0;
  bool map(uint64_t bytes) {
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) return false;
    p = static_cast<uint8_t*>(m);
    len = bytes;
    return true;
  }
  ~mapping() {
    if (p) ::munmap(p, len);
  }
};

/// Any message: its kind and body (an `error` message is returned as a kind too).
std::string recv_any(int fd, msg_kind& kind, std::string& body, clock_type::time_point deadline) {
  msg_header h{};
  if (auto e = recv_all(fd, &h, sizeof h, deadline); !e.empty()) return e;
  if (h.magic != magic || h.length > (1u << 20)) return "malformed message from peer process";
  body.resize(h.length);
  if (auto e = recv_all(fd, body.data(), body.size(), deadline); !e.empty()) return e;
  kind = static_cast<msg_kind>(h.kind);
  return {};
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// ----- the initiator (forked child) ----------------------------------------------------------

struct initiator {
  raw_endpoint ep;
  int sock = -1;
  int wake_fd = -1;
  const uint8_t* src = nullptr;
  uint64_t bytes = 0;
  std::vector<raw_write> room;
  uint32_t window = 64;
  hello_body hello{};
  fi_addr_t peer = FI_ADDR_NOTAVAIL;

  std::mutex queue_mutex;
  std::deque<go_body> queue;
  std::atomic<bool> queued{false}, stop{false}, failed{false};

  /// The progress thread: take queued rooms, post their writes, read completions, and wait as
  /// Ferry's progress thread waits.
  void progress() {
    struct post {
      raw_write w;
      uint64_t imm;
    };
    std::deque<post> pending;
    std::vector<fi_context> contexts(std::max<uint32_t>(window, 1));
    std::vector<fi_context*> free_contexts;
    for (auto& c : contexts) free_contexts.push_back(&c);
    waiter w{&ep, wake_fd};
    fi_cq_data_entry entries[64];
    auto fail = [&](const std::string& text) {
      failed = true;
      send_error(sock, "initiator: " + text);
    };
    while (!stop.load(std::memory_order_relaxed)) {
      bool active = false;
      if (queued.load()) {
        std::deque<go_body> items;
        {
          std::lock_guard<std::mutex> lock(queue_mutex);
          items.swap(queue);
          queued = false;
        }
        for (const auto& g : items) {
          if (g.single != 0)
            pending.push_back({raw_write{0, 0, bytes}, g.seq});
          else
            for (const auto& x : room) pending.push_back({x, g.seq});
        }
        active = !items.empty();
      }
      while (!free_contexts.empty() && !pending.empty()) {
        const post& p = pending.front();
        const ssize_t r = fi_writedata(
            ep.ep.get(), const_cast<uint8_t*>(src + p.w.src_offset), p.w.length, ep.desc, p.imm,
            peer, hello.remote_base + p.w.dst_offset, hello.key, free_contexts.back());
        if (r == -FI_EAGAIN) break;
        if (r != 0) return fail(fi_text("fi_writedata", r));
        free_contexts.pop_back();
        pending.pop_front();
        active = true;
      }
      const ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i)
          if ((entries[i].flags & FI_REMOTE_CQ_DATA) == 0)
            free_contexts.push_back(static_cast<fi_context*>(entries[i].op_context));
        active = true;
      } else if (n == -FI_EAVAIL) {
        return fail(ep.cq_error());
      } else if (n != -FI_EAGAIN) {
        return fail(fi_text("fi_cq_read", n));
      }
      const auto now = clock_type::now();
      if (active) {
        w.activity(now);
        continue;
      }
      if (w.spinning(now)) continue;
      // The eventfd's count stays until read, so a `go` queued after the check above still
      // ends the wait at once (Ferry re-checks its queue after announcing sleep instead).
      w.block(free_contexts.size() < contexts.size() || !pending.empty(), -1,
              now + fd_wait_cap_idle);
    }
    // Let posted writes complete before the endpoint closes (bounded).
    const auto until = clock_type::now() + 1s;
    while (free_contexts.size() < contexts.size() && clock_type::now() < until) {
      const ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
      for (ssize_t i = 0; i < n; ++i)
        if ((entries[i].flags & FI_REMOTE_CQ_DATA) == 0)
          free_contexts.push_back(static_cast<fi_context*>(entries[i].op_context));
      if (n == -FI_EAVAIL) break;
    }
  }

  /// The control thread (the process's main thread): set up, then read the target's messages.
  int run(const raw_options& o) {
    if (auto e = ep.open(o); !e.empty()) return send_error(sock, e), 1;
    if (auto e = ep.register_buffer(const_cast<uint8_t*>(src), bytes); !e.empty())
      return send_error(sock, e), 1;
    std::string body;
    if (auto e = recv_msg(sock, msg_kind::hello, body, clock_type::now() + control_wait);
        !e.empty() || body.size() < sizeof hello)
      return send_error(sock, e.empty() ? "short hello from target" : e), 1;
    std::memcpy(&hello, body.data(), sizeof hello);
    if (hello.length < bytes) return send_error(sock, "the target buffer is too small"), 1;
    const int rc = fi_av_insert(ep.av.get(), body.data() + sizeof hello, 1, &peer, 0, nullptr);
    if (rc != 1) return send_error(sock, fi_text("fi_av_insert", rc < 0 ? rc : -FI_EINVAL)), 1;
    wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) return send_error(sock, std::string("eventfd: ") + std::strerror(errno)), 1;
    if (auto e = send_msg(sock, msg_kind::ready, nullptr, 0); !e.empty()) return 1;
    std::thread progress_thread([this] { progress(); });
    int code = 0;
    for (;;) {
      msg_kind kind{};
      if (auto e = recv_any(sock, kind, body, clock_type::now() + control_wait); !e.empty()) {
        code = 1;  // the target is gone or silent: nothing to report to
        break;
      }
      if (kind == msg_kind::go && body.size() >= sizeof(go_body)) {
        go_body g;
        std::memcpy(&g, body.data(), sizeof g);
        {
          std::lock_guard<std::mutex> lock(queue_mutex);
          queue.push_back(g);
          queued = true;
        }
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t r = ::write(wake_fd, &one, sizeof one);
        continue;
      }
      code = kind == msg_kind::bye ? 0 : 1;
      break;
    }
    stop = true;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_fd, &one, sizeof one);
    progress_thread.join();
    ::close(wake_fd);
    return failed ? 1 : code;
  }
};

}  // namespace

// ----- the target (this process) -------------------------------------------------------------

struct raw_latency_reference::state {
  raw_options options;
  std::vector<raw_write> room;
  uint32_t window = 64;
  mapping src, dst;  // before `ep`: unmapped after it closes
  raw_endpoint ep;
  int sock = -1;
  int wake_fd = -1;
  pid_t child = -1;
  waiter w;
  uint64_t seq = 0, notifications = 0;
  std::string provider;

  ~state() {
    if (sock >= 0) {
      send_msg(sock, msg_kind::bye, nullptr, 0);
      ::close(sock);
    }
    if (child > 0) {
      const auto until = clock_type::now() + exit_wait;
      int status = 0;
      while (::waitpid(child, &status, WNOHANG) == 0) {
        if (clock_type::now() > until) {
          ::kill(child, SIGKILL);
          ::waitpid(child, &status, 0);
          break;
        }
        std::this_thread::sleep_for(1ms);
      }
    }
    if (wake_fd >= 0) ::close(wake_fd);
  }

  /// The initiator spoke while it should be writing: its error, or a protocol error.
  std::string initiator_error() {
    msg_kind kind{};
    std::string body;
    if (auto e = recv_any(sock, kind, body, clock_type::now() + 1s); !e.empty()) return e;
    return kind == msg_kind::error ? "initiator failed: " + body
                                   : "unexpected message from the initiator";
  }
};

raw_latency_reference::raw_latency_reference(std::unique_ptr<state> s) : s_(std::move(s)) {}
raw_latency_reference::~raw_latency_reference() = default;

std::unique_ptr<raw_latency_reference> raw_latency_reference::start(const raw_options& options,
                                                                    std::vector<raw_write> room,
                                                                    uint32_t window,
                                                                    std::string& error) {
  auto s = std::make_unique<state>();
  s->options = options;
  s->window = window;
  uint64_t bytes = 0;
  for (const auto& w : room)
    bytes = std::max({bytes, w.src_offset + w.length, w.dst_offset + w.length});
  if (room.empty() || bytes == 0) {
    error = "the latency reference needs a room with at least one write";
    return nullptr;
  }
  s->room = std::move(room);
  if (!s->src.map(bytes) || !s->dst.map(bytes)) {
    error = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  for (uint64_t i = 0; i < bytes; ++i)
    s->src.p[i] = static_cast<uint8_t>((i * 2654435761ull) >> 13);

  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    error = std::string("control socket on 127.0.0.1: ") + std::strerror(errno);
    if (listener >= 0) ::close(listener);
    return nullptr;
  }
  std::fflush(nullptr);
  s->child = ::fork();
  if (s->child < 0) {
    error = std::string("fork: ") + std::strerror(errno);
    ::close(listener);
    return nullptr;
  }
  if (s->child == 0) {
    ::close(listener);
    int code = 1;
    {
      initiator in;
      in.sock = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (in.sock >= 0 &&
          ::connect(in.sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        no_delay(in.sock);
        in.src = s->src.p;
        in.bytes = bytes;
        in.room = s->room;
        in.window = window;
        code = in.run(options);
      }
    }
    ::_exit(code);
  }
  pollfd pfd{listener, POLLIN, 0};
  s->sock = ::poll(&pfd, 1, 10000) == 1 ? ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC) : -1;
  ::close(listener);
  if (s->sock < 0) {
    error = "the initiator process did not connect to the control socket";
    return nullptr;
  }
  no_delay(s->sock);
  const auto deadline = clock_type::now() + std::chrono::milliseconds(options.timeout_ms);
  if (auto e = s->ep.open(options); !e.empty()) {
    send_error(s->sock, e);
    error = e;
    return nullptr;
  }
  if (auto e = s->ep.register_buffer(s->dst.p, bytes); !e.empty()) {
    send_error(s->sock, e);
    error = e;
    return nullptr;
  }
  s->provider = s->ep.info->fabric_attr->prov_name;
  const std::vector<uint8_t> name = s->ep.name();
  hello_body hello{fi_mr_key(s->ep.mr.get()),
                   (s->ep.mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(s->dst.p) : 0,
                   bytes};
  std::string body;
  if (auto e = send_msg(s->sock, msg_kind::hello, &hello, sizeof hello, name.data(), name.size());
      !e.empty()) {
    error = e;
    return nullptr;
  }
  if (auto e = recv_msg(s->sock, msg_kind::ready, body, deadline); !e.empty()) {
    error = e;
    return nullptr;
  }
  s->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s->w.ep = &s->ep;
  s->w.wake_fd = s->wake_fd;  // never signalled: the target's loop has no queue
  return std::unique_ptr<raw_latency_reference>(new raw_latency_reference(std::move(s)));
}

std::string raw_latency_reference::measure(bool single_write, std::chrono::microseconds gap,
                                           uint32_t warmup, uint32_t samples,
                                           std::vector<double>& ms_out) {
  state& s = *s_;
  fi_cq_data_entry entries[64];
  const uint64_t expected = single_write ? 1 : s.room.size();
  for (uint32_t i = 0; i < warmup + samples; ++i) {
    // The gap: idle, as the decode's progress thread is between rooms (nothing may arrive).
    const auto gap_end = clock_type::now() + gap;
    while (clock_type::now() < gap_end) {
      const ssize_t n = fi_cq_read(s.ep.cq.get(), entries, 64);
      if (n > 0) return "a notification arrived during the idle gap";
      if (n == -FI_EAVAIL) return s.ep.cq_error();
      if (n != -FI_EAGAIN) return fi_text("fi_cq_read", n);
      if (s.w.spinning(clock_type::now())) continue;
      if (s.w.block(false, s.sock, gap_end)) return s.initiator_error();
    }
    const go_body g{++s.seq, single_write ? 1u : 0u};
    const auto deadline = clock_type::now() + std::chrono::milliseconds(s.options.timeout_ms);
    const auto t0 = clock_type::now();
    if (auto e = send_msg(s.sock, msg_kind::go, &g, sizeof g); !e.empty()) return e;
    s.w.expect_until = clock_type::now() + expect_writes_window;  // as a decode room's prepares
    uint64_t count = 0;
    for (uint64_t polls = 0; count < expected;) {
      const ssize_t n = fi_cq_read(s.ep.cq.get(), entries, 64);
      const auto now = clock_type::now();
      if (n > 0) {
        for (ssize_t k = 0; k < n; ++k) {
          if ((entries[k].flags & FI_REMOTE_CQ_DATA) == 0) continue;
          if (entries[k].data != g.seq)
            return "a notification of room " + std::to_string(entries[k].data) +
                   " arrived while room " + std::to_string(g.seq) + " was timed";
          ++count;
        }
        s.w.activity(now);
        continue;
      }
      if (n == -FI_EAVAIL) return s.ep.cq_error();
      if (n != -FI_EAGAIN) return fi_text("fi_cq_read", n);
      if (now > deadline)
        return "timed out after " + std::to_string(count) + " of " + std::to_string(expected) +
               " notifications";
      if (s.w.spinning(now)) {
        // Busy-polling still notices a failed initiator, without a syscall per poll.
        pollfd pfd{s.sock, POLLIN, 0};
        if ((++polls & 4095) == 0 && ::poll(&pfd, 1, 0) > 0) return s.initiator_error();
        continue;
      }
      if (s.w.block(false, s.sock, deadline)) return s.initiator_error();
    }
    const auto t1 = clock_type::now();
    s.notifications += count;
    if (i >= warmup) ms_out.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return {};
}

const std::string& raw_latency_reference::provider() const { return s_->provider; }
const uint8_t* raw_latency_reference::source() const { return s_->src.p; }
const uint8_t* raw_latency_reference::target() const { return s_->dst.p; }
uint64_t raw_latency_reference::bytes() const { return s_->src.len; }
size_t raw_latency_reference::room_writes() const { return s_->room.size(); }
uint64_t raw_latency_reference::notifications() const { return s_->notifications; }

}  // namespace ferry::bench
