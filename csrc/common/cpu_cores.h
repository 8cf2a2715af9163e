// The cores this process may run on, and how long braid's waiters spin on
// them (Note [Spin, then sleep] in transport/shm/futex.h, Note [How long to
// spin] below).
//
// Note [Counting cores]
// nproc counts the host's CPUs, not the ones a rank gets: a job started
// under taskset, numactl or a cpuset cgroup sees fewer in its affinity
// mask, and a container with a CPU quota (docker --cpus=2, a Kubernetes
// limit) may run on every CPU of the host but only for quota/period of them
// at a time: spinning there burns the quota and gets the whole cgroup
// throttled for the rest of the period. So the cores counted are the
// affinity mask's, cut to floor(quota / period) when a quota is set (at
// least 1), taking the smallest quota of the process's cgroup and its
// ancestors, in cgroup v2 (cpu.max: "max 100000" or "200000 100000") and
// v1 (cpu.cfs_quota_us, -1 for none, and cpu.cfs_period_us). In a container
// whose cgroup path is not visible under the mount (no cgroup namespace),
// the mount's root is the container's own cgroup and is read too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace braid {

// Where the cgroup files are: injectable so that tests feed fake ones.
struct CgroupFiles {
  std::string procSelfCgroup = "/proc/self/cgroup";
  std::string mountRoot = "/sys/fs/cgroup";
};

struct UsableCores {
  int affinity = 0;       // CPUs in this thread's affinity mask
  double quotaCores = 0;  // the smallest cgroup CPU quota, in cores; 0: none
  std::string quotaFile;  // the file it came from (empty: none)
  int cores = 1;          // what ranks may count on (Note [Counting cores]); at least 1
  std::string describe() const;  // "2 (affinity 4, cgroup quota 2.5 cores: <file>)"
};

// The smallest CPU quota of this process's cgroup and its ancestors, in
// cores (quota / period), or 0 when none is set or nothing can be read.
// `where` receives the file that set it.
double cgroupQuotaCores(const CgroupFiles& files, std::string* where = nullptr);

// `affinity` < 0: sched_getaffinity's count for the calling thread.
UsableCores usableCores(const CgroupFiles& files = CgroupFiles(), int affinity = -1);

// Note [How long to spin]
// A waiter that spins sees its peer's publish within a cache miss; one that
// sleeps on a futex costs a wake-up on both sides (a syscall for the
// publisher, 5 to 50 us of scheduler latency for the sleeper on a VM). So a
// rank that has a core to itself should spin much longer than a step takes,
// and one that shares its core with the peer it waits for should hardly spin
// at all (that takes the core from the peer; 4 ranks on 2 cores with 2 ms of
// spin ran 8x slower at 16 ranks on 16 cores, ../shared/anchors.md). The
// policy counts one spinning thread per rank: whichever thread runs the op
// (the caller itself, or braid's worker while the caller is blocked in
// wait(), its core idle). braid's other threads per rank (the worker while
// the caller computes beside it, as DDP's backward does, and the
// point-to-point progress thread) get no core of their own on a full host,
// so they spin short: a worker that spins beside backward takes the core
// backward needs. Only where every rank has two cores (its thread and the
// worker's) does the idle worker poll for the next op. Counting cores is
// not enough on a host that runs other work: Notes [Nobody else wants the
// cores] (below), [A preempted spinner sleeps] (transport/shm/futex.cc) and
// [Spin less when spinning fails] (transport/shm/window.cc) take the long
// spin back when it does not pay.
struct SpinPolicy {
  // A waiter that may hold a core somebody needs: the worker running an op
  // nobody waits for yet, or every waiter when ranks outnumber the cores.
  std::chrono::microseconds shortSpin{20};
  // A waiter whose rank is blocked on the op (a caller running it, or the
  // worker while a caller waits) on a host where every rank has a core.
  std::chrono::microseconds longSpin{20};
  // How long the idle worker polls for the next op before it sleeps.
  std::chrono::microseconds workerIdle{0};
  int cores = 1, ranksHere = 1, threadsPerRank = 1;
  bool everyRankHasACore = false;
  bool shmSpinSet = false, workerSpinSet = false;  // the explicit settings won
  std::string describe() const;
};

// The automatic choice: ranksHere ranks of a group on this host, each with
// threadsPerRank threads of braid's that may run beside its own. A value of
// `shmSpinUs` or `workerSpinUs` >= 0 (the explicit BRAID_SHM_SPIN_US,
// BRAID_WORKER_SPIN_US) wins over the choice; -1: automatic.
SpinPolicy chooseSpinPolicy(int cores, int ranksHere, int threadsPerRank, int64_t shmSpinUs,
                            int64_t workerSpinUs);

// The policy of a group with `ranksHere` ranks on this host: the usable
// cores of this process and the settings BRAID_SHM_SPIN_US and
// BRAID_WORKER_SPIN_US (explicit values win). Logged at info level once per
// process (and again when it differs from the last one logged).
SpinPolicy spinPolicyFor(int ranksHere, int rank);

// Note [Nobody else wants the cores]
// The policy counts the cores a rank may use, not what else runs there: with
// a 2-job compile beside 2 ranks on this 2-core machine, a 1 ms spin took the
// core while the peer it waited for had none (4-byte allreduce 56 us against
// 10 us with 20 us of spin, 1 MiB 364 against 291 us; medians of 5
// alternating runs). So before a wait spins long it checks that the threads
// runnable on the whole host right now (/proc/loadavg's fourth field, this
// one included) do not outnumber the usable cores, read at most once a
// millisecond. Only waits that already spun the short spin pay for it: they
// would otherwise sleep, which costs more.
bool coresToSpare();

// braid's threads per rank beside the rank's own: the worker that runs ops
// (engine/engine.h) and the point-to-point progress thread (started on the
// first send or receive). A group across hosts adds a TCP thread, which
// sleeps in poll().
constexpr int kBraidThreadsPerRank = 2;

// The long spin when every rank has a core (Note [How long to spin]).
constexpr std::chrono::microseconds kLongSpin{1000};
// The spin of a waiter that may hold a core somebody needs.
constexpr std::chrono::microseconds kShortSpin{20};

// Note [Spinning for a blocked rank]
// Whether the calling thread's waits may spin long: set by whoever runs an
// op for the duration of the op (engine/engine.cc): always on a caller that
// runs its own op, and on the worker only while a caller waits for the op
// (the flag it points to counts those callers). Transport waits read it
// between spin rounds, so a caller that starts waiting lengthens the spin of
// a wait already under way.
class SpinBoost {
 public:
  // Boosts while *waiters > 0 (null: never), for this object's lifetime on
  // this thread; scopes nest.
  explicit SpinBoost(const std::atomic<int>* waiters);
  ~SpinBoost();
  SpinBoost(const SpinBoost&) = delete;
  SpinBoost& operator=(const SpinBoost&) = delete;
  static const std::atomic<int>* always();  // a flag that is always 1
  static bool active();                      // on this thread, now

 private:
  const std::atomic<int>* saved_;
};

}  // namespace braid
