#include "ferry/client.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

namespace ferry::client {

namespace {

/// A policy field outside its bounds, named.
std::optional<error> check_policy(const reconnect_policy& p) {
  using std::chrono::milliseconds;
  constexpr milliseconds limit = std::chrono::minutes(10);
  auto bad = [](const std::string& what) {
    return error{errc::invalid_request, "reconnect_policy: " + what};
  };
  if (p.initial_delay.count() < 0 || p.initial_delay > p.max_delay)
    return bad(fmt::format("needs 0 <= initial_delay <= max_delay, got {} ms and {} ms",
                           p.initial_delay.count(), p.max_delay.count()));
  if (p.max_delay > limit)
    return bad(
        fmt::format("max_delay is {} ms; at most {} ms", p.max_delay.count(), limit.count()));
  if (!(p.multiplier >= 1.0 && p.multiplier <= 100.0))
    return bad(fmt::format("multiplier is {}; it must be in [1, 100]", p.multiplier));
  if (p.call_wait.count() < 0 || p.call_wait > limit)
    return bad(fmt::format("call_wait is {} ms; it must be in [0, {}] ms", p.call_wait.count(),
                           limit.count()));
  if (p.attempt_timeout.count() < 1 || p.attempt_timeout > limit)
    return bad(fmt::format("attempt_timeout is {} ms; it must be in [1, {}] ms",
                           p.attempt_timeout.count(), limit.count()));
  return std::nullopt;
}

}  // namespace

client::~client() {
  if (fd_ >= 0) close(fd_);
  for (auto& r : registrations_)
    for (int fd : r.fds) close(fd);
}

result<std::unique_ptr<client>> client::connect(const std::string& socket_path,
                                                const std::string& name,
                                                std::chrono::milliseconds timeout,
                                                bool cancel_on_disconnect, uint16_t max_version) {
  connect_options o;
  o.name = name;
  o.timeout = timeout;
  o.cancel_on_disconnect = cancel_on_disconnect;
  o.max_version = max_version;
  return connect(socket_path, o);
}

result<std::unique_ptr<client>> client::connect(const std::string& socket_path,
                                                const connect_options& options) {
  if (options.reconnect)
    if (auto e = check_policy(*options.reconnect)) return *e;
  std::unique_ptr<client> c(new client());
  c->socket_path_ = socket_path;
  c->name_ = options.name;
  c->cancel_on_disconnect_ = options.cancel_on_disconnect;
  c->max_version_ = options.max_version;
  c->policy_ = options.reconnect;
  if (auto h = c->handshake(options.timeout); !h) return std::move(h).error();
  result<std::unique_ptr<client>> o;
  o.value = std::move(c);
  return o;
}

result<none> client::handshake(std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  if (socket_path_.size() >= sizeof(addr.sun_path))
    return error{errc::invalid_request, "socket path is too long: " + socket_path_};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  uint16_t hi = max_version_;
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int err = errno;
      if (fd >= 0) close(fd);
      return error{errc::peer_unreachable, fmt::format("cannot connect to ferryd at '{}': {}",
                                                       socket_path_, std::strerror(err))};
    }
    fd_ = fd;
    lost_ = false;
    draining_ = false;
    reader_ = proto::frame_reader{};
    session_ = proto::client_session(hi);
    const bool was_attempting = attempting_;
    attempting_ = true;  // a loss during the hello fails the hello only
    auto fail = [&](error e) -> result<none> {
      attempting_ = was_attempting;
      close(fd_);
      fd_ = -1;
      lost_ = true;
      return e;
    };
    const uint16_t lo = proto::min_protocol_version;
    const auto frame = session_.start(proto::hello{hi, name_, cancel_on_disconnect_, lo}).second;
    if (auto sent = send_bytes(frame); !sent) return fail(std::move(sent).error());
    auto o = await_outcome(std::chrono::steady_clock::now() + timeout);
    if (!o) return fail(std::move(o).error());
    auto h = proto::read_hello(std::move(o.value), lo, hi);
    if (h.what == proto::hello_outcome::kind::refused && h.retry_v3) {
      // A daemon that speaks only version 3: say hello again, in version 3, on a new socket.
      (void)fail(h.err);
      hi = 3;
      continue;
    }
    if (h.what != proto::hello_outcome::kind::accepted) return fail(std::move(h.err));
    attempting_ = was_attempting;
    hello_ = std::move(h.reply);
    version_ = hello_.version;
    session_.set_version(version_);
    return {};
  }
}

