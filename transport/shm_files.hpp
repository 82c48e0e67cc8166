#pragma once
/// The shm provider's needs from the machine, checked by engine::open before opening shm
/// (private to transport/; shm_files.cpp says why each matters).

#include <string>

namespace ferry::transport {

/// Remove the /dev/shm files named with this process's pid (left by an earlier process).
void remove_stale_shm_files();

/// Why shm could not use cross-memory attach here, or "" when it can.
std::string shm_without_cma();

}  // namespace ferry::transport
