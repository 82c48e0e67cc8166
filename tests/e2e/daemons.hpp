#pragma once
// ferryd processes for the e2e tests: real daemons on loopback (or in a network namespace,
// tests/cluster), configured from a template shape, started with --ready-fd so tests wait on
// readiness (bounded), never on sleeps; a one-shot run of ferryd to its exit; and the
// shared-memory names the daemons leave in /dev/shm.

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/exit_codes.hpp"
#include "ferry/client.hpp"
#include "os/daemon_locks.hpp"
#include "skip.hpp"

namespace ferry::test {

using namespace std::chrono_literals;

/// Skip the whole test process when a libfabric provider is missing on this machine.
inline void require_provider(const std::string& prov) {
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA;
  hints->fabric_attr->prov_name = strdup(prov.c_str());
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info);
  fi_freeinfo(hints);
  if (info) fi_freeinfo(info);
  if (rc != 0) {
    WARN("SKIPPED: libfabric provider '" << prov << "' is not available here");
    std::exit(skip_exit_code);
  }
}

inline std::string bin(const std::string& name) {
  const char* dir = std::getenv("FERRY_BIN_DIR");
  return std::string(dir ? dir : FERRY_DEFAULT_BIN_DIR) + "/" + name;
}

inline uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

/// A loopback port this test listens on for as long as it lives, so a daemon told to use it
/// finds it taken.
struct held_port {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
  explicit held_port(int backlog = 1) {
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(fd, backlog) == 0);
    socklen_t len = sizeof a;
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~held_port() { close(fd); }
  held_port(const held_port&) = delete;
  held_port& operator=(const held_port&) = delete;
};

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/ferry-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  /// FERRY_KEEP_TEST_DIRS=1 keeps the directory (configs, logs) for a look after the test.
  ~temp_dir() {
    if (const char* keep = std::getenv("FERRY_KEEP_TEST_DIRS"); keep && *keep == '1') return;
    std::filesystem::remove_all(path);
  }
};

/// Shapes of a test cluster: Qwen3-Next-like layouts, scaled down in pool sizes and layer counts
/// so many tests can run quickly on two cores.
struct shape {
  std::string provider = "tcp";
  std::string host = "127.0.0.1";  ///< listen.control host and fabric.address (tests/cluster)
  uint32_t page_tokens = 1;
  uint32_t pages = 4096;
  uint32_t kv_layers = 4;
  uint32_t slots = 8;
  uint32_t mamba_layers = 3;
  uint32_t temporal_heads = 8;  ///< unsharded; the rank holds temporal_heads / tp_size
  /// Unsharded conv channels (shard groups a quarter, a quarter and a half of them) and the two
  /// last dims of the temporal state: smaller than the model's for tests with thousands of slots.
  uint32_t conv_dim = 8192;
  uint32_t temporal_dim = 128;
  /// Mamba2-style conv instead: 0 keeps the q|k|v groups above; n > 0 makes conv [x | B | C] =
  /// [conv_dim | 16n | 16n] in units [temporal_heads, n, n], so with n below the TP size every
  /// rank holds B and C whole (shard_units).
  uint32_t conv_n_groups = 0;
  std::string model_yaml;  ///< a top-level `model:` section, verbatim (empty: none)
  /// The `pools:` section, verbatim, instead of the one written from the fields above (a model
  /// catalogue's config gives only the sizes).
  std::string pools_yaml;
  bool checksums = false;  ///< integrity.checksums
  uint32_t aux_rows = 64;
  uint32_t handshake_ms = 10000;
  uint32_t bootstrapping_ms = 20000;
  uint32_t waiting_for_input_ms = 60000;
  uint32_t transferring_ms = 60000;
  uint32_t drain_ms = 2000;
  uint32_t heartbeat_ms = 1000;
  uint32_t heartbeat_misses = 3;
  uint32_t stop_ms = 30000;          ///< timeouts.stop_ms: how long a SIGTERM's drain may take
  std::string secret_file;           ///< security.cluster_secret_file (empty: none)
  std::string accepted_secret_file;  ///< security.accepted_cluster_secret_file (empty: none)
  std::vector<std::string> client_users, client_groups;  ///< security.client_users, _groups
  uint32_t transfer_ms = 30000;
  uint32_t peer_preamble_ms = 3000;  ///< limits.peer_preamble_ms (the config default)
  uint32_t max_active_rooms = 4096;
  uint32_t max_clients = 1024;                ///< 0: auto (half of the descriptor limit)
  uint64_t nofile_soft = 0, nofile_hard = 0;  ///< RLIMIT_NOFILE for the daemon (0: inherited)
  std::vector<std::pair<std::string, std::string>> env;  ///< set in the daemon's environment
  uint32_t client_frame_ms = 10000;
  uint32_t workers = 0;  ///< runtime.workers (0: one per core)
  uint64_t staging_bytes = 64ull << 20;
  uint64_t max_inflight_bytes = 0;  ///< fabric.max_inflight_bytes (0: not written, the default)
  /// fabric.pack_threshold_bytes (empty: not written, the default)
  std::optional<uint64_t> pack_threshold_bytes;
  uint32_t rails = 0;              ///< fabric.rails (0: not written, the default)
  uint64_t express_bytes = ~0ull;  ///< fabric.express_bytes (~0: not written, the default)
  // Geometry: 2 KV heads in the model (Qwen3-Next), conv and temporal state sliced by TP.
  uint32_t tp_size = 1, tp_rank = 0, pp_size = 1, pp_rank = 0;
  uint32_t dp_size = 1, dp_rank = 0;      ///< attention DP group
  std::vector<uint32_t> kv_layer_ids;     ///< empty: kv_layers ids 3, 7, 11, ...
  std::vector<uint32_t> mamba_layer_ids;  ///< empty: mamba_layers ids 0, 4, 8, ...
  bool client_memory = false;  ///< every pool `memory: client` (the engine lends its memfds)
  std::string state_type;      ///< pools.mamba.type (empty: not written, mamba)
  std::vector<std::string> instance_ranks;  ///< discovery.instance_ranks (empty: none)
  std::string metrics_listen;               ///< listen.metrics (empty: not served)
  std::string log_yaml;  ///< the log section as a flow map, e.g. "{format: json}" (empty: info)
};

