// Memory that other processes on the host can map: a memfd, named by a small
// handle. Used for registered buffers (Note [Registered buffers] in
// collectives/shm/registered.h) and by the simulated device's CUDA IPC (Note
// [Simulated IPC] in tests/sim/device/sim_ipc.h).
//
// Note [Shared regions]
// - A region is a memfd, mapped by its creator; its handle names the
//   creator's pid and descriptor, and another process maps the same pages
//   through /proc/<pid>/fd/<fd> (which needs the same permission as reading
//   the creator's /proc entries: the same user). A memfd has no name: nothing
//   is left in /dev/shm whatever happens to the processes, and the pages go
//   when the last mapping does, so a peer that still maps a region keeps it
//   valid after its creator freed it or died (no SIGBUS mid-op).
// - A 64-byte header carries a random nonce that the handle repeats, so that
//   a handle whose descriptor number was reused (its exporter freed it) is
//   refused instead of opening the wrong memory.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace braid {
namespace transport {
namespace shm {

constexpr size_t kRegionHandleBytes = 64;

class SharedRegion {
 public:
  // `bytes` of zeroed shareable memory, mapped here; its data is 64-byte
  // aligned. Errors name `call`.
  static std::shared_ptr<SharedRegion> create(size_t bytes, const char* call);
  // Another (or this) process's region, from its handle(); throws braid::Error
  // naming `call` when the exporter is gone or the handle is stale.
  static std::shared_ptr<SharedRegion> open(const std::string& handle, const char* call);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  pid_t exporter() const { return pid_; }
  // kRegionHandleBytes bytes.
  std::string handle() const;

 private:
  SharedRegion() = default;
  void* base_ = nullptr;  // the mapping: header, then data
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;
  int fd_ = -1;        // the creator's descriptor (-1 in an opener)
  pid_t pid_ = 0;      // the creator
  int exportFd_ = -1;  // the descriptor number in the creator
  uint64_t nonce_ = 0;
};

}  // namespace shm
}  // namespace transport
}  // namespace braid
