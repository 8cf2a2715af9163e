#include "collectives/shm/shm_group.h"

#include "collectives/shm/collectives.h"

namespace braid {
namespace collectives {

ShmGroup::ShmGroup(std::unique_ptr<transport::Window> window, std::optional<CollectiveConfig> cfg)
    : comm_(std::move(window), cfg) {}

ShmGroup::~ShmGroup() {
  if (p2p_) p2p_->shutdown();
}

void ShmGroup::allreduce(const OpDesc& op, const void* in, void* out) {
  collectives::allreduce(comm_, op, in, out);
}
void ShmGroup::broadcast(const OpDesc& op, void* buf) { collectives::broadcast(comm_, op, buf); }
void ShmGroup::reduce(const OpDesc& op, const void* in, void* out) {
  collectives::reduce(comm_, op, in, out);
}
void ShmGroup::allgather(const OpDesc& op, const void* in, void* const* outs) {
  collectives::allgather(comm_, op, in, outs);
}
void ShmGroup::gather(const OpDesc& op, const void* in, void* const* outs) {
  collectives::gather(comm_, op, in, outs);
}
void ShmGroup::scatter(const OpDesc& op, const void* const* ins, void* out) {
  collectives::scatter(comm_, op, ins, out);
}
void ShmGroup::reduceScatter(const OpDesc& op, const void* const* ins, void* out) {
  collectives::reduceScatter(comm_, op, ins, out);
}
void ShmGroup::alltoall(const OpDesc& op, const void* const* ins, void* const* outs) {
  collectives::alltoall(comm_, op, ins, outs);
}
void ShmGroup::barrier(const OpDesc& op) { collectives::barrier(comm_, op); }
void ShmGroup::failOp(const OpDesc& op) { collectives::failOp(comm_, op); }
uint64_t ShmGroup::registerBuffer(const OpDesc& op,
                                  const std::shared_ptr<transport::shm::SharedRegion>& region) {
  return collectives::registerBuffer(comm_, op, region);
}

PointToPoint& ShmGroup::p2p() {
  std::call_once(p2pOnce_, [this] { p2p_ = std::make_unique<transport::shm::P2PEngine>(comm_.window()); });
  return *p2p_;
}

void ShmGroup::abort() { comm_.window().abort(); }

void ShmGroup::close() {
  if (p2p_) p2p_->shutdown();
  comm_.window().markClosed();
}

}  // namespace collectives
}  // namespace braid
