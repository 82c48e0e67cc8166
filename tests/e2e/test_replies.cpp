// One reply per request, always: a room that fails after its request was answered reports it
// as an event (and a poll answer), never as a second reply with that request's seq.

#include <functional>
#include <thread>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

struct reply_seen {
  uint32_t seq;
  proto::msg_type type;
  bool operator==(const reply_seen&) const = default;
};
std::ostream& operator<<(std::ostream& o, const reply_seen& r) {
  return o << r.seq << ":" << proto::to_string(r.type);
}

}  // namespace

TEST_CASE("every request gets exactly one reply, also when its room fails later",
          "[e2e][protocol]") {
  temp_dir dir;
  shape s;
  s.bootstrapping_ms = 400;  // room 700 times out waiting for a prepare that never comes
  daemon_proc prefill(dir, "prefill-0", "prefill", s);
  raw_conn c(prefill.socket());

  std::vector<reply_seen> replies;
  std::vector<proto::event> events;
  // Read frames until the reply to `seq` (keeping every frame seen).
  auto await = [&](uint32_t seq) {
    for (;;) {
      auto d = c.next();
      INFO(d.error);
      REQUIRE(d.msg);
      if (auto* e = std::get_if<proto::event>(&*d.msg)) {
        CHECK(d.seq == 0);
        events.push_back(*e);
        continue;
      }
      replies.push_back({d.seq, proto::type_of(*d.msg)});
      if (d.seq == seq) return;
    }
  };
  c.send_frame(proto::hello{proto::protocol_version, "replies", true}, 1);
  await(1);
  // Two chunks of room 700 and one of room 701 arrive before any prepare: each is accepted.
  c.send_frame(proto::send{700, {0, 1}, false, no_index, no_index}, 2);
  await(2);
  c.send_frame(proto::send{700, {2, 3}, false, no_index, no_index}, 3);
  await(3);
  c.send_frame(proto::send{701, {4}, false, no_index, no_index}, 4);
  await(4);
  c.send_frame(proto::subscribe{700}, 5);
  await(5);
  c.send_frame(proto::cancel{701}, 6);
  await(6);
  // Room 700 fails in Bootstrapping: an event, not a reply.
  for (;;) {
    auto it = std::find_if(events.begin(), events.end(), [](const proto::event& e) {
      return e.room == 700 && e.status == room_status::failed;
    });
    if (it != events.end()) {
      CHECK_THAT(it->reason, Catch::Contains("timed out in Bootstrapping after 400 ms"));
      break;
    }
    auto d = c.next();
    REQUIRE(d.msg);
    if (auto* e = std::get_if<proto::event>(&*d.msg)) {
      events.push_back(*e);
      continue;
    }
    replies.push_back({d.seq, proto::type_of(*d.msg)});
  }
  // Every later request of the same connection gets its own reply, with its own seq.
  c.send_frame(proto::poll{701}, 7);
  await(7);
  c.send_frame(proto::info{proto::info_topic::status}, 8);
  await(8);
  c.send_frame(proto::poll{700}, 9);
  await(9);
  using t = proto::msg_type;
  const std::vector<reply_seen> expected{
      {1, t::hello_reply}, {2, t::ok},         {3, t::ok},         {4, t::ok},        {5, t::ok},
      {6, t::ok},          {7, t::poll_reply}, {8, t::info_reply}, {9, t::poll_reply}};
  CHECK(replies == expected);

  // The library clients see the same: the poll after a cancel is the poll's answer.
  auto lib = prefill.connect();
  REQUIRE(lib->send({702, {5}, false, no_index, no_index}));
  REQUIRE(lib->cancel(702));
  auto p = lib->poll(702);
  INFO(p.message);
  REQUIRE(p);
  CHECK(p.value.room == 702);
}

namespace {

/// A fake ferryd on a real unix socket at `path`, for the client's side of the protocol: one
/// connection, run by `script` on its own thread with `next_request()` (the seq of the next
/// request read; 0 once the client closed) and `put(message, seq)`; the connection stays open
/// until the client closes it.
class fake_ferryd {
 public:
  struct conn {
    int fd;
    proto::frame_reader in;
    uint32_t next_request() {
      uint8_t buf[4096];
      for (;;) {
        if (auto d = in.next()) return d->seq;
        auto n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) return 0u;
        in.feed(std::span<const uint8_t>(buf, static_cast<size_t>(n)));
      }
    }
    void put(const proto::message& m, uint32_t seq) {
      auto f = proto::encode(m, seq);
      [[maybe_unused]] auto n = ::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
    }
  };
  fake_ferryd(std::string at, std::function<void(conn&)> script) : path(std::move(at)) {
    srv_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(bind(srv_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(srv_, 1) == 0);
    thread_ = std::thread([this, script = std::move(script)] {
      conn c{accept(srv_, nullptr, nullptr), {}};
      script(c);
      char x;
      [[maybe_unused]] auto n = recv(c.fd, &x, 1, 0);  // until the client closes
      close(c.fd);
    });
  }
  ~fake_ferryd() {
    thread_.join();
    close(srv_);
  }
  const std::string path;

 private:
  int srv_ = -1;
  std::thread thread_;
};

}  // namespace

TEST_CASE("the C++ client refuses a reply whose seq matches no outstanding request",
          "[e2e][protocol]") {
  temp_dir dir;
  // A fake daemon: answers hello, then answers the next request with a seq nobody sent.
  fake_ferryd fake((dir.path / "fake.sock").string(), [](fake_ferryd::conn& c) {
    c.put(proto::hello_reply{}, c.next_request());
    c.next_request();
    c.put(proto::ok{}, 99);
  });
  auto c = client::client::connect(fake.path, "test", 10s);
  INFO(c.message);
  REQUIRE(c);
  auto p = c.value->poll(5);
  REQUIRE_FALSE(p);
  CHECK(p.code == errc::malformed_frame);
  // The words the Python client uses too (tests/conformance/client_session.yaml).
  CHECK(p.message ==
        "protocol error: ferryd sent a reply of type ok (100) with seq 99, which matches no "
        "outstanding request (waiting for seq 2)");
}

TEST_CASE("the C++ client drops the late reply of a request that timed out and goes on",
          "[e2e][protocol]") {
  temp_dir dir;
  // A fake daemon that answers the first poll only once the second came (so the first has
  // timed out by then), then answers the second: the late reply must not be taken for it.
  fake_ferryd fake((dir.path / "fake.sock").string(), [](fake_ferryd::conn& c) {
    c.put(proto::hello_reply{}, c.next_request());
    const auto first = c.next_request();
    const auto second = c.next_request();
    c.put(proto::poll_reply{5, room_status::success, "", errc::ok, 0}, first);
    c.put(proto::poll_reply{6, room_status::transferring, "", errc::ok, 0}, second);
  });
  auto c = client::client::connect(fake.path, "test", 10s);
  INFO(c.message);
  REQUIRE(c);
  c.value->set_timeout(std::chrono::milliseconds(100));
  auto late = c.value->poll(5);
  CHECK(late.code == errc::timed_out);
  c.value->set_timeout(10s);
  auto p = c.value->poll(6);
  INFO(p.message);
  REQUIRE(p);
  CHECK(p.value.room == 6);
  CHECK(p.value.status == room_status::transferring);
  CHECK_FALSE(c.value->lost());
}
