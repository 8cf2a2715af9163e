// What the flight recorder adds to each op, measured alone: the backend's
// three calls (record at launch with one float32 tensor, started, finished)
// on one thread, as a 4-byte allreduce makes them. Prints nanoseconds per op,
// the best and the median of several trials (the best is the least disturbed
// on a shared machine), with the recorder on (BRAID_FR_BUFFER_SIZE, default
// 2000) or off (run it with BRAID_FR_BUFFER_SIZE=0).
//
//   fr_overhead [ops per trial]
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "c10d/flight_recorder.h"

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 200000;
  auto store = c10::make_intrusive<c10d::HashStore>();
  braid::GroupRecorder rec(store, "bench/", 0, 2);
  std::vector<at::Tensor> outputs{at::ones({1})};
  std::vector<double> ns;
  for (int trial = 0; trial < 15; ++trial) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      uint64_t id = rec.record(c10d::OpType::ALLREDUCE, {}, outputs, 30000);
      rec.started(id);
      rec.finished(id, nullptr);
    }
    auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  }
  std::sort(ns.begin(), ns.end());
  std::printf("flight recorder %s (capacity %zu): %.1f ns per op (best of %zu trials of %d ops), "
              "median %.1f ns\n",
              rec.on() ? "on" : "off", braid::fr::Recorder::global().capacity(), ns.front(),
              ns.size(), n, ns[ns.size() / 2]);
  return 0;
}
