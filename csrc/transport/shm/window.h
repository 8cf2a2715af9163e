// The shared-memory Window: one segment per rank, mapped by every peer.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "transport/shm/futex.h"
#include "transport/shm/segment.h"
#include "transport/store.h"
#include "transport/window.h"

namespace braid {
namespace transport {
namespace shm {

struct WindowOptions {
  size_t slotBytes = 0;     // 0: BRAID_SHM_SLOT_BYTES
  size_t channelBytes = 0;  // 0: BRAID_SHM_P2P_BYTES (Note [Ring size] in window.cc)
  // Bytes of each slot's control area, for its user's headers (the
  // collectives: Communicator::controlBytesFor); 0 when only the byte
  // channels are used (ShmTransport). The window does not read them.
  size_t controlBytes = 0;
  std::chrono::milliseconds timeout{300000};  // for the rendezvous through the store
  int64_t spinUs = -1;      // -1: BRAID_SHM_SPIN_US's policy (common/cpu_cores.h)
  int useCma = -1;          // -1: BRAID_SHM_CMA; 0 or 1 override it
  // How errors name each rank ("rank 3 on host 'b'", for a host's group
  // inside a group across hosts); empty: "rank <its rank here>".
  std::vector<std::string> peerNames;
  // The rank a ShmTransport's errors carry: a host's part of a larger group
  // (a RoutedTransport's) says its rank in that group; -1: its rank here.
  int logRank = -1;
  // ShmTransport: messages of at least this many bytes are read straight
  // from the sender's memory when the window can (Note [Messages read in
  // place] in p2p_engine.h); 0: every message goes through the rings.
  size_t directMin = 0;
};

// The point-to-point ring size when BRAID_SHM_P2P_BYTES is 0, for a group of
// `size` ranks (Note [Ring size] in window.cc).
size_t defaultChannelBytes(int size);

class RingChannel;

class ShmWindow : public Window {
 public:
  // Collective: every rank of the group calls it with the same store.
  static std::unique_ptr<ShmWindow> create(Store& store, int rank, int size,
                                           const WindowOptions& opts);
  ~ShmWindow() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t slotBytes() const override { return slotBytes_; }
  size_t controlBytes() const override { return controlBytes_; }
  uint8_t* data(int rank, uint64_t step) override;
  uint8_t* control(int rank, uint64_t step) override;
  uint8_t* lineBytes(int rank) override;
  uint64_t published(int rank) const override;
  void publish(uint64_t step) override;
  void wait(int peer, uint64_t step, const WaitContext& ctx) override;
  void waitAll(uint64_t step, const WaitContext& ctx) override;
  ByteChannel& to(int peer) override;
  ByteChannel& from(int peer) override;
  uint32_t activityEpoch() override;
  void waitActivity(uint32_t epoch, std::chrono::microseconds maxWait) override;
  void notifyActivity() override;
  bool peerGone(int peer, std::string* why) override;
  bool canReadPeers() const override { return canReadPeers_; }
  void readPeer(int peer, uint64_t remoteAddr, void* dst, size_t bytes,
                const WaitContext& ctx) override;
  void abort() override;
  void markClosed() override;
  void giveUp(const std::string& why) override;
  std::string who(int r) const;  // WindowOptions::peerNames

 private:
  struct RankHeader;
  ShmWindow(int rank, int size, size_t slotBytes, size_t controlBytes, size_t channelBytes);
  RankHeader* header(int rank) const;
  void layout();
  void wakeWaitersOnMe();
  [[noreturn]] void failWait(const std::vector<int>& missing, uint64_t step,
                             const WaitContext& ctx);

  const int rank_;
  const int size_;
  const size_t slotBytes_;
  const size_t controlBytes_;
  const size_t channelBytes_;
  size_t controlOffset_ = 0, dataOffset_ = 0, channelOffset_ = 0, totalBytes_ = 0;
  // Where the ring this rank writes to `peer` starts in its own segment.
  size_t ringOffset(int peer) const;
  std::vector<Segment> segments_;  // by rank; segments_[rank_] is ours
  std::vector<std::unique_ptr<RingChannel>> to_, from_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> gaveUp_{false};
  // Note [Spin, then sleep]; fixed when the group is made: spin_ for a
  // waiter beside its rank's work, longSpin_ for one whose rank is blocked on
  // the op (Note [Spinning for a blocked rank] in common/cpu_cores.h).
  std::chrono::nanoseconds spin_{0}, longSpin_{0};
  // The long spin now, between spin_ and longSpin_: Note [Spin less when
  // spinning fails] in window.cc. Used by the thread running the group's op.
  std::atomic<int64_t> longBudgetNs_{0};
  bool canReadPeers_ = false;
  std::vector<int> pids_;
  std::vector<std::string> names_;
  std::unique_ptr<uint64_t> probe_;  // read by peers to test direct reads
};

}  // namespace shm
}  // namespace transport
}  // namespace braid
