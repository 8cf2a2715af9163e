// A TCP group's settings, read once when the group is created (fromEnv) or
// set field by field (tests, or a caller with its own configuration).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "transport/tcp/interfaces.h"

namespace braid {
namespace transport {
namespace tcp {

enum class ConnectMode { kEager, kLazy };

struct TcpOptions {
  // Binds handshakes and store keys to one group incarnation; ranks of one
  // group must pass the same string (e.g. "<pg name>/<incarnation>").
  std::string groupId = "braid";
  int socketsPerPeer = 2;           // BRAID_TCP_SOCKETS_PER_PEER, 1..64
  ConnectMode connect = ConnectMode::kEager;  // BRAID_TCP_CONNECT
  size_t chunkBytes = 512 << 10;    // BRAID_TCP_CHUNK_BYTES, >= 64 KiB
  size_t maxUnexpectedBytes = 64 << 20;  // BRAID_TCP_UNEXPECTED_BYTES
  // BRAID_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME (ifnameSyntax says which);
  // "" = the address that routes to storeHost (Note [Choosing the interface]).
  std::string ifname;
  IfnameSyntax ifnameSyntax = IfnameSyntax::kBraid;
  std::string storeHost;            // the store's host (the caller knows it); "" = loopback
  // Every peer this transport connects is on another host (the hierarchy's
  // transports; not tests with threads as ranks): a loopback route to the
  // store becomes an outward interface (Note [A store on this host]).
  bool acrossHosts = false;
  // How errors name each peer ("rank 5 on host 'b'"), by transport rank;
  // empty: "rank <p>". The address follows either way.
  std::vector<std::string> peerNames;
  // The rank this transport's log lines carry: a sub-group's transport (a
  // hierarchy's cross group) logs as its world rank; -1: the transport's rank.
  int logRank = -1;
  int logRankOr(int rank) const { return logRank >= 0 ? logRank : rank; }
  // Peers this transport never connects, by transport rank (empty: none): a
  // RoutedTransport reaches them through shared memory (Note [Routing by
  // host] in transport/routed.h). Posts to them are refused; the peers must
  // skip this rank alike.
  std::vector<bool> skip;
  bool skips(int peer) const { return peer >= 0 && peer < static_cast<int>(skip.size()) && skip[peer]; }
  std::string congestion;           // BRAID_TCP_CONGESTION; "" = the system's
  std::string secret;               // BRAID_SECRET or BRAID_SECRET_FILE; "" = none
  bool requireAuth = false;         // BRAID_REQUIRE_AUTH
  // Deadline for connecting the group (eager) or one pair (lazy), and for
  // any one handshake.
  std::chrono::milliseconds timeout{30000};

  // From the BRAID_ environment; `size` picks the connect default (eager up
  // to 64 ranks). Throws an Error naming "tcp init", `rank` and the setting
  // when a value is invalid or a secret is required but missing.
  static TcpOptions fromEnv(int rank, int size);
  // Throws as fromEnv does.
  void check(int rank) const;
};

}  // namespace tcp
}  // namespace transport
}  // namespace braid
