// The shared-memory tree allreduce (Note [Tree allreduce] in
// collectives/shm/tree.h) against the flat one-shot, 4 B allreduces with
// threads as ranks in this process (no process spawning or Python between
// the ops): 2, 4, 8, 16 and 32 ranks, the two paths alternating, several
// repetitions each; rank 0's mean time per op after 100 untimed ones.
// Measures and prints; asserts nothing. Threads beyond the machine's cores
// make the larger sizes a test of waiting (Note [Spin, then sleep]), not of
// the paths alone. Formerly the disabled test TreeTiming.TreeAgainstFlat.
// Run: build/<dir>/tree_allreduce [reps] [max ranks]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../tests/cpp/core_group.h"
#include "collectives/shm/collectives.h"

using namespace braid;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  const int maxRanks = argc > 2 ? std::atoi(argv[2]) : 32;
  std::printf("%-6s %-9s %12s\n", "ranks", "path", "us_per_op");
  for (int n = 2; n <= maxRanks; n *= 2) {
    for (int rep = 0; rep < reps; ++rep) {
      for (bool tree : {false, true}) {
        collectives::CollectiveConfig cfg;
        cfg.treeRanks = tree ? 1 : 0;  // 1: the tree at every size; 0: never
        testing::Group g(n, testing::withConfig(testing::slots(4096), cfg));
        const int iters = n <= 4 ? 20000 : 2000;
        std::vector<double> us(n);
        testing::runRanks(n, [&](int r) {
          collectives::Communicator& c = *g.comms[r];
          float v = 1, out = 0;
          auto op = [&] {
            collectives::allreduce(c, testing::desc(collectives::OpKind::kAllreduce, 1), &v, &out);
          };
          for (int k = 0; k < 100; ++k) op();
          const auto t0 = Clock::now();
          for (int k = 0; k < iters; ++k) op();
          us[r] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
        });
        std::printf("%-6d %-9s %12.2f\n", n, tree ? "tree" : "one-shot", us[0]);
      }
    }
  }
  return 0;
}
