#include "transport/routed.h"

#include <utility>

#include "common/error.h"

namespace braid {
namespace transport {

RoutedTransport::RoutedTransport(int rank, int size, const std::vector<int>& localRanks,
                                 std::unique_ptr<Transport> local,
                                 std::unique_ptr<Transport> remote)
    : rank_(rank), size_(size), localIndex_(size, -1), local_(std::move(local)),
      remote_(std::move(remote)) {
  BRAID_ENFORCE(local_ && remote_ && remote_->size() == size &&
                    local_->size() == static_cast<int>(localRanks.size()),
                "routed connect", rank, "the local transport has ", local_ ? local_->size() : 0,
                " ranks for ", localRanks.size(), " local ranks, the remote one ",
                remote_ ? remote_->size() : 0, " for a group of ", size);
  for (size_t i = 0; i < localRanks.size(); ++i) {
    const int r = localRanks[i];
    BRAID_ENFORCE(r >= 0 && r < size, "routed connect", rank, "local rank ", r,
                  " is not in the group of ", size);
    localIndex_[r] = static_cast<int>(i);
  }
  BRAID_ENFORCE(localIndex_[rank] == local_->rank(), "routed connect", rank,
                "this rank is local rank ", local_->rank(), " of its host's transport, but "
                "has index ", localIndex_[rank], " among the local ranks");
}

RoutedTransport::~RoutedTransport() { close(); }

Transport& RoutedTransport::route(const char* op, int peer, int* there) const {
  BRAID_ENFORCE(peer >= 0 && peer < size_, op, rank_, "peer rank ", peer,
                " is not in the group of ", size_);
  const int i = localIndex_[peer];
  *there = i >= 0 ? i : peer;
  return i >= 0 ? *local_ : *remote_;
}

std::shared_ptr<Request> RoutedTransport::isend(int dst, uint64_t tag, const void* data,
                                                size_t bytes, Request::Callback done) {
  int there;
  return route("send", dst, &there).isend(there, tag, data, bytes, std::move(done));
}

std::shared_ptr<Request> RoutedTransport::irecv(int src, uint64_t tag, void* data, size_t bytes,
                                                Request::Callback done) {
  int there;
  return route("recv", src, &there).irecv(there, tag, data, bytes, std::move(done));
}

std::string RoutedTransport::peerName(int rank) const {
  if (rank < 0 || rank >= size_) return strCat("rank ", rank);
  const int i = localIndex_[rank];
  return i >= 0 ? local_->peerName(i) : remote_->peerName(rank);
}

void RoutedTransport::abort(const std::string& why) {
  local_->abort(why);
  remote_->abort(why);
}

void RoutedTransport::close() {
  local_->close();
  remote_->close();
}

}  // namespace transport
}  // namespace braid
