#pragma once
/// Helpers for the [fabric] tests: provider skip, bounded waits on callbacks, memory patterns,
/// a framed channel to a forked child and its reaping.

#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/rails.hpp"
#include "skip.hpp"
#include "transport/engine.hpp"

namespace ferry::test {

/// Every wait in these tests is bounded by this; exceeding it fails the test.
inline constexpr std::chrono::seconds wait_limit{20};

/// Whether libfabric offers an RDM endpoint with RMA for `provider` on this machine.
inline bool provider_available(const std::string& provider) {
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_MSG | FI_WRITE | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->fabric_attr->prov_name = ::strdup(provider.c_str());
  fi_info* info = nullptr;
  const int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info);
  fi_freeinfo(hints);
  if (info != nullptr) fi_freeinfo(info);
  return rc == 0;
}

/// Skip the running test case (tests/skip.hpp) when `provider` is missing. Catch2 v2 has no SKIP,
/// and ctest runs each TEST_CASE in its own process, so exiting skips exactly this case.
inline void require_provider(const std::string& provider) {
  if (provider_available(provider)) return;
  std::fprintf(stderr, "SKIPPED: libfabric provider '%s' is not available on this machine\n",
               provider.c_str());
  std::fflush(nullptr);
  std::exit(skip_exit_code);
}

/// Collects batch results delivered on the progress thread.
class batch_waiter {
 public:
  /// A `done` callback recording into this waiter (which must outlive the batch).
  std::function<void(transport::batch_result)> callback() {
    return [this](transport::batch_result r) {
      // Notify under the lock: the waiter may destroy this object as soon as it sees the result.
      std::lock_guard<std::mutex> lock(mutex_);
      results_.push_back(std::move(r));
      cv_.notify_all();
    };
  }
  /// Wait until `count` results arrived; false on timeout.
  bool wait(size_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, wait_limit, [&] { return results_.size() >= count; });
  }
  std::vector<transport::batch_result> results() {
    std::lock_guard<std::mutex> lock(mutex_);
    return results_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<transport::batch_result> results_;
};

/// Accumulates `immediates` callbacks; by default returns the credit right away.
class imm_collector {
 public:
  explicit imm_collector(bool auto_credit = true) : auto_credit_(auto_credit) {}

  /// Bind to the engine whose credit this collector returns.
  void attach(transport::engine* e) { engine_ = e; }

  std::function<void(transport::immediate_counts)> callback() {
    return [this](transport::immediate_counts counts) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        std::map<uint64_t, int> seen;
        for (const auto& [imm, n] : counts) {
          if (++seen[imm] > 1) duplicate_in_batch_ = true;  // aggregation must merge these
          counts_[imm] += n;
          total_ += n;
        }
        ++callbacks_;
        // Return credit before waking the test thread, which may then tear the engine down;
        // notify under the lock for the same reason as batch_waiter.
        if (auto_credit_ && engine_ != nullptr) engine_->return_immediate_credit();
        cv_.notify_all();
      }
    };
  }
  /// Wait until at least `n` immediates arrived in total; false on timeout.
  bool wait_total(uint64_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, wait_limit, [&] { return total_ >= n; });
  }
  /// Wait until at least `n` immediates carrying `imm` arrived; false on timeout.
  bool wait_count(uint64_t imm, uint64_t n,
                  std::chrono::milliseconds limit = std::chrono::milliseconds(wait_limit)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [&] {
      auto it = counts_.find(imm);
      return (it == counts_.end() ? 0 : it->second) >= n;
    });
  }
  /// Wait until at least `n` callbacks ran; false on timeout.
  bool wait_callbacks(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, wait_limit, [&] { return callbacks_ >= n; });
  }
  /// Wait until `pred(total, callbacks)` holds; false on timeout.
  bool wait_until(const std::function<bool(uint64_t, int)>& pred) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, wait_limit, [&] { return pred(total_, callbacks_); });
  }
  std::map<uint64_t, uint64_t> counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }
  uint64_t total() {
    std::lock_guard<std::mutex> lock(mutex_);
    return total_;
  }
  int callbacks() {
    std::lock_guard<std::mutex> lock(mutex_);
    return callbacks_;
  }
  bool duplicate_in_batch() {
    std::lock_guard<std::mutex> lock(mutex_);
    return duplicate_in_batch_;
  }

 private:
  bool auto_credit_;
  transport::engine* engine_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint64_t, uint64_t> counts_;
  uint64_t total_ = 0;
  int callbacks_ = 0;
  bool duplicate_in_batch_ = false;
};

/// Deterministic, position-dependent bytes so misplaced writes are detected.
inline void fill_pattern(std::vector<uint8_t>& buf, uint32_t seed) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (auto& b : buf) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
}

/// Whether [from, from + len) of `v` (to its end by default) is all zero.
inline bool all_zero(const std::vector<uint8_t>& v, uint64_t from = 0, uint64_t len = ~0ull) {
  const uint64_t n = std::min<uint64_t>(len, v.size() - std::min<uint64_t>(from, v.size()));
  const auto first = v.begin() + static_cast<ptrdiff_t>(std::min<uint64_t>(from, v.size()));
  return std::all_of(first, first + static_cast<ptrdiff_t>(n), [](uint8_t x) { return x == 0; });
}

/// FNV-1a over a byte range.
inline uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/// The value of a call that must succeed; otherwise the test fails with the call's error.
template <class T>
T must(ferry::result<T> r) {
  INFO(r.message);
  REQUIRE(r);
  return std::move(r.value);
}

