// The TCP transport's handshake (Note [TCP authentication]) over loopback,
// two ranks as threads in this process:
//   - connecting 2 ranks with 32 sockets between them, each socket
//     authenticated (HMAC-SHA256 challenge-response both ways), TCP connect
//     and the store's exchange included (best of several repetitions);
//   - one HMAC-SHA256 of the handshake's message (4 per socket).
// Measures and prints; asserts nothing. Formerly the test
// TcpFaults.HandshakeCostIsPrinted, which ran in every ctest and checked
// nothing. Run: build/<dir>/tcp_handshake [reps] [macs]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tcp_bench.h"
#include "transport/tcp/auth.h"

using namespace braid;
using Clock = std::chrono::steady_clock;

namespace {

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int macs = argc > 2 ? std::atoi(argv[2]) : 20000;
  const int kSockets = 32;
  double best = 1e18;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    auto ts = bench::connectPair(kSockets, "handshake/" + std::to_string(rep));
    best = std::min(best, micros(Clock::now() - t0));
  }
  // libcrypto is loaded by now (connect loads it).
  uint8_t nonceDialer[32] = {1}, nonceAcceptor[32] = {2}, mac[32];
  const std::string group = "handshake";
  transport::tcp::MacInput in{&group, 1, 0, 0, nonceDialer, nonceAcceptor};
  auto t0 = Clock::now();
  for (int i = 0; i < macs; ++i) {
    transport::tcp::computeMac("benchmark-secret", transport::tcp::MacRole::kDialer, in, mac);
  }
  const double macUs = micros(Clock::now() - t0) / std::max(macs, 1);
  std::printf("2 ranks x %d sockets connected in %.0f us (best of %d): %.1f us per authenticated "
              "socket, TCP connect included\n", kSockets, best, reps, best / kSockets);
  std::printf("one HMAC-SHA256: %.2f us (4 per socket; mean of %d)\n", macUs, macs);
  return 0;
}