/// This rank's conv channels: a TP share of conv_dim, plus B and C (shape::conv_n_groups), each
/// a share of its groups or one whole group.
inline uint32_t conv_rank_dim(const shape& s) {
  if (s.conv_n_groups == 0) return s.conv_dim / s.tp_size;
  const uint32_t group = 16 * (s.conv_n_groups >= s.tp_size ? s.conv_n_groups / s.tp_size : 1);
  return s.conv_dim / s.tp_size + 2 * group;
}

inline std::string conv_groups_yaml(const shape& s) {
  if (s.conv_n_groups == 0)
    return "        shard_groups: [" + std::to_string(s.conv_dim / 4) + ", " +
           std::to_string(s.conv_dim / 4) + ", " + std::to_string(s.conv_dim / 2) + "]\n";
  const std::string bc = std::to_string(16 * s.conv_n_groups), n = std::to_string(s.conv_n_groups);
  return "        shard_groups: [" + std::to_string(s.conv_dim) + ", " + bc + ", " + bc +
         "]\n        shard_units: [" + std::to_string(s.temporal_heads) + ", " + n + ", " + n +
         "]\n";
}

inline std::string make_config(const std::string& name, const std::string& role, uint16_t control,
                               const std::string& socket, const shape& s) {
  std::ostringstream kv_ids, m_ids;
  auto ids = [](std::ostringstream& o, const std::vector<uint32_t>& given, uint32_t n,
                uint32_t first) {
    if (given.empty())
      for (uint32_t i = 0; i < n; ++i) o << (i ? ", " : "") << 4 * i + first;
    for (size_t i = 0; i < given.size(); ++i) o << (i ? ", " : "") << given[i];
  };
  ids(kv_ids, s.kv_layer_ids, s.kv_layers, 3);
  ids(m_ids, s.mamba_layer_ids, s.mamba_layers, 0);
  const uint32_t kv_heads = s.tp_size <= 2 ? 2 / s.tp_size : 1;
  std::ostringstream y;
  const std::string control_at = s.host + ":" + std::to_string(control);
  // fabric.address only off loopback, so a loopback daemon's config text is as before
  const std::string fabric_at = s.host == "127.0.0.1" ? "" : "\n  address: " + s.host;
  y << "node:\n  name: " << name << "\nrole: " << role << "\nlisten:\n  control: " << control_at
    << "\n  client: " << socket
    << (s.metrics_listen.empty() ? "" : "\n  metrics: " + s.metrics_listen)
    << "\nfabric:\n  provider: " << s.provider << fabric_at
    << "\n  max_inflight_writes: 64\n  write_piece_bytes: 262144\n  staging_bytes: "
    << s.staging_bytes
    << (s.max_inflight_bytes ? "\n  max_inflight_bytes: " + std::to_string(s.max_inflight_bytes)
                             : "")
    << (s.pack_threshold_bytes
            ? "\n  pack_threshold_bytes: " + std::to_string(*s.pack_threshold_bytes)
            : "")
    << (s.rails ? "\n  rails: " + std::to_string(s.rails) : "")
    << (s.express_bytes != ~0ull ? "\n  express_bytes: " + std::to_string(s.express_bytes) : "")
    << "\n"
    << "tp:\n  size: " << s.tp_size << "\n  rank: " << s.tp_rank << "\npp:\n  size: " << s.pp_size
    << "\n  rank: " << s.pp_rank << "\ndp:\n  size: " << s.dp_size << "\n  rank: " << s.dp_rank
    << "\n"
    << "timeouts:\n  handshake_ms: " << s.handshake_ms
    << "\n  bootstrapping_ms: " << s.bootstrapping_ms
    << "\n  waiting_for_input_ms: " << s.waiting_for_input_ms
    << "\n  transferring_ms: " << s.transferring_ms << "\n  drain_ms: " << s.drain_ms
    << "\n  heartbeat_ms: " << s.heartbeat_ms << "\n  heartbeat_misses: " << s.heartbeat_misses
    << "\n  transfer_ms: " << s.transfer_ms << "\n  stop_ms: " << s.stop_ms
    << "\nlimits:\n  max_active_rooms: " << s.max_active_rooms
    << "\n  max_clients: " << s.max_clients << "\n  client_frame_ms: " << s.client_frame_ms
    << "\n  peer_preamble_ms: " << s.peer_preamble_ms << "\nruntime:\n  workers: " << s.workers
    << (s.log_yaml.empty() ? "\nlog:\n  level: info\n" : "\nlog: " + s.log_yaml + "\n") <<
      [&] {
        std::string sec;
        if (!s.secret_file.empty()) sec += "\n  cluster_secret_file: " + s.secret_file;
        if (!s.accepted_secret_file.empty())
          sec += "\n  accepted_cluster_secret_file: " + s.accepted_secret_file;
        auto list = [](const std::vector<std::string>& v) {
          std::string l;
          for (const auto& x : v) l += (l.empty() ? "\"" : ", \"") + x + "\"";
          return "[" + l + "]";
        };
        if (!s.client_users.empty()) sec += "\n  client_users: " + list(s.client_users);
        if (!s.client_groups.empty()) sec += "\n  client_groups: " + list(s.client_groups);
        return sec.empty() ? sec : "security:" + sec + "\n";
      }()
    <<
      [&] {
        std::string d;
        for (const auto& a : s.instance_ranks) d += (d.empty() ? "" : ", ") + ("\"" + a + "\"");
        return d.empty() ? d : "discovery:\n  instance_ranks: [" + d + "]\n";
      }()
    << (s.pools_yaml.empty() ? [&] {
         std::ostringstream p;
         p<< "pools:\n  kv:\n    layer_ids: [" << kv_ids.str() << "]\n    page_tokens: " << s.page_tokens
         << "\n    kv_heads: " << kv_heads
         << "\n    total_heads: 2\n    head_dim: 256\n    dtype_bytes: 2\n    pages: " << s.pages
         << (s.client_memory ? "\n    memory: client" : "") << "\n  mamba:\n"
         << (s.state_type.empty() ? "" : "    type: " + s.state_type + "\n") << "    slots: " << s.slots
         << (s.client_memory ? "\n    memory: client" : "") << "\n    layer_ids: [" << m_ids.str()
         << "]\n    tensors:\n"
         << "      - name: conv\n        shape: [" << conv_rank_dim(s)
         << ", 3]\n        dtype_bytes: 2\n        slice_axis: 0\n"
         << conv_groups_yaml(s) << "      - name: temporal\n        shape: ["
         << s.temporal_heads / s.tp_size << ", " << s.temporal_dim << ", " << s.temporal_dim << "]"
         << "\n        dtype_bytes: 4\n        slice_axis: 0\n"
         << "  aux:\n    rows: " << s.aux_rows << "\n    row_bytes: 5632\n"
         << (s.client_memory ? "    memory: client\n" : "");
         return p.str();
       }()
                             : s.pools_yaml)
    << s.model_yaml
    << (s.checksums ? "integrity:\n  checksums: true\n" : "");
  return y.str();
}

