#pragma once
// A multi-host test cluster made of Linux network namespaces: one namespace per host, each with
// `lo` up and an `eth0` veth whose other end is a port of a bridge in a "switch" namespace, so
// every host reaches every other on 198.18.0.0/24 (the benchmarking range, RFC 2544). Created
// and torn down with iproute2 (`ip`), run through posix_spawn with every exit code checked and
// stderr reported. Namespace names carry the test's pid, so concurrent runs never collide, and
// namespaces left behind by a test process that died are removed (with their processes) by the
// next cluster made on the machine.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/harness.hpp"

extern char** environ;

namespace ferry::test::netns {

using namespace std::chrono_literals;

/// Set when an assertion of the running test case failed (by the listener in main.cpp).
inline bool& test_failed() {
  static bool failed = false;
  return failed;
}

/// Outcome of one command: exit code (-1: killed by a signal or by the bound; 127: not found).
struct run_result {
  int code = -1;
  std::string out, err;
  std::string command;
  bool ok() const { return code == 0; }
  /// "`ip netns add x` exited 1: <stderr>" for failure messages.
  std::string describe() const {
    std::ostringstream o;
    o << "`" << command << "` ";
    if (code == 127 && err.empty())
      o << "could not be run (not found)";
    else
      o << "exited " << code;
    if (!err.empty()) o << ": " << err;
    if (!out.empty() && err.empty()) o << " (stdout: " << out << ")";
    return o.str();
  }
};

/// Run `argv` (PATH lookup) with stdin from /dev/null, capturing stdout and stderr; the child is
/// killed if it has not finished within `timeout`.
inline run_result run(const std::vector<std::string>& argv,
                      std::chrono::milliseconds timeout = 10s) {
  run_result r;
  for (size_t i = 0; i < argv.size(); ++i) r.command += (i ? " " : "") + argv[i];
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return r.err = "pipe failed", r;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]);
    return r.err = "pipe failed", r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]), close(err[1]);
  if (rc != 0) {
    close(out[0]), close(err[0]);
    r.code = 127;
    r.err = std::string("cannot run ") + argv[0] + ": " + std::strerror(rc);
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* dst[2] = {&r.out, &r.err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      char buf[4096];
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        dst[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  if (timed_out) kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  while (!r.err.empty() && (r.err.back() == '\n' || r.err.back() == ' ')) r.err.pop_back();
  if (timed_out) r.err += " (killed after " + std::to_string(timeout.count()) + " ms)";
  return r;
}

/// "ferry-<pid>-": every namespace this process makes starts with it.
inline std::string own_prefix() { return "ferry-" + std::to_string(getpid()) + "-"; }

/// Remove namespaces "ferry-<pid>-..." whose test process is gone, killing what still runs in
/// them (ferryds of a test that was killed). Best effort: errors are only printed.
inline void remove_stale() {
  DIR* d = opendir("/run/netns");
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("ferry-", 0) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name.c_str() + 6, &end, 10);
    if (pid <= 0 || *end != '-') continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    stale.push_back(name);
  }
  closedir(d);
  for (const auto& name : stale) {
    auto pids = run({"ip", "netns", "pids", name});
    std::istringstream in(pids.out);
    for (long p; in >> p;)
      if (p > 0) kill(static_cast<pid_t>(p), SIGKILL);
    auto del = run({"ip", "netns", "del", name});
    std::cerr << "netns: removed stale namespace " << name
              << (del.ok() ? "" : " (failed: " + del.describe() + ")") << "\n";
  }
}

/// Stderr texts of `ip` that mean "this machine cannot do it", not "the fixture is wrong".
inline bool unsupported_here(const run_result& r) {
  for (const char* s : {"Permission denied", "Operation not permitted", "not supported",
                        "Unknown device type", "could not be run", "cannot run"})
    if (r.describe().find(s) != std::string::npos) return true;
  return false;
}

/// The cluster: hosts 0..N-1 in namespaces "<prefix>h<i>" with eth0 = 198.18.0.<i+1>/24, all on
/// bridge br0 in namespace "<prefix>sw" (switch port p<i> leads to host i).
class cluster {
 public:
  struct host {
    std::string netns;    ///< namespace name (for `ip netns exec`, setns via /run/netns)
    std::string address;  ///< 198.18.0.<i+1>
  };

  /// Outcome of `make`: a cluster, or why not (`skip`: this machine cannot; else a fixture bug).
  struct made {
    std::unique_ptr<cluster> net;
    std::string error;
    bool skip = false;
  };

  /// Create `hosts` hosts. Nothing is left behind when it fails.
  static made make(size_t hosts) {
    static int serial = 0;
    remove_stale();
    made m;
    std::unique_ptr<cluster> c(new cluster(own_prefix() + std::to_string(serial++) + "-"));
    // The first step doubles as the capability probe: not root, no `ip`, no CAP_SYS_ADMIN.
    auto probe = c->add_netns(c->switch_ns_);
    if (!probe.ok()) {
      m.skip = true;
      m.error = "cannot create a network namespace: " + probe.describe();
      return m;
    }
    std::string err = c->build(hosts);
    if (!err.empty()) {
      m.error = std::move(err);
      m.skip = c->last_failure_unsupported_;
      return m;  // `c` is destroyed here and removes what was made
    }
    m.net = std::move(c);
    return m;
  }

