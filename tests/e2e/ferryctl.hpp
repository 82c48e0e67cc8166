#pragma once
// Run the real ferryctl binary against a daemon's client socket, to its exit (bounded).

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness.hpp"

namespace ferry::test {

struct ctl_result {
  int code = -1;
  std::string out, err;
};

/// Run `ferryctl -s SOCKET args...` to its exit (bounded); its exit code, stdout and stderr.
inline ctl_result ferryctl(const temp_dir& dir, const std::string& socket,
                           const std::vector<std::string>& args) {
  static int n = 0;
  const auto out = dir.path / ("ferryctl." + std::to_string(++n) + ".out");
  const auto err = dir.path / ("ferryctl." + std::to_string(n) + ".err");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    std::vector<std::string> all{"ferryctl", "-s", socket};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin("ferryctl").c_str(), argv.data());
    _exit(127);
  }
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  pollfd p{pidfd, POLLIN, 0};
  if (pidfd < 0 || ::poll(&p, 1, 60000) <= 0) kill(pid, SIGKILL);
  if (pidfd >= 0) close(pidfd);
  int st = 0;
  waitpid(pid, &st, 0);
  auto read = [](const std::filesystem::path& f) {
    std::ifstream in(f);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read(out), read(err)};
}

}  // namespace ferry::test
