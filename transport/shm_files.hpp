#pragma once
/// The shm provider's files in /dev/shm, cleaned by engine::open before opening shm (private to
/// transport/; cross-memory attach is checked in cma_check.hpp).

#include <string>

namespace ferry::transport {

/// Remove the /dev/shm files named with this process's pid (left by an earlier process).
void remove_stale_shm_files();

}  // namespace ferry::transport
