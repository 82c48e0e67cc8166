#include "raw_fabric.hpp"

#include <poll.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "tools/bench/raw_fabric_endpoint.hpp"

namespace ferry::bench {

using namespace raw_detail;

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

  // Paced: grant the first rooms, then one more as each room's last notification arrives.
  const uint64_t rw = options.room_writes;
  const uint64_t rooms = rw ? (expected_writes + rw - 1) / rw : 0;
  std::vector<uint32_t> landed(rooms, 0);
  uint64_t granted = 0;
  auto grant = [&]() -> std::string {
    const grant_body g{granted++};
    return send_msg(fd, msg_kind::go, &g, sizeof g);
  };
  while (granted < std::min<uint64_t>(rooms, std::max<uint32_t>(options.rooms_in_flight, 1)))
    if (auto e = grant(); !e.empty()) {
      out.error = e;
      return out;
    }

  fi_cq_data_entry entries[64];
  auto last_progress = clock_type::now();
  uint64_t empty_polls = 0;
  while (out.writes < expected_writes) {
    ssize_t n = fi_cq_read(ep.cq.get(), entries, 64);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (!(entries[i].flags & FI_REMOTE_CQ_DATA)) continue;
        ++out.writes;
        const uint64_t room = rw ? entries[i].data / rw : 0;
        if (rw && room < rooms && ++landed[room] == std::min(rw, expected_writes - room * rw) &&
            granted < rooms)
          if (auto e = grant(); !e.empty()) out.error = e;
      }
      if (!out.error.empty()) break;
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
  const size_t warmup = options.room_writes ? 0 : std::min(options.warmup_writes, writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    const raw_write& w = writes[i];
    if (w.length == 0 || w.src_offset > length || w.length > length - w.src_offset) {
      return fail("write outside the source buffer");
    }
    if (i >= warmup) out.bytes += w.length;
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
  // Paced: writes below `allowed` belong to granted rooms (rooms are granted in order).
  const bool paced = options.room_writes > 0 && per_write;
  size_t allowed = paced ? 0 : writes.size();
  // The target's "done" (all writes counted) may arrive while we still post or progress; so,
  // paced, may its grants.
  auto receive_done = [&] {
    msg_kind kind{};
    out.error = recv_either(fd, msg_kind::done, paced ? msg_kind::go : msg_kind::done, kind, body,
                            deadline);
    if (out.error.empty() && kind == msg_kind::go) {
      grant_body g{};
      std::memcpy(&g, body.data(), std::min(body.size(), sizeof g));
      allowed = std::min<size_t>(writes.size(),
                                 std::max<size_t>(allowed, (g.room + 1) * options.room_writes));
      return true;
    }
    got_done = out.error.empty();
    return got_done;
  };
  // Paced: take every grant already on the socket, without waiting.
  auto take_grants = [&] {
    for (pollfd pfd{fd, POLLIN, 0}; paced && !got_done && ::poll(&pfd, 1, 0) > 0;)
      if (!receive_done()) return false;
    return true;
  };
  auto last_progress = clock_type::now();
  auto start = clock_type::now();
  bool warm = warmup == 0;
  const char* src = static_cast<const char*>(source);
  while (completed < writes.size()) {
    bool progressed = false;
    if (!warm && completed >= warmup) {
      warm = true;
      start = clock_type::now();  // the timed writes start now
    }
    if (next == allowed && !take_grants()) return out;
    while (!free_contexts.empty() && next < (warm ? allowed : warmup)) {
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
