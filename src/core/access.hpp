#pragma once
/// Who may use a ferryd's client socket and map its pools (docs/operations.md, "Users"):
/// ferryd's own user and root always, and the users of `security.client_users` and the members
/// of `security.client_groups` (as their primary group or a supplementary one) when the config
/// names them. Every accepted client connection is checked against that with the credentials the
/// kernel recorded at its connect() (SO_PEERCRED, SO_PEERGROUPS), before a byte of it is read.
/// The socket file and the pools' shm objects are opened up only as far as that needs:
/// - nobody named: the socket is 0700 and the pools 0600, ferryd's user alone;
/// - one group and no user: both belong to that group with mode 0660 (the kernel itself then
///   refuses the connect() of a process outside it, with EACCES);
/// - otherwise: the socket is 0666, so the SO_PEERCRED check is its gate (anyone else gets an
///   `access_denied` error frame and is closed), and the pools stay 0600 with a POSIX ACL that
///   grants read-write to each named user and group: an shm object has no gate of its own.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config_types.hpp"
#include "core/errors.hpp"

namespace ferry {

/// security.client_users and security.client_groups, resolved to numeric ids (each once).
struct client_access {
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;

  bool anyone_named() const { return !uids.empty() || !gids.empty(); }
  /// The group the socket and the pools are given to, with mode 0660: one group named, no user.
  std::optional<uint32_t> sole_group() const;
};

/// A user name this host knows (getpwnam_r), or a numeric uid (it need not have a name).
result<uint32_t> resolve_user(const std::string& user);
/// A group name this host knows (getgrnam_r), or a numeric gid.
result<uint32_t> resolve_group(const std::string& group);
/// Both lists resolved; an error (`config_invalid`) names the key and the entry, e.g.
/// `security.client_users[1]: no user "bob" on this host (...)`.
result<client_access> resolve_client_access(const security_config& security);

/// The process at the other end of a unix socket, as the kernel recorded it at connect().
struct peer_credentials {
  uint32_t pid = 0, uid = 0, gid = 0;
  std::vector<uint32_t> groups;  ///< supplementary groups (SO_PEERGROUPS)
};
result<peer_credentials> credentials_of(int fd);

/// Whether `peer` may use this daemon, whose effective uid is `self_uid`.
bool admitted(const client_access& access, uint32_t self_uid, const peer_credentials& peer);
/// What a refused client is told (and the log says): its ids and the keys that would admit it.
std::string access_denied_reason(const peer_credentials& peer);

/// Who may connect and how the socket and pools are opened up, for the start-up log.
std::string describe_access(const security_config& security, const client_access& access,
                            uint32_t self_uid);

/// Open the bound socket file `path` to the named users and groups (mode and group as above).
result<> share_socket_file(const client_access& access, const std::string& path);
/// Open the new shm object `fd` to them (group and mode 0660, or a POSIX ACL as above).
result<> share_shm_object(const client_access& access, int fd);

}  // namespace ferry
