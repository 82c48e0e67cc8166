#pragma once
/// RAII owners for libfabric objects and small helpers shared by the transport.
///
/// Every `fid_*` is held by a `std::unique_ptr` whose deleter calls `fi_close`, so a class that
/// declares its handles in open order (fabric, domain, av, mr, cq, ep) closes them in the order
/// libfabric requires (ep, cq, mr, av, domain, fabric) without hand-written cleanup.

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "core/errors.hpp"

namespace ferry::transport {

/// Deleter closing any libfabric object that has an embedded `fid` member.
template <class T>
struct fid_closer {
  void operator()(T* p) const noexcept {
    // fi_close can only fail for objects still in use (e.g. a domain with open endpoints),
    // which member declaration order rules out; there is nothing useful to do on failure.
    if (p != nullptr) fi_close(&p->fid);
  }
};

/// Owning pointer to a libfabric object, closed with `fi_close`.
template <class T>
using fid_ptr = std::unique_ptr<T, fid_closer<T>>;

using fabric_ptr = fid_ptr<fid_fabric>;
using domain_ptr = fid_ptr<fid_domain>;
using av_ptr = fid_ptr<fid_av>;
using mr_ptr = fid_ptr<fid_mr>;
using cq_ptr = fid_ptr<fid_cq>;
using ep_ptr = fid_ptr<fid_ep>;

/// Deleter for `fi_info` lists (from `fi_getinfo`, `fi_allocinfo` or `fi_dupinfo`).
struct info_freer {
  void operator()(fi_info* p) const noexcept {
    if (p != nullptr) fi_freeinfo(p);
  }
};

/// Owning pointer to an `fi_info` list.
using info_ptr = std::unique_ptr<fi_info, info_freer>;

/// Owning POSIX file descriptor (eventfd, epoll). -1 = empty.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  /// The descriptor, or -1.
  int get() const { return fd_; }
  /// Give up ownership without closing.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Close the current descriptor (if any) and own `fd`.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

/// "call: fi_strerror text (code)" for a negative libfabric return code.
inline std::string fi_error_text(const char* call, long long rc) {
  const int err = static_cast<int>(rc < 0 ? -rc : rc);
  return std::string(call) + ": " + fi_strerror(err) + " (" + std::to_string(rc) + ")";
}

/// The errc of a libfabric return code (-FI_E*) or completion error (FI_E*): what a caller can
/// act on. The fabric unable to serve, a peer gone, a wait expired, a cancellation and memory
/// exhaustion have codes of their own; anything else is `otherwise`, the call's own failure.
inline errc errc_of_fi(long long rc, errc otherwise) {
  switch (static_cast<int>(rc < 0 ? -rc : rc)) {
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
    case FI_ENODEV:
      return errc::fabric_unavailable;
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ESHUTDOWN:
      return errc::peer_lost;
    case FI_ETIMEDOUT:
      return errc::timed_out;
    case FI_ECANCELED:
      return errc::cancelled;
    case FI_ENOMEM:
      return errc::system_error;
    default:
      return otherwise;
  }
}

/// The error of a failed libfabric call, coded by `errc_of_fi`.
inline error fi_error(const char* call, long long rc, errc otherwise) {
  return {errc_of_fi(rc, otherwise), fi_error_text(call, rc)};
}

}  // namespace ferry::transport
