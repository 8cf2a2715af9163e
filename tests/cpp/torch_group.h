// A braid c10d backend per rank, ranks as threads over one HashStore: the
// torch-level C++ tests' (test_torch_*.cc) group and rank runner.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "c10d/process_group.h"

namespace braid_test {

using PG = c10::intrusive_ptr<braid::ProcessGroupBraid>;

inline std::vector<PG> makeGroup(int n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<PG> pgs(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] { pgs[r] = c10::make_intrusive<braid::ProcessGroupBraid>(store, r, n, timeout); });
  }
  for (auto& t : ts) t.join();
  return pgs;
}

// Runs fn(rank) on one thread per rank and joins them.
template <typename F>
void onRanks(int n, F fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { fn(r); });
  for (auto& t : ts) t.join();
}

}  // namespace braid_test
