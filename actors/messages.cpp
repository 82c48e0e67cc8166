#include "actors/messages.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

namespace ferry {

stop_notice::stop_notice() : fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
stop_notice::~stop_notice() {
  if (fd >= 0) close(fd);
}
void to_peer(const peer_info_ptr& peer, const caf::actor& connection, peer_wire::message m) {
  if (auto channel = peer ? peer->channel.lock() : nullptr)
    channel->send(m);
  else if (connection)
    caf::anon_send(connection, peer_outbound{std::move(m)});
}

void stop_notice::notify() const {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = write(fd, &one, sizeof one);
}

}  // namespace ferry