/// Open an engine or fail the test with the engine's error text.
inline std::unique_ptr<transport::engine> open_engine(const std::string& provider,
                                                      uint32_t max_inflight = 64) {
  transport::engine_config cfg;
  cfg.provider = provider;
  cfg.max_inflight_writes = max_inflight;
  return must(transport::engine::open(cfg));
}

/// Open an engine with `rails` bulk rails and, when `express` is not 0, an express rail for
/// batches of at most that many bytes.
inline std::unique_ptr<transport::engine> open_rails(const std::string& provider, uint32_t rails,
                                                     uint64_t express, uint32_t max_inflight = 64) {
  transport::engine_config cfg;
  cfg.provider = provider;
  cfg.max_inflight_writes = max_inflight;
  cfg.rails = rails;
  cfg.express_bytes = express;
  return must(transport::engine::open(cfg));
}

/// What `engine::add_peer_rails` is asked on `ours` for a peer with the endpoints `their_rails`
/// (the pairing two Connections make from their `peer_rails`).
inline std::vector<transport::peer_rail> rails_between(
    const transport::engine& ours, const std::vector<transport::rail_desc>& their_rails) {
  std::vector<rails::kind> a, b;
  for (const auto& r : ours.rails()) a.push_back({r.express});
  for (const auto& r : their_rails) b.push_back({r.express});
  std::vector<transport::peer_rail> out;
  for (const auto& [mine, its] : rails::pair_rails(a, b))
    out.push_back({mine, their_rails[its].address});
  return out;
}

/// Make a peer's other endpoints (`theirs`) known on `ours`, where it is `peer` (waits; fails
/// the test on an error). Returns how many were added.
inline uint32_t add_rails(transport::engine& ours, transport::peer_handle peer,
                          const std::vector<transport::rail_desc>& theirs) {
  struct answer {  // shared: the callback may outlive a failed wait
    std::mutex m;
    std::condition_variable cv;
    std::optional<result<uint32_t>> got;
  };
  auto a = std::make_shared<answer>();
  ours.add_peer_rails(peer, rails_between(ours, theirs), [a](result<uint32_t> r) {
    std::lock_guard<std::mutex> lock(a->m);
    a->got = std::move(r);
    a->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(a->m);
  REQUIRE(a->cv.wait_for(lock, wait_limit, [&] { return a->got.has_value(); }));
  INFO(a->got->message);
  REQUIRE(*a->got);
  return a->got->value;
}
/// `add_rails` with the endpoints of the engine `theirs`.
inline uint32_t add_rails(transport::engine& ours, transport::peer_handle peer,
                          const transport::engine& theirs) {
  return add_rails(ours, peer, theirs.rails());
}

/// An engine's endpoints as bytes, for a forked child's channel: per rail its express flag,
/// address length (4 bytes) and address.
inline std::vector<uint8_t> encode_rails(const std::vector<transport::rail_desc>& rails) {
  std::vector<uint8_t> out;
  for (const auto& r : rails) {
    out.push_back(r.express ? 1 : 0);
    const auto n = static_cast<uint32_t>(r.address.size());
    const auto* p = reinterpret_cast<const uint8_t*>(&n);
    out.insert(out.end(), p, p + sizeof n);
    out.insert(out.end(), r.address.begin(), r.address.end());
  }
  return out;
}
/// The inverse of `encode_rails` (of `size` bytes from `data`); empty when malformed.
inline std::vector<transport::rail_desc> decode_rails(const uint8_t* data, size_t size) {
  std::vector<transport::rail_desc> out;
  size_t at = 0;
  while (at < size) {
    uint32_t n = 0;
    if (size - at < 1 + sizeof n) return {};
    transport::rail_desc r;
    r.express = data[at++] != 0;
    std::memcpy(&n, data + at, sizeof n);
    at += sizeof n;
    if (size - at < n) return {};
    r.address.assign(data + at, data + at + n);
    at += n;
    out.push_back(std::move(r));
  }
  return out;
}

// ----- a tiny framed channel over a socketpair, for forked-process tests -----------------------

/// Send one length-prefixed frame; false on error.
inline bool send_frame(int fd, const void* data, uint32_t len) {
  auto put = [fd](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  };
  return put(&len, sizeof len) && put(data, len);
}

/// Receive one frame within `limit`; false on timeout, EOF or error.
inline bool recv_frame(int fd, std::vector<uint8_t>& out,
                       std::chrono::milliseconds limit = wait_limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto get = [&](void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd pfd{fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      ssize_t k = ::recv(fd, c, n, 0);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  };
  uint32_t len = 0;
  if (!get(&len, sizeof len)) return false;
  out.resize(len);
  return get(out.data(), len);
}

/// Wait until the peer closes its end of the socket (child exited); false on timeout.
inline bool wait_eof(int fd, std::chrono::milliseconds limit = wait_limit) {
  std::vector<uint8_t> sink;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[256];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd pfd{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
    ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k <= 0) return true;
  }
}

/// Reaps a forked child whatever the test does: on destruction closes `fd` and, if the child
/// (stopped or not) still runs, kills it.
struct child_reaper {
  pid_t pid;
  int fd;
  ~child_reaper() {
    ::close(fd);
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
};

/// Fork a child that runs `body(fd)` on its end of a socket pair; `body` ends the child with
/// _exit (one that returns or throws exits 2). The parent gets the child and its own end,
/// reaped (killed if still running) when the result goes out of scope; a test that waits for
/// the child itself sets `pid` to -1 after.
template <class Body>
child_reaper fork_child(Body&& body) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(sv[0]);
    try {
      body(sv[1]);
    } catch (...) {
    }
    ::_exit(2);
  }
  ::close(sv[1]);
  return child_reaper{child, sv[0]};
}

}  // namespace ferry::test
