// A Transport over a group that spans hosts, which reaches each peer the
// cheapest way it can: the peers on this rank's host through shared memory,
// the others through TCP.
//
// Note [Routing by host]
// A flat algorithm over a group across hosts (the direct exchanges, gather,
// scatter, alltoall, barrier; every op when hosts run different numbers of
// ranks) sends to every peer, and some peers share this rank's host. Through
// TCP, a message to such a peer crosses the kernel's loopback: a send and a
// receive syscall, a copy into socket buffers and one out, and the peer's
// progress thread woken through epoll. gloo pays that on every pair (one
// flat ring over TCP); NCCL picks a transport per pair instead (shared memory
// or P2P within a node, the network across). braid does the same here: the
// host's ranks get a shared-memory transport (shm/transport.h: byte rings and
// a futex wake, no syscall on the fast path) and TCP never connects to them
// (TcpOptions::skip), so their sockets and handshakes are not made at all.
// Each peer is reached through exactly one transport, so messages from one
// source stay in order (the contract of transport.h), and the two transports
// fail and abort together.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace braid {
namespace transport {

class RoutedTransport : public Transport {
 public:
  // `local` connects this host's ranks, numbered by their place in
  // `localRanks` (which holds this rank); `remote` connects all `size` ranks
  // except those of `localRanks` but this one (TcpOptions::skip).
  RoutedTransport(int rank, int size, const std::vector<int>& localRanks,
                  std::unique_ptr<Transport> local, std::unique_ptr<Transport> remote);
  ~RoutedTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::shared_ptr<Request> isend(int dst, uint64_t tag, const void* data, size_t bytes,
                                 Request::Callback done) override;
  std::shared_ptr<Request> irecv(int src, uint64_t tag, void* data, size_t bytes,
                                 Request::Callback done) override;
  std::string peerName(int rank) const override;
  void abort(const std::string& why) override;
  void close() override;

 private:
  // The transport that reaches `peer`, and the peer's rank there.
  Transport& route(const char* op, int peer, int* there) const;

  const int rank_, size_;
  std::vector<int> localIndex_;  // by rank: its index in `local`, or -1
  std::unique_ptr<Transport> local_, remote_;
};

}  // namespace transport
}  // namespace braid
