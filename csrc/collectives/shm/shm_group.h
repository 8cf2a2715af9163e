// A group whose ranks share one host: the slot-based collectives over a
// shared-memory Window (collectives.h), and point-to-point messages over the
// Window's byte channels (transport/shm/p2p_engine.h).
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "collectives/group.h"
#include "transport/shm/p2p_engine.h"

namespace braid {
namespace collectives {

class ShmGroup : public Group {
 public:
  explicit ShmGroup(std::unique_ptr<transport::Window> window,
                    std::optional<CollectiveConfig> cfg = std::nullopt);
  ~ShmGroup() override;

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::string describe() const override { return "shared memory"; }
  Communicator& comm() { return comm_; }

  void allreduce(const OpDesc& op, const void* in, void* out) override;
  void broadcast(const OpDesc& op, void* buf) override;
  void reduce(const OpDesc& op, const void* in, void* out) override;
  void allgather(const OpDesc& op, const void* in, void* const* outs) override;
  void gather(const OpDesc& op, const void* in, void* const* outs) override;
  void scatter(const OpDesc& op, const void* const* ins, void* out) override;
  void reduceScatter(const OpDesc& op, const void* const* ins, void* out) override;
  void alltoall(const OpDesc& op, const void* const* ins, void* const* outs) override;
  void barrier(const OpDesc& op) override;
  bool narrowsOnWire() const override { return true; }
  void failOp(const OpDesc& op) override;
  uint64_t registerBuffer(const OpDesc& op,
                          const std::shared_ptr<transport::shm::SharedRegion>& region) override;
  std::shared_ptr<RegionTable> regionTable() override { return comm_.regions(); }
  bool everyRankOffered() const override { return comm_.everyRankOffered(); }
  void markBroken(const std::string& why) override { comm_.markBroken(why); }

  PointToPoint& p2p() override;
  void abort() override;
  void close() override;

 private:
  Communicator comm_;
  std::once_flag p2pOnce_;
  std::unique_ptr<transport::shm::P2PEngine> p2p_;
};

}  // namespace collectives
}  // namespace braid