  ~cluster() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      auto r = run({"ip", "netns", "del", *it});
      if (!r.ok()) std::cerr << "netns: teardown: " << r.describe() << "\n";
    }
  }
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  size_t size() const { return hosts_.size(); }
  const host& at(size_t i) const { return hosts_.at(i); }
  const std::string& switch_netns() const { return switch_ns_; }

  /// Run a command inside host i's namespace (`ip netns exec`).
  run_result exec(size_t i, const std::vector<std::string>& argv,
                  std::chrono::milliseconds timeout = 10s) const {
    std::vector<std::string> full{"ip", "netns", "exec", at(i).netns};
    full.insert(full.end(), argv.begin(), argv.end());
    return run(full, timeout);
  }

  /// Pull or plug host i's cable: its switch port goes down or up, so eth0 in the host loses or
  /// regains carrier while keeping its address and routes (a link flap, not an ifdown). Up
  /// returns once the bridge forwards on the port again. "" or the failure.
  std::string set_link(size_t i, bool up) {
    auto r = run({"ip", "-n", switch_ns_, "link", "set", port(i), up ? "up" : "down"});
    if (!r.ok()) return r.describe();
    return up ? wait_forwarding(i) : "";
  }

  /// Bytes received on host i's eth0 ("" error leaves 0 and says why in `why`).
  uint64_t rx_bytes(size_t i, std::string* why = nullptr) const {
    auto r = exec(i, {"cat", "/sys/class/net/eth0/statistics/rx_bytes"});
    if (!r.ok()) {
      if (why) *why = r.describe();
      return 0;
    }
    return std::strtoull(r.out.c_str(), nullptr, 10);
  }

 private:
  explicit cluster(std::string prefix) : prefix_(std::move(prefix)), switch_ns_(prefix_ + "sw") {}

  static std::string port(size_t i) {
    std::string p = "p";  // (not "p" + ...: GCC 12 warns -Wrestrict on that, wrongly)
    return p += std::to_string(i);
  }

  run_result add_netns(const std::string& name) {
    auto r = run({"ip", "netns", "add", name});
    if (r.ok()) made_.push_back(name);
    return r;
  }

  /// Run one `ip` step; on failure remember whether it is the machine's limit and say which.
  bool step(const std::vector<std::string>& argv, std::string& err) {
    auto r = run(argv);
    if (r.ok()) return true;
    last_failure_unsupported_ = unsupported_here(r);
    err = "cluster setup failed: " + r.describe();
    return false;
  }

  std::string build(size_t hosts) {
    std::string err;
    const auto& sw = switch_ns_;
    // STP off: ports forward as soon as they are up.
    if (!step({"ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0"}, err) ||
        !step({"ip", "-n", sw, "link", "set", "br0", "up"}, err))
      return err;
    for (size_t i = 0; i < hosts; ++i) {
      host h{prefix_ + "h" + std::to_string(i), "198.18.0." + std::to_string(i + 1)};
      auto r = add_netns(h.netns);
      if (!r.ok()) {
        last_failure_unsupported_ = unsupported_here(r);
        return "cluster setup failed: " + r.describe();
      }
      // The veth is made inside the switch namespace and its host end moved at once, so no
      // interface name ever appears in the root namespace (concurrent runs cannot collide).
      if (!step({"ip", "-n", h.netns, "link", "set", "lo", "up"}, err) ||
          !step({"ip", "-n", sw, "link", "add", port(i), "type", "veth", "peer", "name", "eth0",
                 "netns", h.netns},
                err) ||
          !step({"ip", "-n", sw, "link", "set", port(i), "master", "br0"}, err) ||
          !step({"ip", "-n", sw, "link", "set", port(i), "up"}, err) ||
          !step({"ip", "-n", h.netns, "addr", "add", h.address + "/24", "dev", "eth0"}, err) ||
          !step({"ip", "-n", h.netns, "link", "set", "eth0", "up"}, err))
        return err;
      hosts_.push_back(std::move(h));
    }
    for (size_t i = 0; i < hosts; ++i)
      if (auto e = wait_forwarding(i); !e.empty()) return e;
    return "";
  }

  /// Bounded wait until switch port i forwards and host i's eth0 is up (no event exists for
  /// either; both normally hold at once, the bridge having STP off).
  std::string wait_forwarding(size_t i) const {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    std::string last;
    for (;;) {
      auto p = run({"ip", "-n", switch_ns_, "-d", "link", "show", port(i)});
      auto h = run({"ip", "-n", at(i).netns, "link", "show", "eth0"});
      if (p.ok() && h.ok() && p.out.find("state forwarding") != std::string::npos &&
          h.out.find("state UP") != std::string::npos)
        return "";
      last = (p.ok() ? p.out : p.describe()) + " / " + (h.ok() ? h.out : h.describe());
      if (std::chrono::steady_clock::now() > deadline)
        return "switch port " + port(i) + " did not forward within 10 s: " + last;
      std::this_thread::sleep_for(20ms);
    }
  }

  std::string prefix_;
  std::string switch_ns_;
  std::vector<std::string> made_;  ///< namespaces to delete, in creation order
  std::vector<host> hosts_;
  bool last_failure_unsupported_ = false;
};

/// A cluster of `hosts` hosts, or end the test process as skipped (exit code 77) when this
/// machine cannot make namespaces, naming why; a setup error that is not the machine's fails.
inline std::unique_ptr<cluster> require_cluster(size_t hosts) {
  auto m = cluster::make(hosts);
  if (m.net) return std::move(m.net);
  if (m.skip) {
    WARN("SKIPPED: " << m.error);
    std::cerr << "SKIPPED: " << m.error << "\n";
    std::exit(skip_exit_code);
  }
  FAIL(m.error);
  return nullptr;
}

}  // namespace ferry::test::netns
