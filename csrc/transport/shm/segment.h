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
  // Note [Reserved shared memory]: gives [offset, offset + bytes) of a segment
  // this process created its pages now; throws braid::Error naming /dev/shm's
  // room when there are not enough (where touching them would raise SIGBUS).
  void reserve(size_t offset, size_t bytes, const std::string& what) const;
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void release();  // unmaps (or drops one user of a shared mapping)

  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;
  int fd_ = -1;  // a created segment's, kept for reserve()
};

// Note [One mapping per process under TSan]
// With threads as ranks (the C++ tests), each rank maps each peer's segment
// at an address of its own. TSan tracks memory by address, so it sees
// neither the races nor the release/acquire ordering on shared memory. TSan
// builds therefore map a segment created in this process once, and count
// its users; the last one unmaps it.
#if defined(__SANITIZE_THREAD__)
#define BRAID_SHARE_MAPPINGS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BRAID_SHARE_MAPPINGS 1
#endif
#endif

// Removes braid segments of this pid namespace whose creator is dead.
void sweepStale();

// Whether process `pid` (in this pid namespace) has exited: it is gone, or a
// zombie that its parent has not reaped yet (a launcher busy elsewhere), which
// will never take another step either.
bool processGone(pid_t pid);

}  // namespace shm
}  // namespace transport
}  // namespace braid
