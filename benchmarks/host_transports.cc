// Two ranks of one host, as threads in this process: the round trip of one
// message (rank 0 sends, rank 1 sends it back) over the TCP transport
// (loopback) and over the shared-memory transport, with messages of at least
// `direct` bytes read in place (Note [Messages read in place]) or none. This
// is what a group across hosts chooses between for its ranks that share a
// host (Note [Routing by host]). Measures and prints (median of several
// repetitions); asserts nothing.
// Run: build/<dir>/host_transports [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../tests/cpp/memory_store.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

using namespace braid;
using Clock = std::chrono::steady_clock;
using Group = std::vector<std::unique_ptr<transport::Transport>>;

namespace {

Group tcpPair(const std::string& id) {
  transport::tcp::TcpOptions o;
  o.groupId = id;
  o.secret = "benchmark-secret";
  testing::MemoryStore store;
  Group ts(2);
  testing::runRanks(2, [&](int r) { ts[r] = transport::tcp::connect(store, r, 2, o); });
  return ts;
}

Group shmPair(size_t directMin) {
  transport::shm::WindowOptions w;
  w.directMin = directMin;
  testing::MemoryStore store;
  Group ts(2);
  testing::runRanks(2, [&](int r) { ts[r] = transport::shm::connect(store, r, 2, w); });
  return ts;
}

// Microseconds per round trip of `bytes`, the median of `reps` runs of `iters`.
double roundTrip(Group& ts, size_t bytes, int iters, int reps) {
  std::vector<double> runs;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    double us = 0;
    testing::runRanks(2, [&](int r) {
      std::vector<uint8_t> out(bytes + 1, 1), in(bytes + 1);
      const auto far = Clock::now() + std::chrono::seconds(120);
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (r == 0) {
          ts[0]->isend(1, i, out.data(), bytes)->wait(far);
          ts[0]->irecv(1, i, in.data(), bytes)->wait(far);
        } else {
          ts[1]->irecv(0, i, in.data(), bytes)->wait(far);
          ts[1]->isend(0, i, out.data(), bytes)->wait(far);
        }
      }
      if (r == 0) us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
    });
    if (rep > 0) runs.push_back(us);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  std::printf("2 ranks as threads, round trip in us (median of %d runs)\n", reps);
  std::printf("%10s %10s %14s %16s\n", "bytes", "tcp", "shm (ring)", "shm (in place)");
  auto tcp = tcpPair("host-transports");
  auto ring = shmPair(0);
  auto direct = shmPair(1);
  for (size_t bytes : {size_t{4}, size_t{4} << 10, size_t{64} << 10, size_t{256} << 10,
                       size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
    const int iters = bytes >= (4 << 20) ? 10 : bytes >= (256 << 10) ? 100 : 500;
    std::printf("%10zu %10.1f %14.1f %16.1f\n", bytes, roundTrip(tcp, bytes, iters, reps),
                roundTrip(ring, bytes, iters, reps), roundTrip(direct, bytes, iters, reps));
  }
  for (auto* g : {&tcp, &ring, &direct}) {
    for (auto& t : *g) t->close();
  }
}
