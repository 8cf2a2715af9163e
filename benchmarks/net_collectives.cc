// The net collectives (collectives/net) on loopback TCP, ranks as threads in
// this process: median, 10th and 90th percentile times of a barrier, a 4 B
// broadcast, a 4 B and a 64 MiB fp32 allreduce at 2, 3 and 4 ranks, default
// settings (2 sockets per peer, BRAID_NET_ALLREDUCE_RING_MIN from the
// environment). Measures and prints; asserts nothing. Loopback shares this
// machine's cores and memory bandwidth between the ranks and the kernel:
// compare paths, not links.
// Run: build/<dir>/net_collectives [reps of 64 MiB] [reps of the small ops]
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

namespace {

struct Case {
  const char* name;
  collectives::OpKind kind;
  size_t count;
};

double ms(double s) { return s * 1e3; }

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int smallReps = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::printf("%-6s %-10s %-10s %-8s %10s %10s %10s\n", "ranks", "op", "bytes", "path",
              "median_ms", "p10_ms", "p90_ms");
  const Case cases[] = {{"barrier", collectives::OpKind::kBarrier, 0},
                        {"broadcast", collectives::OpKind::kBroadcast, 1},
                        {"allreduce", collectives::OpKind::kAllreduce, 1},
                        {"allreduce", collectives::OpKind::kAllreduce, size_t(16) << 20}};
  for (int n : {2, 3, 4}) {
    testing::MemoryStore store;
    std::vector<std::unique_ptr<transport::Transport>> ts(n);
    transport::tcp::TcpOptions o;
    o.groupId = "bench-net-" + std::to_string(n);
    o.secret = "benchmark-secret";
    testing::runRanks(n, [&](int r) { ts[r] = transport::tcp::connect(store, r, n, o); });
    std::vector<std::unique_ptr<collectives::net::NetComm>> comms;
    for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<collectives::net::NetComm>(*ts[r]));
    for (const Case& k : cases) {
      const size_t count = k.count;
      const int iters = count > 1 ? reps : smallReps;
      std::vector<double> times;
      testing::runRanks(n, [&](int r) {
        std::vector<float> buf(std::max<size_t>(count, 1), 1.f);
        for (int i = 0; i < iters + 1; ++i) {
          collectives::OpDesc d;
          d.kind = k.kind;
          d.count = count;
          d.shape.ndim = 1;
          d.shape.dims[0] = static_cast<int64_t>(count);
          d.timeout = std::chrono::seconds(60);
          d.deadline = Clock::now() + d.timeout;
          auto t0 = Clock::now();
          if (k.kind == collectives::OpKind::kBarrier) {
            collectives::net::barrier(*comms[r], d);
          } else if (k.kind == collectives::OpKind::kBroadcast) {
            collectives::net::broadcast(*comms[r], d, buf.data());
          } else {
            collectives::net::allreduce(*comms[r], d, buf.data(), buf.data());
          }
          if (r == 0 && i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      });
      std::sort(times.begin(), times.end());
      // Note [Eager data]: small data ride inside the header message.
      const bool inlined = count * 4 <= collectives::net::NetComm::kInlineBytes;
      const bool ring = count * 4 >= comms[0]->config().allreduceRingMin;
      const char* path = k.kind == collectives::OpKind::kBarrier ? "headers"
                         : inlined ? "inline"
                         : k.kind == collectives::OpKind::kBroadcast ? "tree"
                         : ring ? "ring" : "direct";
      std::printf("%-6d %-10s %-10zu %-8s %10.3f %10.3f %10.3f\n", n, k.name, count * 4, path,
                  ms(times[times.size() / 2]), ms(times[times.size() / 10]),
                  ms(times[times.size() * 9 / 10]));
    }
    comms.clear();
    for (auto& t : ts) t->close();
  }
  return 0;
}
