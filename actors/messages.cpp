#include "actors/messages.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

namespace ferry {

stop_notice::stop_notice() : fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
stop_notice::~stop_notice() {
  if (fd >= 0) close(fd);
}
void stop_notice::notify() const {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = write(fd, &one, sizeof one);
}

}  // namespace ferry
