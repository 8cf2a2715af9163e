// What the TCP benchmarks share: two ranks, as threads of this process, connected over
// loopback through an in-memory store.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "../tests/cpp/memory_store.h"
#include "transport/tcp/transport.h"

namespace braid {
namespace bench {

inline transport::tcp::TcpOptions tcpOptions(int sockets, const std::string& group) {
  transport::tcp::TcpOptions o;
  o.groupId = group;
  o.socketsPerPeer = sockets;
  o.secret = "benchmark-secret";
  return o;
}

// Ranks 0 and 1 with `sockets` authenticated sockets between them; the store's
// exchange and TCP connect included.
inline std::vector<std::unique_ptr<transport::Transport>> connectPair(int sockets,
                                                                      const std::string& group) {
  testing::MemoryStore store;
  std::vector<std::unique_ptr<transport::Transport>> ts(2);
  testing::runRanks(2, [&](int r) {
    ts[r] = transport::tcp::connect(store, r, 2, tcpOptions(sockets, group));
  });
  return ts;
}

}  // namespace bench
}  // namespace braid
