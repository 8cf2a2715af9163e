// Which ranks of a group share a host, decided per group from the host
// identities the ranks exchange through the group's store.
//
// Note [Group topology]
// A group's layout is a property of the group, not of the launch: subgroups
// and hybrid layouts make LOCAL_WORLD_SIZE and similar launch variables wrong
// for a group (gloo's reviewers rejected them for the same reason). Every rank
// publishes its hostIdentity() (transport/host.h) under the group's store
// prefix and reads all the others', so every rank derives the same topology
// from the same strings, with no further agreement step:
//   - hosts are numbered in the order of their lowest rank;
//   - a host's ranks are listed in ascending order, and the first one is the
//     host's leader;
//   - a rank's local rank is its index among its host's ranks.
// Transports and hierarchical algorithms (shared memory within a host, the
// network between hosts) take their sub-groups from here.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "transport/store.h"

namespace braid {
namespace transport {

class Topology {
 public:
  // From every rank's identity, indexed by rank. Throws on an empty list or a
  // rank out of range.
  Topology(int rank, const std::vector<std::string>& identities);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(hostOf_.size()); }
  int numHosts() const { return static_cast<int>(hosts_.size()); }
  bool singleHost() const { return hosts_.size() == 1; }

  int hostOf(int rank) const { return hostOf_.at(rank); }
  // Its index among the ranks of its host (ranksOn(hostOf(rank))).
  int localRankOf(int rank) const { return localRank_.at(rank); }
  const std::vector<int>& ranksOn(int host) const { return hosts_.at(host); }
  const std::string& identityOf(int host) const { return identities_.at(host); }
  int leaderOf(int host) const { return hosts_.at(host).front(); }
  std::vector<int> leaders() const;

  int host() const { return hostOf_[rank_]; }
  int localRank() const { return localRank_[rank_]; }
  int localSize() const { return static_cast<int>(hosts_[host()].size()); }
  bool isLeader() const { return leaderOf(host()) == rank_; }

  // "2 hosts: 'a' has ranks 0,1; 'b' has ranks 2,3", for logs and errors.
  std::string describe() const;

 private:
  int rank_;
  std::vector<int> hostOf_;              // by rank
  std::vector<int> localRank_;           // by rank
  std::vector<std::vector<int>> hosts_;  // by host: its ranks, ascending
  std::vector<std::string> identities_;  // by host
};

// Publishes `identity` as `rank`'s under "host/<rank>" and reads every
// rank's; each rank of the group gets the same Topology. Throws
// braid::TimeoutError naming the ranks that published nothing.
Topology exchangeTopology(Store& store, int rank, int size, const std::string& identity,
                          std::chrono::milliseconds timeout);

}  // namespace transport
}  // namespace braid
