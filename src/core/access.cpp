#include "core/access.hpp"

#include <endian.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grp.h>
#include <linux/posix_acl.h>
#include <linux/posix_acl_xattr.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace ferry {
namespace {

/// `s` as a numeric id, when it is one (all digits, below the invalid id (uid_t)-1).
std::optional<uint32_t> numeric_id(const std::string& s) {
  uint32_t id = 0;
  const auto* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, id);
  if (s.empty() || ec != std::errc() || ptr != end || id == uint32_t(-1)) return std::nullopt;
  return id;
}

/// getpwnam_r / getgrnam_r with a buffer that grows while they ask for more.
template <class Entry, class Lookup>
const Entry* look_up(const std::string& name, Entry& entry, std::vector<char>& buf, Lookup lookup) {
  for (buf.resize(16384);; buf.resize(buf.size() * 2)) {
    Entry* found = nullptr;
    const int rc = lookup(name.c_str(), &entry, buf.data(), buf.size(), &found);
    if (rc == ERANGE && buf.size() < (1u << 24)) continue;
    return rc == 0 ? found : nullptr;
  }
}

void add_once(std::vector<uint32_t>& ids, uint32_t id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

bool has(const std::vector<uint32_t>& ids, uint32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

/// The value of a `system.posix_acl_access` attribute (the kernel's format,
/// linux/posix_acl_xattr.h): the owner and every named user and group read-write, the owning
/// group and others nothing. Entries in the order the kernel requires: by tag, then by id.
std::vector<uint8_t> acl_xattr(const client_access& access) {
  std::vector<uint8_t> out;
  auto put = [&](uint16_t tag, uint16_t perm, uint32_t id) {
    const posix_acl_xattr_entry e{htole16(tag), htole16(perm), htole32(id)};
    const auto* p = reinterpret_cast<const uint8_t*>(&e);
    out.insert(out.end(), p, p + sizeof e);
  };
  const posix_acl_xattr_header h{htole32(POSIX_ACL_XATTR_VERSION)};
  out.assign(reinterpret_cast<const uint8_t*>(&h), reinterpret_cast<const uint8_t*>(&h) + sizeof h);
  constexpr uint16_t rw = ACL_READ | ACL_WRITE;
  constexpr auto none = uint32_t(ACL_UNDEFINED_ID);
  auto uids = access.uids, gids = access.gids;
  std::sort(uids.begin(), uids.end());
  std::sort(gids.begin(), gids.end());
  put(ACL_USER_OBJ, rw, none);
  for (const auto u : uids) put(ACL_USER, rw, u);
  put(ACL_GROUP_OBJ, 0, none);
  for (const auto g : gids) put(ACL_GROUP, rw, g);
  put(ACL_MASK, rw, none);
  put(ACL_OTHER, 0, none);
  return out;
}

}  // namespace

std::optional<uint32_t> client_access::sole_group() const {
  if (uids.empty() && gids.size() == 1) return gids.front();
  return std::nullopt;
}

result<uint32_t> resolve_user(const std::string& user) {
  if (auto id = numeric_id(user)) return *id;
  passwd entry{};
  std::vector<char> buf;
  if (const auto* found = look_up(user, entry, buf, getpwnam_r)) return uint32_t{found->pw_uid};
  return error{errc::config_invalid,
               fmt::format("no user \"{}\" on this host (give a user name it knows, or a numeric "
                           "uid)",
                           user)};
}

result<uint32_t> resolve_group(const std::string& group) {
  if (auto id = numeric_id(group)) return *id;
  struct group entry {};
  std::vector<char> buf;
  if (const auto* found = look_up(group, entry, buf, getgrnam_r)) return uint32_t{found->gr_gid};
  return error{errc::config_invalid,
               fmt::format("no group \"{}\" on this host (give a group name it knows, or a "
                           "numeric gid)",
                           group)};
}

result<client_access> resolve_client_access(const security_config& security) {
  client_access a;
  for (size_t i = 0; i < security.client_users.size(); ++i) {
    auto uid = resolve_user(security.client_users[i]);
    if (!uid) return error{uid.code, fmt::format("security.client_users[{}]: {}", i, uid.message)};
    add_once(a.uids, uid.value);
  }
  for (size_t i = 0; i < security.client_groups.size(); ++i) {
    auto gid = resolve_group(security.client_groups[i]);
    if (!gid) return error{gid.code, fmt::format("security.client_groups[{}]: {}", i, gid.message)};
    add_once(a.gids, gid.value);
  }
  return a;
}

result<peer_credentials> credentials_of(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return error{errc::system_error,
                 std::string("getsockopt(SO_PEERCRED) failed: ") + std::strerror(errno)};
  peer_credentials p;
  p.pid = static_cast<uint32_t>(cred.pid);
  p.uid = cred.uid;
  p.gid = cred.gid;
  // Supplementary groups as at connect() (Linux 4.13 and later; without it, none count).
  std::vector<gid_t> groups(64);
  for (;;) {
    len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      break;
    }
    if (errno != ERANGE || len / sizeof(gid_t) <= groups.size()) {
      groups.clear();
      break;
    }
    groups.resize(len / sizeof(gid_t));
  }
  p.groups.assign(groups.begin(), groups.end());
  return p;
}

