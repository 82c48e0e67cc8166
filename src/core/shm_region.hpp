#pragma once
/// A POSIX shared-memory mapping: created (and unlinked on destruction) by ferryd, or opened by
/// name by a client. Move-only RAII.

#include <cstdint>
#include <functional>
#include <string>

// Installed with Ferry::client: neighbours included by file name (src/core/CMakeLists.txt).
#include "errors.hpp"

namespace ferry {

class shm_region {
 public:
  shm_region() = default;
  shm_region(shm_region&& o) noexcept { *this = std::move(o); }
  shm_region& operator=(shm_region&& o) noexcept;
  shm_region(const shm_region&) = delete;
  shm_region& operator=(const shm_region&) = delete;
  ~shm_region();

  /// Create `name` (e.g. "/ferry.prefill-0.1a2b.kv") of `bytes`, replacing a stale object left by
  /// a crashed daemon of the same name, and map it read-write (pre-faulted). Errors
  /// (`errc::system_error`) name the call, the object and errno. The object is made mode 0600;
  /// `share`, when given, runs on its descriptor before a byte is reserved in it (ferryd opens
  /// it to the users its clients run as, core/access.hpp), and its error ends the creation.
  static result<shm_region> create(const std::string& name, uint64_t bytes,
                                   const std::function<result<>(int fd)>& share = {});
  /// Map an existing object read-write; its size must be at least `bytes`.
  static result<shm_region> open(const std::string& name, uint64_t bytes);

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  /// Unmap, and unlink when this region created the object; leaves it empty.
  void release() noexcept;

  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace ferry