result<proto::raw_frame> client::read_frame(std::chrono::steady_clock::time_point deadline) {
  // A reconnecting client closed its lost connection: nothing more comes from it.
  if (fd_ < 0) return error{loss_.code, loss_.message};
  std::vector<uint8_t> buf(64 * 1024);
  for (;;) {
    if (auto f = reader_.next_raw()) {
      if (!*f) return lose({f->code, "cannot read ferryd's frames: " + f->message});
      return std::move(*f);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return error{errc::timed_out, "timed out waiting for ferryd"};
    pollfd p{fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) continue;
    ssize_t got = recv(fd_, buf.data(), buf.size(), 0);
    if (got == 0) return lose({errc::peer_lost, "ferryd closed the connection"});
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return lose(
          {errc::peer_lost, std::string("reading from ferryd failed: ") + std::strerror(errno)});
    }
    reader_.feed(std::span<const uint8_t>(buf.data(), static_cast<size_t>(got)));
  }
}

result<proto::message> client::raw_exchange(const std::vector<uint8_t>& bytes,
                                            std::chrono::milliseconds timeout) {
  // Bytes the session did not number: the next frame that is not an event is taken as their
  // answer, whatever its seq.
  if (auto e = enter(); !e) return std::move(e).error();
  if (auto sent = send_bytes(bytes); !sent) return std::move(sent).error();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto f = read_frame(deadline);
    if (!f) return std::move(f).error();
    auto d = proto::decode(f.value.type, f.value.seq, f.value.body, version_);
    if (!d.msg) return lose({d.code, "cannot decode ferryd's reply: " + d.error});
    if (auto* ev = std::get_if<proto::event>(&*d.msg); ev && f.value.seq == 0) {
      note_event(*ev);
      events_.push(std::move(*ev));
      continue;
    }
    result<proto::message> o;
    o.value = std::move(*d.msg);
    return o;
  }
}