bool admitted(const client_access& access, uint32_t self_uid, const peer_credentials& peer) {
  if (peer.uid == 0 || peer.uid == self_uid || has(access.uids, peer.uid)) return true;
  if (has(access.gids, peer.gid)) return true;
  return std::any_of(peer.groups.begin(), peer.groups.end(),
                     [&](uint32_t g) { return has(access.gids, g); });
}

std::string access_denied_reason(const peer_credentials& peer) {
  return fmt::format(
      "access denied: uid {} (gid {}, pid {}) may not use this ferryd; to admit it, add the uid "
      "to security.client_users or one of its groups to security.client_groups in ferryd's "
      "config",
      peer.uid, peer.gid, peer.pid);
}

std::string describe_access(const security_config& security, const client_access& access,
                            uint32_t self_uid) {
  if (!access.anyone_named())
    return fmt::format(
        "ferryd's own user (uid {}) and root alone may connect and map the pools (socket 0700, "
        "pools 0600; security.client_users and security.client_groups are not set)",
        self_uid);
  std::string who = fmt::format("ferryd's own user (uid {}), root", self_uid);
  if (!access.uids.empty())
    who += fmt::format(", users {} (uids {}; security.client_users)",
                       fmt::join(security.client_users, ", "), fmt::join(access.uids, ", "));
  if (!access.gids.empty())
    who += fmt::format(", members of groups {} (gids {}; security.client_groups)",
                       fmt::join(security.client_groups, ", "), fmt::join(access.gids, ", "));
  if (auto g = access.sole_group())
    return who + fmt::format(
                     " may connect and map the pools (socket and pools: group {}, mode "
                     "0660)",
                     *g);
  return who +
         " may connect and map the pools (socket 0666, every connection checked with "
         "SO_PEERCRED; pools 0600 with a POSIX ACL entry for each user and group)";
}

result<> share_socket_file(const client_access& access, const std::string& path) {
  if (!access.anyone_named()) return {};
  auto failed = [&](const std::string& call) {
    return error{errc::system_error, fmt::format("cannot open client socket '{}' to "
                                                 "security.client_users/client_groups: {}: {}",
                                                 path, call, std::strerror(errno))};
  };
  if (auto g = access.sole_group()) {
    // The group first, while the mode still shuts everyone but ferryd's user out.
    if (chown(path.c_str(), uid_t(-1), *g) != 0)
      return failed(fmt::format("chown to gid {} (is ferryd's user a member of it?)", *g));
    if (chmod(path.c_str(), 0660) != 0) return failed("chmod 0660");
    return {};
  }
  // Anyone may connect; the SO_PEERCRED check at accept decides who is served.
  if (chmod(path.c_str(), 0666) != 0) return failed("chmod 0666");
  return {};
}

result<> share_shm_object(const client_access& access, int fd) {
  if (!access.anyone_named()) return {};
  if (auto g = access.sole_group()) {
    if (fchown(fd, uid_t(-1), *g) != 0)
      return error{errc::system_error,
                   fmt::format("fchown to gid {} failed (is ferryd's user a member of it?): {}", *g,
                               std::strerror(errno))};
    if (fchmod(fd, 0660) != 0)
      return error{errc::system_error, std::string("fchmod 0660 failed: ") + std::strerror(errno)};
    return {};
  }
  const auto acl = acl_xattr(access);
  if (fsetxattr(fd, "system.posix_acl_access", acl.data(), acl.size(), 0) != 0)
    return error{errc::system_error,
                 fmt::format("setting its POSIX ACL failed: {} (several users or groups need "
                             "ACLs on /dev/shm; name one group alone in security.client_groups "
                             "instead, and no user)",
                             std::strerror(errno))};
  return {};
}

}  // namespace ferry
