#include "collectives/make_group.h"

#include "collectives/hier/hier_group.h"
#include "collectives/shm/shm_group.h"
#include "common/error.h"
#include "common/logging.h"
#include "transport/host.h"
#include "transport/shm/window.h"
#include "transport/topology.h"

namespace braid {
namespace collectives {

std::unique_ptr<Group> makeGroup(transport::Store& store, int rank, int size,
                                 const GroupOptions& opts) {
  auto topo = transport::exchangeTopology(store, rank, size, transport::hostIdentity(),
                                          opts.timeout);
  if (topo.singleHost()) {
    transport::shm::WindowOptions w;
    w.controlBytes = collectives::Communicator::controlBytesFor(size);
    w.timeout = opts.timeout;
    return std::make_unique<ShmGroup>(transport::shm::ShmWindow::create(store, rank, size, w));
  }
  HierOptions h;
  h.groupId = opts.groupId;
  h.storeHost = opts.storeHost;
  h.timeout = opts.timeout;
  return std::make_unique<HierGroup>(store, topo, h);
}

}  // namespace collectives
}  // namespace braid
