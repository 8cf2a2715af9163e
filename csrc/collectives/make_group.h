// The one place that chooses how a group's ranks talk.
//
// Note [Choosing a group's transport]
// Every rank publishes its host identity (transport/host.h) through the
// group's store and builds the same Topology from all of them (Note [Group
// topology]). A group on one host gets a ShmGroup (shared memory between its
// processes); a group across hosts gets a HierGroup (TCP between hosts,
// shared memory within each: Note [Collectives across hosts]). The decision is
// per group, so a subgroup of one host's ranks runs over shared memory even
// when its parent group spans hosts.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "collectives/group.h"
#include "transport/store.h"

namespace braid {
namespace collectives {

struct GroupOptions {
  std::chrono::milliseconds timeout{300000};
  // Binds the TCP handshakes to one group incarnation (equal on every rank).
  std::string groupId = "braid";
  // The store's host, from which TCP picks its interface ("" when unknown:
  // then a group across hosts needs BRAID_SOCKET_IFNAME).
  std::string storeHost;
};

// Collective over the group's ranks. Throws naming "init" and the rank.
std::unique_ptr<Group> makeGroup(transport::Store& store, int rank, int size,
                                 const GroupOptions& opts);

}  // namespace collectives
}  // namespace braid