/// Where a daemon runs (tests/cluster): inside the network namespace `netns` (a name under
/// /run/netns; "" = the test's own), on a fixed control port (0 = a free one).
struct placement {
  std::string netns;
  uint16_t control_port = 0;
};

/// Tag of daemon_proc's constructor that forks and execs ferryd but leaves the wait for
/// readiness to await_ready(), so that several daemons start at once: most of a start is the
/// libraries' own setup (libfabric's providers probing the machine), which then overlaps.
struct launch_t {};
inline constexpr launch_t launch_only{};

/// A ferryd child process; stopped with SIGTERM (then SIGKILL after a bound) on destruction.
class daemon_proc {
 public:
  daemon_proc(const temp_dir& dir, const std::string& name, const std::string& role, const shape& s,
              const placement& at = {})
      : daemon_proc(launch_only, dir, name, role, s, at) {
    await_ready();
  }
  daemon_proc(launch_t, const temp_dir& dir, const std::string& name, const std::string& role,
              const shape& s, const placement& at = {})
      : name_(name),
        role_(role),
        shape_(s),
        netns_path_(at.netns.empty() ? "" : "/run/netns/" + at.netns),
        fixed_port_(at.control_port != 0),
        control_port_(at.control_port ? at.control_port : free_port()) {
    socket_ = (dir.path / (name + ".sock")).string();
    config_ = (dir.path / (name + ".yaml")).string();
    log_ = (dir.path / (name + ".log")).string();
    write_config();
    launch();
  }

