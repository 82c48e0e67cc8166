// systemd's readiness protocol without systemd (os/sd_notify.hpp): the test owns the
// NOTIFY_SOCKET datagram socket. READY=1 comes once ferryd serves clients (a client connecting
// the moment it arrives gets its hello answered), never from a ferryd that fails before that, and
// SIGTERM brings STOPPING=1 before a clean exit.

#include <sys/un.h>

#include "core/exit_codes.hpp"
#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// A unix datagram socket bound in `dir`, as systemd's notify socket.
struct notify_socket {
  std::string path;
  int fd = -1;
  explicit notify_socket(const temp_dir& dir) : path((dir.path / "notify.sock").string()) {
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    REQUIRE(path.size() < sizeof a.sun_path);
    std::strcpy(a.sun_path, path.c_str());
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~notify_socket() { close(fd); }
  /// The next notification, or "" when none came within `limit` or `pidfd` (>= 0) says the
  /// process exited and nothing is queued.
  std::string next(std::chrono::milliseconds limit, int pidfd = -1) {
    pollfd p[2] = {{fd, POLLIN, 0}, {pidfd, POLLIN, 0}};
    if (::poll(p, pidfd >= 0 ? 2 : 1, static_cast<int>(limit.count())) <= 0) return {};
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
};

/// ferryd --config `config` with NOTIFY_SOCKET=`notify` (no --ready-fd), output to `log`.
pid_t start_ferryd(const std::string& config, const std::string& notify, const std::string& log) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("NOTIFY_SOCKET", notify.c_str(), 1);
    const auto path = bin("ferryd");
    execl(path.c_str(), "ferryd", "--config", config.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Waits (bounded) for `pid` to exit; its exit code, or -1 when it had to be killed.
int reap(pid_t pid, int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  if (::poll(&p, 1, 30000) <= 0) kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("ferryd sends READY=1 once it serves clients and STOPPING=1 at SIGTERM",
          "[e2e][sd-notify]") {
  temp_dir dir;
  notify_socket notify(dir);
  shape s;
  s.pages = 64;
  s.slots = 2;
  const auto sock = (dir.path / "d.sock").string(), config = (dir.path / "d.yaml").string();
  const auto log = (dir.path / "d.log").string();
  std::ofstream(config) << make_config("notify-d", "decode", free_port(), sock, s);
  const pid_t pid = start_ferryd(config, notify.path, log);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  REQUIRE(pidfd >= 0);

  std::string ready = notify.next(60s, pidfd);
  INFO(read_file(log));
  REQUIRE_THAT(ready, Catch::StartsWith("READY=1\nSTATUS=serving: provider tcp"));
  CHECK_THAT(ready, Catch::EndsWith("clients on " + sock));
  // Told ready, a client is served at once: the hello is answered with the pools.
  auto c = client::client::connect(sock, "notify-test", 10s);
  REQUIRE(c);
  CHECK(c.value->daemon().pools[static_cast<int>(pool_kind::kv)].present);
  c.value.reset();

  REQUIRE(kill(pid, SIGTERM) == 0);
  const std::string stopping = notify.next(30s, pidfd);
  CHECK(stopping == "STOPPING=1\nSTATUS=stopping: draining the rooms accepted before the signal");
  CHECK(reap(pid, pidfd) == 0);
  close(pidfd);
  CHECK(notify.next(0ms).empty());  // nothing after STOPPING=1
}

TEST_CASE("a ferryd that fails at its last start-up step never sends READY=1", "[e2e][sd-notify]") {
  temp_dir dir;
  notify_socket notify(dir);
  // The peer port is the last thing ferryd opens before it serves (its pools, engine and client
  // socket are there by then): a port this test holds makes exactly that step fail.
  const held_port held;
  shape s;
  s.pages = 64;
  s.slots = 2;
  const auto sock = (dir.path / "d.sock").string(), config = (dir.path / "d.yaml").string();
  const auto log = (dir.path / "d.log").string();
  std::ofstream(config) << make_config("notify-fail", "decode", held.port, sock, s);
  const pid_t pid = start_ferryd(config, notify.path, log);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  REQUIRE(pidfd >= 0);
  CHECK(reap(pid, pidfd) == exit_code::could_not_start);
  close(pidfd);
  const auto text = read_file(log);
  INFO(text);
  CHECK(text.find("cannot listen for peers on 127.0.0.1:" + std::to_string(held.port)) !=
        std::string::npos);
  CHECK(text.find("ready:") == std::string::npos);
  for (std::string m; !(m = notify.next(0ms)).empty();)
    CHECK(m.find("READY=1") == std::string::npos);
  reclaim_dead_instances("notify-fail");
}
