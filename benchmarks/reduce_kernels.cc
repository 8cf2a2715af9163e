// Throughput of reduceN per SIMD level, as a ratio to memcpy of the same
// per-source buffer measured in the same run (one thread).
//
//   reduce_kernels [--quick]
//
// GB/s counts bytes read plus written (1 GB = 1e9 B): (nsrcs + 1) * bytes for
// reduceN, 2 * bytes for memcpy. Each figure is the best of several timed
// trials after a warm-up (on a shared machine the best is the least disturbed
// one; the median is printed too); every buffer is touched before timing.
// The last column is the ratio by thread CPU time, which leaves out time the
// thread spent descheduled (stalls on memory still count).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "math/dispatch.h"
#include "math/reduce.h"

namespace {

using braid::DataType;
using braid::ReduceOp;
using braid::reduce::Level;
using Clock = std::chrono::steady_clock;

struct Buffer {
  std::vector<uint8_t> mem;
  explicit Buffer(size_t bytes) : mem(bytes) {
    // Small finite values in every dtype: no NaN/Inf/denormal slow paths.
    for (size_t i = 0; i < bytes; ++i) mem[i] = static_cast<uint8_t>((i % 2) ? 0x3C : (i * 7));
  }
  uint8_t* data() { return mem.data(); }
};

struct Timing {
  double best, median, bestCpu;  // seconds per call (wall, wall, thread CPU)
};

double threadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Seconds per call of f over `trials` trials of `reps` calls each.
template <class F>
Timing timeIt(F f, int reps, int trials) {
  f();  // warm-up: page faults, caches, frequency
  std::vector<double> t;
  double bestCpu = 1e30;
  for (int i = 0; i < trials; ++i) {
    const auto start = Clock::now();
    const double cpu0 = threadCpuSeconds();
    for (int r = 0; r < reps; ++r) f();
    bestCpu = std::min(bestCpu, (threadCpuSeconds() - cpu0) / reps);
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count() / reps);
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2], bestCpu};
}

int repsFor(size_t bytes) { return bytes >= (size_t{16} << 20) ? 2 : 200; }

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int trials = quick ? 3 : 9;
  std::vector<Level> levels;
  for (Level l : {Level::kScalar, Level::kAvx2, Level::kAvx512}) {
    if (static_cast<int>(l) <= static_cast<int>(braid::reduce::cpuLevel())) levels.push_back(l);
  }
  std::printf("cpu level: %s, active (BRAID_SIMD): %s, best (median) of %d trials\n",
              braid::reduce::levelName(braid::reduce::cpuLevel()), braid::reduce::simdLevel(),
              trials);
  std::printf("%-9s %-6s %5s %9s %10s %18s %18s %14s %9s\n", "dtype", "level", "nsrcs", "per-src",
              "time", "reduce GB/s", "memcpy GB/s", "ratio", "cpu-ratio");
  for (size_t bytes : {size_t{1} << 20, size_t{64} << 20}) {
    Buffer copySrc(bytes), copyDst(bytes);
    const int reps = repsFor(bytes);
    auto copy = [&] { std::memcpy(copyDst.data(), copySrc.data(), bytes); };
    for (size_t n : {2, 4}) {
      std::vector<Buffer> srcBufs;
      for (size_t k = 0; k < n; ++k) srcBufs.emplace_back(bytes);
      Buffer dst(bytes);
      std::vector<const void*> srcs;
      for (auto& b : srcBufs) srcs.push_back(b.data());
      for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
        const size_t count = bytes / braid::elementSize(t);
        for (Level l : levels) {
          // memcpy right before each row, so both see the same machine load.
          const Timing tc = timeIt(copy, reps, trials);
          const Timing tr = timeIt(
              [&] {
                braid::reduce::reduceNAt(l, t, ReduceOp::kSum, dst.data(), srcs.data(), n, count);
              },
              reps, trials);
          auto gb = [](double b, double s) { return b / s / 1e9; };
          const double rb = gb((n + 1.0) * bytes, tr.best), rm = gb((n + 1.0) * bytes, tr.median);
          const double cb = gb(2.0 * bytes, tc.best), cm = gb(2.0 * bytes, tc.median);
          std::printf(
              "%-9s %-6s %5zu %5zu MiB %7.3f ms %8.2f (%7.2f) %8.2f (%7.2f) %5.2f (%5.2f) %9.2f\n",
              braid::toString(t), braid::reduce::levelName(l), n, bytes >> 20, tr.best * 1e3, rb,
              rm, cb, cm, rb / cb, rm / cm, (n + 1.0) * tc.bestCpu / (2.0 * tr.bestCpu));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
