// One same-GPU communicator (Note [Same-GPU collectives] in same_gpu.h):
// the control block, this rank's buffer and event, the peers' opened ones,
// and the barrier. Internal to same_gpu*.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_api.h"
#include "cuda/nccl/nccl_api.h"
#include "transport/shm/shared_region.h"

namespace braid {
namespace cuda {
namespace samegpu {

constexpr int kMaxRanks = 16;  // kernels::kMaxReduceSources

// One rank's slot in the control block (host shared memory).
struct alignas(64) Slot {
  std::atomic<int32_t> state;  // kEmpty, kPublished, kClosed
  int32_t pid;
  std::atomic<int32_t> aborted;
  int32_t pad;
  std::atomic<uint64_t> barrier;  // barriers whose event this rank has recorded
  uint64_t halfBytes;  // BRAID_CUDA_SAME_GPU_BYTES / 2: chunks ops, so must be equal
  uint64_t smallBytes;  // BRAID_CUDA_SAME_GPU_SMALL_BYTES: picks the algorithm, so likewise
  char mem[kIpcHandleBytes];
  char event[kIpcHandleBytes];
};
enum SlotState : int32_t { kEmpty = 0, kPublished = 1, kClosed = 2 };

struct Control {
  uint64_t magic;
  Slot slots[kMaxRanks];
};

class Comm {
 public:
  Comm(DeviceApi& dev, int nranks, int rank, int device,
       std::shared_ptr<transport::shm::SharedRegion> control, size_t halfBytes, size_t smallBytes);
  ~Comm();

  // Until every rank has published: kNcclInProgress; then opens the peers'
  // handles once and answers kNcclSuccess. Later: a peer's exit or abort is
  // kNcclRemoteError (lastError() says which).
  NcclResult poll();
  // Records this rank's event on `s`, publishes it, waits on the host for
  // every peer to do the same and for its record to have run (up to the
  // timeout), then orders `s` after each peer's event. Not kNcclSuccess:
  // lastError() says why.
  NcclResult barrier(Stream s);
  // Marks the communicator aborted: host waits end (no stream waits on a
  // peer's unrecorded event, so none is left to end).
  void abort();

  int rank() const { return rank_; }
  int size() const { return n_; }
  int device() const { return device_; }
  size_t halfBytes() const { return halfBytes_; }
  // Reductions of at most this many bytes (and at most a half) run in one
  // barrier and one kernel (Note [Same-GPU small messages] in same_gpu.h).
  size_t smallBytes() const { return smallBytes_; }
  // This op's half of rank q's buffer (q == rank(): this rank's own).
  char* half(int q) const { return static_cast<char*>(bufs_[q]) + half_ * halfBytes_; }
  void nextHalf() { half_ ^= 1; }
  DeviceApi& dev() const { return dev_; }
  uint64_t barriers() const { return barriers_; }  // run so far (the tests count them)
  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }
  const std::string& lastError() const { return lastError_; }
  NcclResult fail(NcclResult r, std::string why);

 private:
  Slot& slot(int q) const;
  bool peerGone(int q, std::string* why, bool closedIsGone) const;
  // Whether rank q may still map this rank's buffer (Note [Exported buffers
  // outlive their mappings] in same_gpu.h).
  bool peerMaps(int q) const;
  void close();

  DeviceApi& dev_;
  const int n_, rank_, device_;
  std::shared_ptr<transport::shm::SharedRegion> control_;
  const size_t halfBytes_;
  const size_t smallBytes_;
  void* buf_ = nullptr;
  Event event_ = nullptr;
  std::vector<void*> bufs_;      // every rank's buffer, as mapped here
  std::vector<Event> events_;    // every rank's event, as opened here
  Stream stream_ = nullptr;      // the stream of the last barrier: close() drains it
  bool ready_ = false;
  int half_ = 0;
  uint64_t barriers_ = 0;
  std::atomic<bool> aborted_{false};
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
  std::string lastError_;
};

}  // namespace samegpu
}  // namespace cuda
}  // namespace braid
