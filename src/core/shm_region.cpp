#include "core/shm_region.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace ferry {

shm_region& shm_region::operator=(shm_region&& o) noexcept {
  if (this != &o) {
    release();  // not the destructor: name_ stays a live string to be assigned to
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    owner_ = std::exchange(o.owner_, false);
  }
  return *this;
}

shm_region::~shm_region() { release(); }

void shm_region::release() noexcept {
  if (data_) munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

result<shm_region> shm_region::create(const std::string& name, uint64_t bytes,
                                      const std::function<result<>(int fd)>& share) {
  shm_region r;
  shm_unlink(name.c_str());  // a stale object from a crashed daemon with the same name
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const error failure{errc::system_error,
                        fmt::format("shm_open('{}') failed: {}", name, std::strerror(errno))};
    return failure;
  }
  if (share) {
    if (auto shared = share(fd); !shared) {
      const error failure{shared.code, fmt::format("cannot open shm object '{}' to the clients' "
                                                   "users: {}",
                                                   name, shared.message)};
      close(fd);
      shm_unlink(name.c_str());
      return failure;
    }
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const error failure{errc::system_error, fmt::format("ftruncate('{}', {} bytes) failed: {}",
                                                        name, bytes, std::strerror(errno))};
    close(fd);
    shm_unlink(name.c_str());
    return failure;
  }
  // Reserve every byte now. A tmpfs page is otherwise allocated at its first touch, and a
  // /dev/shm that cannot back it then kills the process with SIGBUS in the middle of a transfer
  // (MAP_POPULATE does not report that it could not populate).
  struct statvfs fs {};
  const uint64_t free_before =
      fstatvfs(fd, &fs) == 0 ? uint64_t{fs.f_bavail} * fs.f_frsize : uint64_t{0};
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    const error failure{
        errc::system_error,
        fmt::format("/dev/shm cannot hold {}: it needs {} bytes and /dev/shm has {} "
                    "bytes free; posix_fallocate: {}",
                    name, bytes, free_before, std::strerror(rc))};
    close(fd);
    shm_unlink(name.c_str());
    return failure;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    const error failure{errc::system_error, fmt::format("mmap('{}', {} bytes) failed: {}", name,
                                                        bytes, std::strerror(errno))};
    shm_unlink(name.c_str());
    return failure;
  }
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = bytes;
  r.name_ = name;
  r.owner_ = true;
  return r;
}

result<shm_region> shm_region::open(const std::string& name, uint64_t bytes) {
  shm_region r;
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const error failure{errc::system_error,
                        fmt::format("shm_open('{}') failed: {}", name, std::strerror(errno))};
    return failure;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    const error failure{errc::system_error,
                        fmt::format("shm object '{}' is {} bytes, expected at least {}", name,
                                    static_cast<uint64_t>(st.st_size), bytes)};
    close(fd);
    return failure;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    const error failure{errc::system_error, fmt::format("mmap('{}', {} bytes) failed: {}", name,
                                                        bytes, std::strerror(errno))};
    return failure;
  }
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = bytes;
  r.name_ = name;
  return r;
}

}  // namespace ferry
