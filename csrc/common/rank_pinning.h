// Binding a rank's threads to one CPU where ranks outnumber the cores.
//
// Note [Pinning ranks on a full host]
// Where a host's ranks outnumber its cores, the kernel's scheduler is left
// to share the cores among them, and it moves them around: a rank that
// sleeps on a futex wakes where the scheduler likes, and another group's
// threads waking (a gloo group beside braid's, issue 30 item 4) reshuffle
// the ranks for a long while after. Measured on the 2-core VM, 4 ranks
// (benchmarks/results/pinning-2core.txt):
// - 4-byte allreduce, medians of 200-call windows: unpinned, 59 us alone,
//   86-90 us for the first 400 calls after 300 small gloo allreduces, 80 us
//   for more than 0.2 s after three 16 MiB ones; each rank pinned to one
//   core, 46 us alone and 45-53 us after either;
// - benchmarks/collectives.py, 3 alternating runs: alone, 4 B 52-60 us
//   pinned against 74-106 unpinned, 16 MiB 4.2-4.8 ms against 4.6-5.8;
//   beside a gloo group, 4 B 52-59 against 88-142, 16 MiB 4.0-4.7 against
//   5.1-6.3 ms; gloo's own times in those processes improved too.
// MPI launchers bind ranks by default for this reason (Open MPI to a core or
// package, Intel MPI to cores); torchrun does not. So where the ranks of a
// single-host group outnumber the cores, braid binds each rank's process to
// one CPU, rank r to the (r mod k)-th of the k CPUs its affinity mask
// allows, the first time a group asks, and every thread of the process:
// the caller's, braid's worker and point-to-point threads (which then share
// their own rank's core instead of preempting another rank's, issue 30 item
// 2), torch's and other backends'. Threads made later inherit it. It is
// undone (each thread that still has the bound mask gets the old one back)
// when the last group that relies on it is destroyed.
// - Not where every rank has a core: with 2 ranks on the 2 cores, binding
//   made braid's 4-byte allreduce no faster (8-10 us against 6-11) and a
//   gloo group beside it slower (16 MiB 14-16 ms against 11-13): a rank's
//   other threads (gloo's, braid's worker, the rank's own compute threads)
//   lose the other core when their rank's is busy.
// - Only where nobody placed the process: its mask allows every online CPU.
//   A rank that a launcher, taskset, numactl or a cpuset already placed is
//   left alone (BRAID_PIN_RANKS=1 binds within such a mask too, and where
//   every rank has a core).
// - Processes the rank starts while bound (DataLoader workers, a compile
//   pool) inherit its CPU, as they would a launcher's binding: on a host
//   whose ranks outnumber its cores there is no idle core for them anyway.
// - Groups across hosts are not bound here: their ranks' places on the host
//   are not known to the backend.
// - Spin policies keep counting the cores the process had before
//   (affinityBeforePinning), not the one it is bound to.
// BRAID_PIN_RANKS=0 turns it off.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace braid {

enum class PinMode { kAuto, kOff, kOn };

// Parses BRAID_PIN_RANKS ("auto", "0", "1"); throws naming the value.
PinMode pinModeFromSetting(int rank);

struct PinDecision {
  bool pin = false;
  int cpu = -1;     // the CPU to bind to, where pin
  std::string why;  // said in the log either way
};

// Pure, for tests: rank `localRank` of `ranksHere` ranks on this host, whose
// affinity mask allows `maskCpus` (in order), on a host of `onlineCpus` CPUs
// of which `usableCores` may run at once (Note [Counting cores]).
PinDecision choosePin(PinMode mode, int localRank, int ranksHere,
                      const std::vector<int>& maskCpus, int onlineCpus, int usableCores);

// choosePin for this process as it is now: its mask, the host's online CPUs
// and the usable cores.
PinDecision choosePinHere(PinMode mode, int localRank, int ranksHere);

// While alive, this process is bound as decided. Shared by every group that
// asked while it was; the last one to go restores the old mask.
class RankPin {
 public:
  RankPin(int cpu, std::vector<int> before);
  ~RankPin();
  RankPin(const RankPin&) = delete;
  RankPin& operator=(const RankPin&) = delete;

 private:
  const int cpu_;
  const std::vector<int> before_;
};

// Binds the process as Note [Pinning ranks on a full host] says under `mode`
// (pinModeFromSetting), or joins the binding already in place; null where it
// is not bound. `rank` names the rank in the log.
std::shared_ptr<RankPin> pinRankIfFull(PinMode mode, int localRank, int ranksHere, int rank);

// The CPU count of the process's mask before braid bound it; 0 when braid has
// not bound it.
int affinityBeforePinning();

// The calling thread's affinity mask, as CPU numbers in order.
std::vector<int> currentAffinity();

}  // namespace braid