result<none> client::send_bytes(const std::vector<uint8_t>& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string text = std::string("writing to ferryd failed: ") + std::strerror(errno);
      // ferryd may have refused this connection (and closed it) before reading anything: its
      // reason is waiting to be read, and says more than the broken pipe.
      auto f = read_frame(std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      if (f && f.value.seq == 0 && f.value.type == static_cast<uint16_t>(proto::msg_type::error))
        if (auto d = proto::decode(f.value.type, 0, f.value.body, version_); d.msg)
          if (auto* e = std::get_if<proto::error>(&*d.msg)) return lose({e->code, e->message});
      return lose({errc::peer_lost, text});
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

result<proto::session_outcome> client::await_outcome(
    std::chrono::steady_clock::time_point deadline) {
  using kind = proto::session_outcome::kind;
  for (;;) {
    auto f = read_frame(deadline);
    if (!f) {
      // A timeout leaves the connection usable: the replies that come later are dropped.
      if (f.code == errc::timed_out)
        for (auto seq : session_.outstanding()) session_.abandon(seq);
      return std::move(f).error();
    }
    auto o = session_.on_frame(f.value.type, f.value.flags, f.value.seq, f.value.body);
    switch (o.what) {
      case kind::pushed: {
        auto& ev = std::get<proto::event>(*o.msg);
        note_event(ev);
        events_.push(std::move(ev));
        continue;
      }
      case kind::dropped:
        continue;
      case kind::ended:
        session_.end();
        return lose(std::move(o.err));
      default:
        return o;
    }
  }
}

result<proto::message> client::reply_of(proto::session_outcome o) {
  if (o.what == proto::session_outcome::kind::reply) return std::move(*o.msg);
  if (o.draining) note_draining(o.err);
  return std::move(o.err);
}

namespace {

/// A request this connection's version does not have, refused before it is sent.
std::optional<error> too_new(proto::msg_type t, uint16_t version) {
  if (version >= proto::first_version(t)) return std::nullopt;
  return error{errc::unsupported_version,
               fmt::format("{} needs protocol version {}; this connection speaks {}",
                           proto::to_string(t), proto::first_version(t), version)};
}

/// The same for a whole request, and for a field set that the version does not carry (a
/// send's layer range before v6, state pages before v8, shard units before v9, a checked room
/// before v10: an older daemon would act as if it were not set; wire.yaml lists them).
std::optional<error> too_new(const proto::message& m, uint16_t version) {
  if (auto e = too_new(proto::type_of(m), version)) return e;
  if (auto why = proto::too_old(m, version)) return error{errc::unsupported_version, *why};
  return std::nullopt;
}

}  // namespace

result<proto::message> client::request(const proto::message& m) {
  if (auto e = enter(); !e) return std::move(e).error();
  if (auto e = too_new(m, version_)) return *e;
  if (auto sent = send_bytes(session_.start(m).second); !sent) return std::move(sent).error();
  auto o = await_outcome(std::chrono::steady_clock::now() + timeout_);
  if (!o) return std::move(o).error();
  return reply_of(std::move(o.value));
}

result<none> client::expect_ok(const proto::message& m) {
  auto r = request(m);
  if (!r) return error{r.code, r.message};
  if (!std::holds_alternative<proto::ok>(r.value))
    return error{errc::malformed_frame,
                 fmt::format("expected ok, got {}", proto::to_string(proto::type_of(r.value)))};
  return {};
}

std::vector<result<none>> client::pipeline(const std::vector<proto::message>& requests) {
  std::vector<result<none>> out;
  out.reserve(requests.size());
  auto rest_fail = [&](const error& e) {
    while (out.size() < requests.size()) out.emplace_back(e);
    return out;
  };
  if (requests.empty()) return out;
  if (auto e = enter(); !e) return rest_fail(e.error());
  // Checked whole before anything is sent: a request that cannot go fails the call alone.
  for (const auto& m : requests) {
    const auto t = proto::type_of(m);
    if (t != proto::msg_type::prepare && t != proto::msg_type::send &&
        t != proto::msg_type::subscribe && t != proto::msg_type::cancel)
      return rest_fail(error{errc::invalid_request,
                             fmt::format("pipeline takes prepare, send, subscribe and cancel, "
                                         "not {}",
                                         proto::to_string(t))});
    if (auto e = too_new(m, version_)) return rest_fail(*e);
  }
  std::vector<uint8_t> bytes;
  std::map<uint32_t, size_t> index;  // seq -> request
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& m = requests[i];
    if (const auto* p = std::get_if<proto::prepare>(&m)) forget_lost(p->room);
    if (const auto* s = std::get_if<proto::subscribe>(&m)) {
      forget_lost(s->room);
      // Counted before it is sent: the first event may come before the ok (see subscribe).
      subscribed_.insert(s->room);
    }
    auto [seq, frame] = session_.start(m);
    index[seq] = i;
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  if (auto sent = send_bytes(bytes); !sent) return rest_fail(sent.error());
  // Replies come in any order (requests of different rooms are answered by their rooms): the
  // session matches each by its seq.
  out.assign(requests.size(), result<none>{});
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!index.empty()) {
    auto o = await_outcome(deadline);
    if (!o) {  // the connection is gone, or the time is up: no later reply is taken
      for (const auto& [seq, i] : index) out[i] = o.error();
      return out;
    }
    const auto it = index.find(o.value.seq);
    if (it == index.end()) continue;  // (only this call's requests are outstanding)
    const size_t i = it->second;
    index.erase(it);
    auto r = reply_of(std::move(o.value));
    if (!r) {
      if (const auto* s = std::get_if<proto::subscribe>(&requests[i])) subscribed_.erase(s->room);
      out[i] = error{r.code, r.message};
    } else if (!std::holds_alternative<proto::ok>(r.value)) {
      out[i] = error{errc::malformed_frame,
                     fmt::format("expected ok, got {}", proto::to_string(proto::type_of(r.value)))};
    }
  }
  return out;
}

result<none> client::prepare(const proto::prepare& p) {
  forget_lost(p.room);
  return expect_ok(p);
}
result<none> client::send(const proto::send& s) { return expect_ok(s); }

std::vector<uint32_t> client::layers() const {
  node_layout l;
  for (int k = 0; k < pool_kind_count; ++k) l.pools[k] = hello_.pools[k].layout;
  return layer_ids(l);
}
result<none> client::cancel(uint64_t room) { return expect_ok(proto::cancel{room}); }
result<none> client::subscribe(uint64_t room) {
  forget_lost(room);
  if (auto e = enter(); !e) return e;
  // Counted before it is sent: the first event (the current status) may come before the ok.
  const bool added = subscribed_.insert(room).second;
  auto r = expect_ok(proto::subscribe{room});
  if (!r && added) subscribed_.erase(room);
  return r;
}

result<none> client::drain() { return expect_ok(proto::drain{}); }

result<none> client::set_log_level(const std::string& logger, const std::string& level) {
  return expect_ok(proto::set_log_level{logger, level});
}

result<proto::poll_reply> client::poll(uint64_t room) {
  auto r = request(proto::poll{room});
  if (!r) return error{r.code, r.message};
  auto* p = std::get_if<proto::poll_reply>(&r.value);
  if (!p) return error{errc::malformed_frame, "unexpected reply to poll"};
  result<proto::poll_reply> o;
  o.value = std::move(*p);
  return o;
}

result<std::vector<proto::poll_reply>> client::poll_many(const std::vector<uint64_t>& rooms) {
  auto r = request(proto::poll_many{rooms});
  if (!r) return error{r.code, r.message};
  auto* p = std::get_if<proto::poll_many_reply>(&r.value);
  if (!p) return error{errc::malformed_frame, "unexpected reply to poll_many"};
  return std::move(p->rooms);
}

result<proto::discover_reply> client::discover(const std::string& address) {
  auto r = request(proto::discover{address});
  if (!r) return error{r.code, r.message};
  auto* p = std::get_if<proto::discover_reply>(&r.value);
  if (!p) return error{errc::malformed_frame, "unexpected reply to discover"};
  result<proto::discover_reply> o;
  o.value = std::move(*p);
  return o;
}

result<std::string> client::info(proto::info_topic topic) {
  auto r = request(proto::info{topic});
  if (!r) return error{r.code, r.message};
  auto* p = std::get_if<proto::info_reply>(&r.value);
  if (!p) return error{errc::malformed_frame, "unexpected reply to info"};
  result<std::string> o;
  o.value = std::move(p->text);
  return o;
}

result<proto::event> client::next_event(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (events_.empty())
    if (auto e = enter(); !e) return std::move(e).error();
  while (events_.empty()) {
    auto r = read_event(deadline);
    if (!r && events_.empty()) return r;
    if (!r) break;  // the loss left the Failed events of the subscribed rooms
    events_.push(std::move(r.value));
  }
  result<proto::event> o;
  o.value = std::move(*events_.pop_front());
  return o;
}

result<proto::event> client::read_event(std::chrono::steady_clock::time_point deadline) {
  // No request is outstanding: the session ends the connection on any reply but one to a
  // request whose waiter gave up, which it drops.
  using kind = proto::session_outcome::kind;
  for (;;) {
    auto f = read_frame(deadline);
    if (!f) return std::move(f).error();
    auto o = session_.on_frame(f.value.type, f.value.flags, f.value.seq, f.value.body);
    if (o.what == kind::dropped) continue;
    if (o.what != kind::pushed) {
      session_.end();
      return lose(o.what == kind::ended ? std::move(o.err)
                                        : error{errc::malformed_frame,
                                                "protocol error: a reply while no request "
                                                "was outstanding"});
    }
    auto& ev = std::get<proto::event>(*o.msg);
    note_event(ev);
    result<proto::event> out;
    out.value = std::move(ev);
    return out;
  }
}

void client::discard_events(uint64_t room) {
  events_.erase_room(room, [](const proto::event&) { return true; });
}

result<proto::event> client::wait_terminal(uint64_t room, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto kept = [this, room]() -> std::optional<result<proto::event>> {
    auto e = events_.take_terminal(room);
    if (!e) return std::nullopt;
    result<proto::event> o;
    o.value = std::move(*e);
    return o;
  };
  if (auto o = kept()) return std::move(*o);
  // Not kept already: ferryd must say it. Other rooms' events read meanwhile are kept, and the
  // one awaited is handed out as it comes, without a look at the kept ones.
  if (auto e = enter(); !e) return error{e.code, fmt::format("room {}: {}", room, e.message)};
  for (;;) {
    auto r = read_event(deadline);
    if (!r) {
      // A loss keeps a Failed event for every subscribed room: this one's answers the wait.
      if (auto o = kept()) return std::move(*o);
      return error{r.code, fmt::format("room {}: {}", room, r.message)};
    }
    if (r.value.room == room && is_terminal(r.value.status)) return r;
    events_.push(std::move(r.value));
  }
}

result<none> client::map_pools() {
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& p = hello_.pools[k];
    if (!p.present || pools_[k] || p.shm_name.empty()) continue;  // "": the client's memory
    auto mapped = shm_region::open(p.shm_name, p.layout.total_bytes);
    if (!mapped) return std::move(mapped).error();
    pools_[k] = std::move(mapped.value);
  }
  return {};
}