  /// Wait until the launched daemon says it is ready; fails the test with its log otherwise.
  void await_ready() {
    for (int attempt = 1;; ++attempt) {
      const size_t logged = logged_;
      if (ready()) return;
      // free_port() can only pick a port that is free at that moment: an outgoing connection of
      // another daemon may take it before this one listens. Then, and only then, pick again.
      if (fixed_port_ || attempt == 3 ||
          log_text().find("cannot listen for peers", logged) == std::string::npos)
        FAIL("ferryd " << name_ << " did not become ready; log:\n" << log_text());
      control_port_ = free_port();
      write_config();
      launch();
    }
  }
  ~daemon_proc() {
    if (ready_fd_ >= 0) close(ready_fd_);
    stop();
    // A daemon the test killed (or stop() had to kill) leaves its pools behind; reclaim them as
    // a restarted ferryd would. Only dead instances are touched, never another test's.
    ferry::reclaim_dead_instances(name_);
  }

  /// Start again with the same config (same addresses; a new instance id), after stop/kill.
  void restart() {
    REQUIRE(pid_ <= 0);
    start();
  }

  /// Send a signal (SIGSTOP, SIGCONT, SIGKILL...); after SIGKILL the process is reaped.
  void signal(int sig) {
    REQUIRE(pid_ > 0);
    REQUIRE(::kill(pid_, sig) == 0);
    if (sig == SIGKILL) {
      int st = 0;
      waitpid(pid_, &st, 0);
      pid_ = -1;
      exit_status_ = -1;
    }
  }

 private:
  void write_config() {
    std::ofstream(config_) << make_config(name_, role_, control_port_, socket_, shape_);
  }

