// The TCP transport over loopback, two ranks as threads in this process:
//   - throughput of one 64 MiB message from rank 0 to rank 1, striped over
//     1, 2, 4 and 8 sockets (best of several repetitions);
//   - the cost of connecting and authenticating one socket (HMAC-SHA256
//     challenge-response both ways, TCP connect included).
// Measures and prints; asserts nothing. Loopback is one machine's memory
// bandwidth, not a network: use it to compare socket counts, not to predict
// a link. Run: build/<dir>/tcp_transport [MiB] [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tcp_bench.h"

using namespace braid;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const size_t bytes = mib << 20;
  std::vector<uint8_t> src(bytes, 0x5A), dst(bytes);
  std::printf("loopback, %zu MiB from rank 0 to rank 1, best of %d (chunk %zu KiB)\n", mib, reps,
              bench::tcpOptions(1, "").chunkBytes >> 10);
  for (int sockets : {1, 2, 4, 8}) {
    auto ts = bench::connectPair(sockets, "bw" + std::to_string(sockets));
    double best = 1e9;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      auto t0 = Clock::now();
      auto r = ts[1]->irecv(0, rep, dst.data(), bytes);
      auto s = ts[0]->isend(1, rep, src.data(), bytes);
      s->wait(Clock::now() + std::chrono::seconds(60));
      r->wait(Clock::now() + std::chrono::seconds(60));
      if (rep > 0) best = std::min(best, seconds(Clock::now() - t0));
    }
    // Both ways at once, half the bytes each way (what a 2-rank ring step does).
    double both = 1e9;
    for (int rep = 0; rep <= reps; ++rep) {
      auto t0 = Clock::now();
      const uint64_t tag = 1000 + rep;
      auto r1 = ts[1]->irecv(0, tag, dst.data(), bytes / 2);
      auto r0 = ts[0]->irecv(1, tag, dst.data() + bytes / 2, bytes / 2);
      auto s0 = ts[0]->isend(1, tag, src.data(), bytes / 2);
      auto s1 = ts[1]->isend(0, tag, src.data() + bytes / 2, bytes / 2);
      for (auto* q : {&s0, &s1, &r0, &r1}) (*q)->wait(Clock::now() + std::chrono::seconds(60));
      if (rep > 0) both = std::min(both, seconds(Clock::now() - t0));
    }
    std::printf("  %d socket(s): %7.2f GB/s (%.2f ms) one way; half each way at once %.2f ms\n",
                sockets, bytes / best / 1e9, best * 1e3, both * 1e3);
  }
  const int kSockets = 32;
  double best = 1e9;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    auto ts = bench::connectPair(kSockets, "hs" + std::to_string(rep));
    best = std::min(best, seconds(Clock::now() - t0));
  }
  std::printf("connect + authenticate: %.1f us per socket (2 ranks x %d sockets in %.2f ms, best "
              "of %d)\n", best * 1e6 / kSockets, kSockets, best * 1e3, reps);
  return 0;
}
