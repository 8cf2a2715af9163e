// POSIX shared-memory segments: create, map a peer's, unlink, and sweep the
// ones whose creator died before it could unlink (see Note [Segment lifetime]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid {
namespace transport {
namespace shm {

// Note [Segment lifetime]
// Each rank creates one segment, named /braid.<pidns>.<pid>.<random>, and
// unlinks it as soon as every peer has mapped it: the mapping keeps the
// memory alive, and nothing is left in /dev/shm whatever happens later, a
// crash included. Only the short window between creation and the last peer's
// mapping can leak a name; the next group created in the same pid namespace
// removes names whose creator pid is gone (sweepStale).
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;

  static Segment create(size_t bytes);                  // throws braid::Error
  static Segment open(const std::string& name, size_t bytes);  // throws braid::Error

  void unlink();  // idempotent
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;
};

// Removes braid segments of this pid namespace whose creator is dead.
void sweepStale();

}  // namespace shm
}  // namespace transport
}  // namespace braid
