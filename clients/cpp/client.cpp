#include "ferry/client.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry::client {
client::~client() {
  if (fd_ >= 0) close(fd_);
}

result<std::unique_ptr<client>> client::connect(const std::string& socket_path,
                                                const std::string& name,
                                                std::chrono::milliseconds timeout,
                                                bool cancel_on_disconnect, uint16_t max_version) {
  std::unique_ptr<client> c(new client());
  c->timeout_ = timeout;
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path))
    return error{errc::invalid_request, "socket path is too long: " + socket_path};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  c->fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd_ < 0 || ::connect(c->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return error{errc::peer_unreachable, fmt::format("cannot connect to ferryd at '{}': {}",
                                                     socket_path, std::strerror(errno))};
  auto r = c->request(
      proto::hello{max_version, name, cancel_on_disconnect, proto::min_protocol_version});
  if (!r) return error{r.code, r.message};
  auto* h = std::get_if<proto::hello_reply>(&r.value);
  if (!h) return error{errc::malformed_frame, "ferryd answered hello with an unexpected message"};
  c->hello_ = std::move(*h);
  c->version_ = c->hello_.version;
  c->reader_.set_version(c->version_);
  c->timeout_ = std::chrono::seconds(30);
  result<std::unique_ptr<client>> o;
  o.value = std::move(c);
  return o;
}

result<proto::message> client::read_frame(std::chrono::steady_clock::time_point deadline,
                                          uint32_t* seq) {
  std::vector<uint8_t> buf(64 * 1024);
  for (;;) {
    if (auto d = reader_.next()) {
      if (!d->msg) return lose({d->code, "cannot decode ferryd's reply: " + d->error});
      if (seq) *seq = d->seq;
      result<proto::message> o;
      o.value = std::move(*d->msg);
      return o;
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
  return exchange(bytes, timeout, std::nullopt);
}

result<proto::message> client::exchange(const std::vector<uint8_t>& bytes,
                                        std::chrono::milliseconds timeout,
                                        std::optional<uint32_t> expect_seq) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string text = std::string("writing to ferryd failed: ") + std::strerror(errno);
      // ferryd may have refused this connection (and closed it) before reading anything: its
      // reason is waiting to be read, and says more than the broken pipe.
      uint32_t seq = 0;
      auto r = read_frame(std::chrono::steady_clock::now() + std::chrono::milliseconds(100), &seq);
      if (auto* e = r ? std::get_if<proto::error>(&r.value) : nullptr; e && seq == 0)
        return lose({e->code, e->message});
      return lose({errc::peer_lost, text});
    }
    off += static_cast<size_t>(n);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    uint32_t seq = 0;
    auto r = read_frame(deadline, &seq);
    if (!r) return r;
    if (auto* ev = std::get_if<proto::event>(&r.value)) {
      events_.push_back(std::move(*ev));
      continue;
    }
    // An error with seq 0 is about the connection itself (refused, or an incomplete frame),
    // and ferryd closes the connection after it.
    if (auto* e = std::get_if<proto::error>(&r.value); expect_seq && e && seq == 0)
      return lose({e->code, e->message});
    // One request is outstanding at a time: a reply with another seq answers nothing this
    // client asked, and taking it as this request's answer would shift every later reply.
    if (expect_seq && seq != *expect_seq)
      return lose(
          {errc::malformed_frame,
           fmt::format("protocol error: ferryd sent a {} with seq {}, which matches no outstanding "
                       "request (waiting for seq {})",
                       proto::to_string(proto::type_of(r.value)), seq, *expect_seq)});
    return r;
  }
}

namespace {

/// A request this connection's version does not have, refused before it is sent.
std::optional<error> too_new(proto::msg_type t, uint16_t version) {
  if (version >= proto::first_version(t)) return std::nullopt;
  return error{errc::unsupported_version,
               fmt::format("{} needs protocol version {}; this connection speaks {}",
                           proto::to_string(t), proto::first_version(t), version)};
}

}  // namespace

