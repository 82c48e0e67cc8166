#include "actors/messages.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

namespace ferry {

void add_ferry_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<peer_region>("ferry::peer_region");
  cfg.add_message_type<std::vector<peer_region>>("std::vector<ferry::peer_region>");
  cfg.add_message_type<std::vector<uint8_t>>("std::vector<uint8_t>");
  cfg.add_message_type<std::vector<uint32_t>>("std::vector<uint32_t>");
  cfg.add_message_type<peer_hello>("ferry::peer_hello");
  cfg.add_message_type<peer_refused>("ferry::peer_refused");
  cfg.add_message_type<peer_prepare>("ferry::peer_prepare");
  cfg.add_message_type<peer_prepare_paged>("ferry::peer_prepare_paged");
  cfg.add_message_type<peer_prepare_ack>("ferry::peer_prepare_ack");
  cfg.add_message_type<peer_announce>("ferry::peer_announce");
  cfg.add_message_type<peer_outcome>("ferry::peer_outcome");
  cfg.add_message_type<peer_drained>("ferry::peer_drained");
  cfg.add_message_type<peer_auth>("ferry::peer_auth");
  cfg.add_message_type<peer_leaving>("ferry::peer_leaving");
  cfg.add_message_type<peer_rail_desc>("ferry::peer_rail_desc");
  cfg.add_message_type<std::vector<peer_rail_desc>>("std::vector<ferry::peer_rail_desc>");
  cfg.add_message_type<peer_rails>("ferry::peer_rails");
}

stop_notice::stop_notice() : fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
stop_notice::~stop_notice() {
  if (fd >= 0) close(fd);
}
void stop_notice::notify() const {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = write(fd, &one, sizeof one);
}

}  // namespace ferry
