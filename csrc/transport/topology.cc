#include "transport/topology.h"

#include <map>
#include <sstream>

#include "common/error.h"

namespace braid {
namespace transport {

Topology::Topology(int rank, const std::vector<std::string>& identities) : rank_(rank) {
  const int n = static_cast<int>(identities.size());
  BRAID_ENFORCE(n > 0, "topology", rank, "a group needs at least one rank, got ", n);
  BRAID_ENFORCE(rank >= 0 && rank < n, "topology", rank, "rank ", rank, " is outside the group of ",
                n, " ranks");
  std::map<std::string, int> index;  // identity -> host number
  hostOf_.resize(n);
  localRank_.resize(n);
  for (int r = 0; r < n; ++r) {
    auto it = index.find(identities[r]);
    if (it == index.end()) {  // hosts numbered by their lowest rank
      it = index.emplace(identities[r], static_cast<int>(hosts_.size())).first;
      hosts_.emplace_back();
      identities_.push_back(identities[r]);
    }
    hostOf_[r] = it->second;
    localRank_[r] = static_cast<int>(hosts_[it->second].size());
    hosts_[it->second].push_back(r);
  }
}

std::vector<int> Topology::leaders() const {
  std::vector<int> out;
  for (const auto& ranks : hosts_) out.push_back(ranks.front());
  return out;
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << hosts_.size() << (hosts_.size() == 1 ? " host: " : " hosts: ");
  for (size_t h = 0; h < hosts_.size(); ++h) {
    os << (h ? "; '" : "'") << identities_[h] << "' has rank"
       << (hosts_[h].size() > 1 ? "s " : " ");
    for (size_t i = 0; i < hosts_[h].size(); ++i) os << (i ? "," : "") << hosts_[h][i];
  }
  return os.str();
}

Topology exchangeTopology(Store& store, int rank, int size, const std::string& identity,
                          std::chrono::milliseconds timeout) {
  std::string missing;
  std::vector<std::string> ids = exchangeThroughStore(
      store, [](int r) { return "host/" + std::to_string(r); }, rank, size, identity,
      std::chrono::steady_clock::now() + timeout, &missing);
  if (!missing.empty()) {
    BRAID_THROW(TimeoutError, "init", rank, "Timed out after ", timeout.count(),
                " ms waiting for the host identities of ranks ", missing,
                " (they never joined the group)");
  }
  return Topology(rank, ids);
}

}  // namespace transport
}  // namespace braid