  /// Fork and exec ferryd with a pipe on descriptor 3 that it writes to once ready.
  void launch() {
    logged_ = log_text().size();  // the log is appended to: this start's lines begin here
    int ready[2];
    REQUIRE(pipe2(ready, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      int log_fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
      dup2(ready[1], 3);  // dup2 clears O_CLOEXEC on the copy
      // Join the host's namespace: same pid, nothing in between.
      if (!netns_path_.empty()) {
        int ns = open(netns_path_.c_str(), O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
          dprintf(2, "cannot enter %s: %s\n", netns_path_.c_str(), strerror(errno));
          _exit(126);
        }
        close(ns);
      }
      if (shape_.nofile_hard) {
        rlimit rl{shape_.nofile_soft, shape_.nofile_hard};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(125);
      }
      for (const auto& [k, v] : shape_.env) setenv(k.c_str(), v.c_str(), 1);
      auto path = bin("ferryd");
      execl(path.c_str(), "ferryd", "--config", config_.c_str(), "--ready-fd", "3",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(ready[1]);
    ready_fd_ = ready[0];
  }

  /// True once the launched daemon said it is ready (false: it exited, or 30 s passed; then it
  /// is stopped).
  bool ready() {
    REQUIRE(ready_fd_ >= 0);  // launched and not yet waited for
    pollfd p{ready_fd_, POLLIN, 0};
    char buf[16] = {};
    int n = ::poll(&p, 1, 30000);
    ssize_t got = n > 0 ? read(ready_fd_, buf, sizeof(buf)) : 0;
    close(ready_fd_);
    ready_fd_ = -1;
    if (got <= 0) stop();
    return got > 0;
  }

  void start() {
    launch();
    if (!ready()) FAIL("ferryd " << name_ << " did not become ready; log:\n" << log_text());
  }

 public:
  /// Stop at once: SIGTERM and SIGINT together (the first begins a drain, the second ends it);
  /// returns the exit status (or -1 when it had to be killed). The forced stop asked for is
  /// what happened: its exit_code::forced_stop (rooms were still active) is returned as 0.
  /// tests/e2e/test_drain.cpp checks that code itself, with signal() and wait_exit().
  int stop() {
    if (pid_ <= 0) return exit_status_;
    kill(pid_, SIGTERM);
    kill(pid_, SIGINT);
    kill(pid_, SIGCONT);  // a SIGSTOPped daemon must run to handle them
    const int rc = wait_exit(15000);
    return rc == exit_code::forced_stop ? exit_code::ok : rc;
  }

  /// Begin a stop that drains (SIGTERM alone: the rooms accepted before it may finish).
  void drain() {
    if (pid_ > 0) kill(pid_, SIGTERM);
  }

  /// Wait for the process to exit (killed after `ms`); its exit status, -1 when killed.
  int wait_exit(int ms = 60000) {
    if (pid_ <= 0) return exit_status_;
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    pollfd p{pidfd, POLLIN, 0};
    if (pidfd < 0 || ::poll(&p, 1, ms) <= 0) kill(pid_, SIGKILL);
    if (pidfd >= 0) close(pidfd);
    int st = 0;
    waitpid(pid_, &st, 0);
    exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    pid_ = -1;
    if (exit_status_ != 0) {  // shown with the next assertion: why (a sanitizer report, ...)
      const std::string text = log_text();
      const size_t keep = 12000;
      UNSCOPED_INFO("ferryd " << name_ << " exited with " << exit_status_ << "; its log ends:\n"
                              << (text.size() > keep ? text.substr(text.size() - keep) : text));
    }
    return exit_status_;
  }

  std::string log_text() const {
    std::ifstream f(log_);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  std::unique_ptr<client::client> connect(uint16_t max_version = proto::protocol_version) const {
    auto c = client::client::connect(socket_, "test", std::chrono::seconds(10), true, max_version);
    INFO(c.message);
    REQUIRE(c);
    REQUIRE(c.value->map_pools());
    return std::move(c.value);
  }

  const std::string& socket() const { return socket_; }
  const std::string& config_path() const { return config_; }
  std::string control() const { return shape_.host + ":" + std::to_string(control_port_); }
  uint16_t control_port() const { return control_port_; }
  pid_t pid() const { return pid_; }

 private:
  std::string name_, role_;
  shape shape_;  ///< what its config is written from, and its environment and limits
  std::string netns_path_, socket_, config_, log_;
  bool fixed_port_;
  uint16_t control_port_;
  size_t logged_ = 0;
  int ready_fd_ = -1;
  pid_t pid_ = -1;
  int exit_status_ = -1;
};

/// Wait for daemons started with launch_only, in order.
template <class... D>
void await_ready(D&... daemons) {
  (daemons.await_ready(), ...);
}

/// A cluster secret file `name` in `dir` holding `text` (mode 0600, as ferryd requires); its path.
inline std::string write_secret(const temp_dir& dir, const std::string& name,
                                const std::string& text) {
  auto path = (dir.path / name).string();
  std::ofstream(path) << text << "\n";
  REQUIRE(chmod(path.c_str(), 0600) == 0);
  return path;
}

/// Wait (bounded: 10 s) until `d`'s log holds `text`; whether it did. (ferryd's log is a file
/// it appends to; nothing to wait on but its contents.)
inline bool log_shows(const daemon_proc& d, const std::string& text) {
  for (int i = 0; i < 400; ++i) {
    if (d.log_text().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

/// Run ferryd with `args` to its exit (bounded: killed after `limit`); its exit code (-1 when
/// killed; core/exit_codes.hpp) and its output. `before_exec` runs in the child (e.g. to enter a
/// mount namespace).
struct run_result {
  int code = -1;
  std::string output;
};
template <class F = void (*)()>
run_result run_ferryd(
    const std::vector<std::string>& args, const std::filesystem::path& out,
    std::chrono::milliseconds limit = 30s, F before_exec = [] {}) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    before_exec();
    std::vector<char*> argv{const_cast<char*>("ferryd")};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    auto path = bin("ferryd");
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  pollfd p{pidfd, POLLIN, 0};
  if (pidfd < 0 || ::poll(&p, 1, static_cast<int>(limit.count())) <= 0) kill(pid, SIGKILL);
  if (pidfd >= 0) close(pidfd);
  int st = 0;
  waitpid(pid, &st, 0);
  std::ifstream f(out);
  std::stringstream s;
  s << f.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, s.str()};
}

/// Names in /dev/shm that start with `prefix`, sorted.
inline std::vector<std::string> shm_names(const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    auto n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ferry::test
