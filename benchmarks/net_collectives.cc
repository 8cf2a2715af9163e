// Allreduce over the net collectives (collectives/net) on loopback TCP,
// ranks as threads in this process: median time of a 4 B and a 64 MiB fp32
// allreduce at 2, 3 and 4 ranks, default settings (2 sockets per peer,
// BRAID_NET_ALLREDUCE_RING_MIN from the environment). Measures and prints;
// asserts nothing. Loopback shares this machine's cores and memory bandwidth
// between the ranks and the kernel: compare paths, not links.
// Run: build/<dir>/net_collectives [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../tests/cpp/memory_store.h"
#include "collectives/net/collectives.h"
#include "transport/tcp/transport.h"

using namespace braid;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  std::printf("%-6s %-10s %-8s %12s\n", "ranks", "bytes", "path", "median_ms");
  for (int n : {2, 3, 4}) {
    testing::MemoryStore store;
    std::vector<std::unique_ptr<transport::Transport>> ts(n);
    transport::tcp::TcpOptions o;
    o.groupId = "bench-net-" + std::to_string(n);
    o.secret = "benchmark-secret";
    testing::runRanks(n, [&](int r) { ts[r] = transport::tcp::connect(store, r, n, o); });
    std::vector<std::unique_ptr<collectives::net::NetComm>> comms;
    for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<collectives::net::NetComm>(*ts[r]));
    for (size_t count : {size_t(1), size_t(16) << 20}) {
      const int iters = count == 1 ? 200 : reps;
      std::vector<double> times;
      testing::runRanks(n, [&](int r) {
        std::vector<float> buf(count, 1.f);
        for (int i = 0; i < iters + 1; ++i) {
          collectives::OpDesc d;
          d.kind = collectives::OpKind::kAllreduce;
          d.count = count;
          d.shape.ndim = 1;
          d.shape.dims[0] = static_cast<int64_t>(count);
          d.timeout = std::chrono::seconds(60);
          d.deadline = Clock::now() + d.timeout;
          auto t0 = Clock::now();
          collectives::net::allreduce(*comms[r], d, buf.data(), buf.data());
          if (r == 0 && i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      });
      std::sort(times.begin(), times.end());
      const bool ring = count * 4 >= comms[0]->config().allreduceRingMin;
      std::printf("%-6d %-10zu %-8s %12.3f\n", n, count * 4, ring ? "ring" : "direct",
                  times[times.size() / 2] * 1e3);
    }
    comms.clear();
    for (auto& t : ts) t->close();
  }
  return 0;
}