result<proto::message> client::request(const proto::message& m) {
  if (auto e = too_new(proto::type_of(m), version_)) return *e;
  const uint32_t seq = next_seq_++;
  if (next_seq_ == 0) next_seq_ = 1;  // seq 0 is for events
  auto r = exchange(proto::encode(m, seq, version_), timeout_, seq);
  if (!r) return r;
  if (auto* e = std::get_if<proto::error>(&r.value)) return error{e->code, e->message};
  return r;
}

result<none> client::expect_ok(const proto::message& m) {
  auto r = request(m);
  if (!r) return error{r.code, r.message};
  if (!std::holds_alternative<proto::ok>(r.value))
    return error{errc::malformed_frame,
                 fmt::format("expected ok, got {}", proto::to_string(proto::type_of(r.value)))};
  return {};
}

result<none> client::prepare(const proto::prepare& p) { return expect_ok(p); }
result<none> client::send(const proto::send& s) { return expect_ok(s); }
result<none> client::cancel(uint64_t room) { return expect_ok(proto::cancel{room}); }
result<none> client::subscribe(uint64_t room) { return expect_ok(proto::subscribe{room}); }

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
  while (events_.empty()) {
    auto r = read_event(deadline);
    if (!r) return r;
    events_.push_back(std::move(r.value));
  }
  result<proto::event> o;
  o.value = std::move(events_.front());
  events_.pop_front();
  return o;
}

result<proto::event> client::read_event(std::chrono::steady_clock::time_point deadline) {
  uint32_t seq = 0;
  auto r = read_frame(deadline, &seq);
  if (!r) return error{r.code, r.message};
  if (auto* e = std::get_if<proto::error>(&r.value); e && seq == 0)
    return lose({e->code, e->message});  // about the connection itself
  auto* ev = std::get_if<proto::event>(&r.value);
  if (!ev)  // no request is outstanding while waiting for events
    return lose(
        {errc::malformed_frame,
         fmt::format("protocol error: ferryd sent a {} with seq {}, which matches no outstanding "
                     "request",
                     proto::to_string(proto::type_of(r.value)), seq)});
  result<proto::event> o;
  o.value = std::move(*ev);
  return o;
}

void client::discard_events(uint64_t room) {
  std::erase_if(events_, [room](const proto::event& e) { return e.room == room; });
}

result<proto::event> client::wait_terminal(uint64_t room, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (auto it = events_.begin(); it != events_.end(); ++it)
      if (it->room == room && is_terminal(it->status)) {
        result<proto::event> o;
        o.value = std::move(*it);
        events_.erase(it);
        return o;
      }
    auto r = read_event(deadline);
    if (!r) return error{r.code, fmt::format("room {}: {}", room, r.message)};
    events_.push_back(std::move(r.value));
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
  return attached_[i] ? attached_[i] : pools_[i].data();
}

result<none> client::register_memory(proto::register_memory req, const std::vector<int>& fds) {
  if (auto e = too_new(proto::msg_type::register_memory, version_)) return *e;
  req.fd_count = static_cast<uint32_t>(fds.size());
  const uint32_t seq = next_seq_++;
  if (next_seq_ == 0) next_seq_ = 1;
  const auto frame = proto::encode(req, seq, version_);
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
  if (sent < 0)
    return error{errc::peer_unreachable,
                 fmt::format("cannot send register_memory: {}", std::strerror(errno))};
  // A stream socket may take part of a large frame; the rest goes without descriptors.
  std::vector<uint8_t> rest(frame.begin() + sent, frame.end());
  auto r = exchange(rest, timeout_, seq);
  if (!r) return error{r.code, r.message};
  if (auto* e = std::get_if<proto::error>(&r.value)) return error{e->code, e->message};
  if (!std::holds_alternative<proto::ok>(r.value))
    return error{errc::malformed_frame, "unexpected reply to register_memory"};
  return {};
}

uint8_t* client::item(pool_kind k, size_t buffer, uint64_t index) const {
  const auto& buffers = hello_.pools[static_cast<int>(k)].layout.buffers;
  if (!pool(k) || buffer >= buffers.size() || index >= buffers[buffer].items) return nullptr;
  return pool(k) + buffers[buffer].offset + index * buffers[buffer].item_bytes;
}

}  // namespace ferry::client