uint8_t* client::pool(pool_kind k) const {
  const int i = static_cast<int>(k);
  if (attached_[i]) return attached_[i];
  // A daemon pool of a lost connection is no longer ferryd's memory: not used until remapped.
  if (policy_ && lost_) return nullptr;
  return pools_[i].data();
}

result<none> client::register_memory(proto::register_memory req, const std::vector<int>& fds) {
  if (auto e = enter(); !e) return e;
  if (auto e = too_new(req, version_)) return *e;
  req.fd_count = static_cast<uint32_t>(fds.size());
  if (!policy_) return send_register(req, fds);
  // Duplicates of the caller's descriptors, kept to register the same memory again after a
  // reconnect (the caller may close its own).
  registration kept{req, {}};
  for (int fd : fds) {
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
      const int err = errno;
      for (int x : kept.fds) close(x);
      return error{errc::system_error,
                   fmt::format("register_memory: cannot duplicate descriptor {} to keep it for "
                               "reconnecting: {} (nothing was sent)",
                               fd, std::strerror(err))};
    }
    kept.fds.push_back(d);
  }
  auto r = send_register(req, fds);
  if (!r) {
    for (int x : kept.fds) close(x);
    return r;
  }
  auto same = std::find_if(registrations_.begin(), registrations_.end(),
                           [&](const registration& g) { return g.req.pool == req.pool; });
  if (same != registrations_.end()) {
    for (int x : same->fds) close(x);
    *same = std::move(kept);
  } else {
    registrations_.push_back(std::move(kept));
  }
  return {};
}

