#include "os/daemon_locks.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

namespace ferry {
namespace {

constexpr const char* shm_dir = "/dev/shm";
constexpr const char* pool_suffixes[] = {".kv", ".state", ".aux"};

/// Does `fd` still name the file at `path` (not one unlinked or replaced meanwhile)?
bool same_file(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

std::string read_all(int fd) {
  std::string s;
  char buf[256];
  ssize_t n;
  off_t at = 0;
  while ((n = pread(fd, buf, sizeof(buf), at)) > 0 && s.size() < 4096) {
    s.append(buf, static_cast<size_t>(n));
    at += n;
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

daemon_lock::daemon_lock(daemon_lock&& o) noexcept { *this = std::move(o); }

daemon_lock& daemon_lock::operator=(daemon_lock&& o) noexcept {
  if (this != &o) {
    this->~daemon_lock();
    fd_ = std::exchange(o.fd_, -1);
    unlink_path_ = std::move(o.unlink_path_);
    o.unlink_path_.clear();
  }
  return *this;
}

daemon_lock::~daemon_lock() {
  if (fd_ < 0) return;
  if (!unlink_path_.empty()) unlink(unlink_path_.c_str());  // still held: nobody reclaims it
  close(fd_);
  fd_ = -1;
}

result<daemon_lock> lock_config(const std::string& client_socket, const std::string& node,
                                const std::string& instance) {
  const auto path = client_socket + ".lock";
  // The holder unlinks the file as it lets go, so a lock taken on a file that is no longer at
  // `path` (its holder stopped between this open and this flock) is taken again on the new
  // one: every ferryd with this config contends for the one inode at `path`.
  int fd = -1, e = 0;
  for (int attempt = 0;; ++attempt) {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      const error failure{errc::system_error, fmt::format("cannot open the config lock {}: {}",
                                                          path, std::strerror(errno))};
      return failure;
    }
    e = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
    if (e != 0 || same_file(fd, path) || attempt == 100) break;
    close(fd);
  }
  if (e != 0) {
    auto holder = read_all(fd);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    close(fd);
    if (e != EWOULDBLOCK) {
      const error failure{errc::system_error,
                          fmt::format("cannot lock {}: {}", path, std::strerror(e))};
      return failure;
    }
    const error failure{errc::system_error,
                        fmt::format("another ferryd ({}) is running with listen.client {} (it "
                                    "holds {}); this one exits and "
                                    "touches nothing of it",
                                    holder.empty() ? "pid unknown: it is still starting" : holder,
                                    client_socket, path)};
    return failure;
  }
  const auto me = fmt::format("pid {}, node {}, instance {}\n", getpid(), node, instance);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) < 0) {
    const error failure{errc::system_error, fmt::format("cannot write the config lock {}: {}", path,
                                                        std::strerror(errno))};
    close(fd);
    return failure;
  }
  daemon_lock l;
  l.fd_ = fd;
  l.unlink_path_ = path;  // removed at a clean stop; a crash leaves it, unheld and harmless
  return l;
}

result<daemon_lock> lock_instance(const std::string& node, const std::string& instance) {
  const auto name = fmt::format("ferry.{}.{}.lock", node, instance);
  const auto path = fmt::format("{}/{}", shm_dir, name);
  // Created under a temporary name, locked, then renamed into place: a scanner never sees the
  // lock unheld between its creation and its flock.
  const auto tmp = fmt::format("{}/.{}.{}", shm_dir, name, getpid());
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const error failure{errc::system_error, fmt::format("cannot create the instance lock {}: {}",
                                                        tmp, std::strerror(errno))};
    return failure;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    const error failure{errc::system_error, fmt::format("cannot take the instance lock {}: {}",
                                                        path, std::strerror(errno))};
    unlink(tmp.c_str());
    close(fd);
    return failure;
  }
  const auto me = fmt::format("pid {}\n", getpid());
  [[maybe_unused]] auto n = pwrite(fd, me.data(), me.size(), 0);
  daemon_lock l;
  l.fd_ = fd;
  l.unlink_path_ = path;
  return l;
}

std::vector<reclaimed_instance> reclaim_dead_instances(const std::string& node) {
  const std::string prefix = "ferry." + node + ".";
  // instance -> has a lock file; pool objects seen
  std::map<std::string, bool> instances;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(shm_dir, ec)) {
    const auto n = e.path().filename().string();
    if (n.rfind(prefix, 0) != 0) continue;
    for (const char* tail : {".lock", ".kv", ".state", ".aux"}) {
      if (!ends_with(n, tail) || n.size() <= prefix.size() + std::strlen(tail)) continue;
      auto inst = n.substr(prefix.size(), n.size() - prefix.size() - std::strlen(tail));
      instances[inst] |= std::string(tail) == ".lock";
    }
  }
  std::vector<reclaimed_instance> out;
  for (const auto& [inst, has_lock] : instances) {
    const auto base = fmt::format("{}/{}{}", shm_dir, prefix, inst);
    int fd = -1;
    if (has_lock) {
      fd = open((base + ".lock").c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;  // gone meanwhile: its owner stopped cleanly
      if (flock(fd, LOCK_EX | LOCK_NB) != 0 || !same_file(fd, base + ".lock")) {
        close(fd);  // alive (or a new lock of the same name): not ours to touch
        continue;
      }
    } else if (std::filesystem::exists(base + ".lock", ec)) {
      continue;  // its lock appeared after the listing: a daemon that is starting
    }
    reclaimed_instance r;
    r.instance = inst;
    for (const char* tail : pool_suffixes) {
      const auto path = base + tail;
      struct stat st {};
      if (stat(path.c_str(), &st) != 0) continue;
      if (unlink(path.c_str()) == 0) {
        r.objects.push_back(fmt::format("/{}{}{}", prefix, inst, tail));
        r.bytes += static_cast<uint64_t>(st.st_size);
      }
    }
    if (fd >= 0) {
      unlink((base + ".lock").c_str());
      close(fd);
    }
    if (!r.objects.empty()) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ferry
