// transport/channels/client_gateway.hpp on its own, without actors, with a raw unix socket: what
// was queued for a client before the gateway stops reaches it before the connection closes (the
// outcome of the last room of a drain, pushed just before the daemon exits).

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "harness.hpp"
#include "transport/channels/client_gateway.hpp"

using namespace ferry;
using namespace std::chrono_literals;

namespace {

int connect_unix(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

void write_all(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    REQUIRE(n > 0);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

TEST_CASE("client gateway: events queued before a stop reach the client before it is closed",
          "[e2e][gateway]") {
  test::temp_dir dir;
  const auto path = (dir.path / "gateway.sock").string();
  auto listened = client_gateway::listen(path);
  INFO(listened.message);
  REQUIRE(listened);
  auto gateway = std::move(listened.value);
  // It stands in for the Scheduler: it gets the requests.
  std::mutex m;
  std::condition_variable arrived;
  std::optional<uint64_t> hello_from;
  gateway->start({[&](client_request r) {
                    std::lock_guard g(m);
                    if (!hello_from) hello_from = r.conn;
                    arrived.notify_all();
                  },
                  [](client_gone) {}});

  const int fd = connect_unix(path);
  write_all(fd, proto::encode(proto::hello{proto::protocol_version, "gateway-test"}, 1));
  uint64_t conn = 0;
  {
    std::unique_lock l(m);
    REQUIRE(arrived.wait_for(l, std::chrono::seconds(10), [&] { return hello_from.has_value(); }));
    conn = *hello_from;
  }

  // The client reads on its own thread, as an engine does; the gateway is told to stop right
  // behind many events, more than the socket buffer holds, so the gateway thread is still
  // writing them when the stop comes.
  constexpr uint64_t count = 2000;
  uint64_t received = 0;
  bool in_order = true, closed = false;
  std::thread client([&] {
    proto::frame_reader reader;
    std::vector<uint8_t> buf(64 * 1024);
    for (int reads = 0; reads < 1000000; ++reads) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;  // neither bytes nor a close: a failure below
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n <= 0) {
        closed = n == 0;
        return;
      }
      reader.feed(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)));
      while (auto d = reader.next()) {
        auto* e = d->msg ? std::get_if<proto::event>(&*d->msg) : nullptr;
        in_order = in_order && e && e->room == received + 1;
        ++received;
      }
    }
  });
  const std::string reason(1024, 'r');
  for (uint64_t room = 1; room <= count; ++room)
    gateway->push(conn, proto::event{room, room_status::failed, reason, errc::internal, 0});
  gateway->stop();
  gateway.reset();  // as at a daemon's stop: the connections close with it
  client.join();
  CHECK(closed);
  CHECK(in_order);
  CHECK(received == count);
  close(fd);
}