result<none> client::send_register(const proto::register_memory& req, const std::vector<int>& fds) {
  const auto [seq, frame] = session_.start(req);
  // The whole frame in one sendmsg, the descriptors on its first byte.
  iovec iov{const_cast<uint8_t*>(frame.data()), frame.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent = sendmsg(fd_, &msg, MSG_NOSIGNAL);
  if (sent < 0) {
    const std::string text = fmt::format("cannot send register_memory: {}", std::strerror(errno));
    session_.abandon(seq);  // nothing was sent: no reply will come
    // A reconnecting client takes the broken connection as lost, as a failed write elsewhere.
    if (policy_) return lose({errc::peer_lost, text});
    return error{errc::peer_unreachable, text};
  }
  // A stream socket may take part of a large frame; the rest goes without descriptors.
  std::vector<uint8_t> rest(frame.begin() + sent, frame.end());
  if (auto more = send_bytes(rest); !more) return std::move(more).error();
  auto o = await_outcome(std::chrono::steady_clock::now() + timeout_);
  if (!o) return std::move(o).error();
  auto r = reply_of(std::move(o.value));
  if (!r) return error{r.code, r.message};
  return {};
}

uint8_t* client::item(pool_kind k, size_t buffer, uint64_t index) const {
  const auto& buffers = hello_.pools[static_cast<int>(k)].layout.buffers;
  if (!pool(k) || buffer >= buffers.size() || index >= buffers[buffer].items) return nullptr;
  return pool(k) + buffers[buffer].offset + index * buffers[buffer].item_bytes;
}

}  // namespace ferry::client
