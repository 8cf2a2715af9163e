#include "transport/topology.h"

#include <algorithm>
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

namespace {
// The ranks from `first` on that have not published their identity.
std::string missingRanks(Store& store, int first, int size) {
  std::ostringstream os;
  for (int r = first; r < size; ++r) {
    try {
      store.get("host/" + std::to_string(r), std::chrono::milliseconds(1));
    } catch (const TimeoutError&) {
      os << (os.tellp() ? "," : "") << r;
    }
  }
  return os.str();
}
}  // namespace

Topology exchangeTopology(Store& store, int rank, int size, const std::string& identity,
                          std::chrono::milliseconds timeout) {
  store.set("host/" + std::to_string(rank), {identity.begin(), identity.end()});
  std::vector<std::string> ids(size);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < size; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    std::vector<uint8_t> v;
    try {
      v = store.get("host/" + std::to_string(r), std::max(left, std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      BRAID_THROW(TimeoutError, "init", rank, "Timed out after ", timeout.count(),
                  " ms waiting for the host identities of ranks ", missingRanks(store, r, size),
                  " (they never joined the group)");
    }
    ids[r].assign(v.begin(), v.end());
  }
  return Topology(rank, ids);
}

}  // namespace transport
}  // namespace braid
