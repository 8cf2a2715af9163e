#include "common/cpu_cores.h"

#include <sched.h>

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "common/rank_pinning.h"
#include "common/settings.h"

namespace braid {

// Read when a group is made (settings.h); ranks need not agree on them: they
// change only timing (Note [Settings that shape an op] in collectives/shm/plan.h).
BRAID_SETTING_INT(kShmSpinUs, "BRAID_SHM_SPIN_US", -1,
                  "Microseconds a waiting rank spins before it sleeps on a futex; -1: automatic: "
                  "1000 while the rank is blocked on the op and every rank of the group on this "
                  "host has a core (affinity and cgroup quota, not nproc), else 20 (Note [How "
                  "long to spin]).");
BRAID_SETTING_INT(kWorkerSpinUs, "BRAID_WORKER_SPIN_US", -1,
                  "Microseconds the worker polls for the next op before sleeping; -1: automatic: "
                  "1000 where every rank has a core for itself and each of braid's threads, "
                  "else 0 (a polling worker takes the core of the thread about to submit the op).");

namespace {

bool readLine(const std::string& path, std::string* line) {
  std::ifstream f(path);
  return static_cast<bool>(std::getline(f, *line));
}

bool readInt(const std::string& path, int64_t* v) {
  std::string line;
  if (!readLine(path, &line)) return false;
  char* end = nullptr;
  long long x = std::strtoll(line.c_str(), &end, 10);
  if (end == line.c_str()) return false;
  *v = x;
  return true;
}

// "/a/b" -> {"/a/b", "/a", ""}: the cgroup and its ancestors up to the
// mount's root (Note [Counting cores]: the root is read too).
std::vector<std::string> selfAndAncestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    out.push_back(path);
    if (path.empty()) break;
    path = path.substr(0, path.rfind('/'));
  }
  return out;
}

// v2: "max 100000" (none) or "<quota> <period>".
double quotaV2(const std::string& file) {
  std::string line;
  if (!readLine(file, &line)) return 0;
  std::istringstream in(line);
  std::string quota;
  int64_t period = 100000;
  in >> quota >> period;
  if (quota.empty() || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || q <= 0) return 0;
  return static_cast<double>(q) / static_cast<double>(period);
}

// v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
double quotaV1(const std::string& dir) {
  int64_t quota = -1, period = 0;
  if (!readInt(dir + "/cpu.cfs_quota_us", &quota) || quota <= 0) return 0;
  if (!readInt(dir + "/cpu.cfs_period_us", &period) || period <= 0) return 0;
  return static_cast<double>(quota) / static_cast<double>(period);
}

}  // namespace

double cgroupQuotaCores(const CgroupFiles& files, std::string* where) {
  // Each line: "<id>:<controllers>:<path>"; v2's is "0::<path>".
  std::string v2Path, v1Path;
  bool haveV2 = false, haveV1 = false;
  std::ifstream f(files.procSelfCgroup);
  for (std::string line; std::getline(f, line);) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (controllers.empty()) {
      haveV2 = true;
      v2Path = path;
      continue;
    }
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) {
      if (c == "cpu") {
        haveV1 = true;
        v1Path = path;
      }
    }
  }
  double best = 0;
  auto consider = [&](double q, const std::string& file) {
    if (q > 0 && (best == 0 || q < best)) {
      best = q;
      if (where) *where = file;
    }
  };
  // Without /proc/self/cgroup (not Linux's, or hidden), the mount's root is
  // still the best guess.
  if (haveV2 || !haveV1) {
    for (const auto& p : selfAndAncestors(v2Path)) {
      const std::string file = files.mountRoot + p + "/cpu.max";
      consider(quotaV2(file), file);
    }
  }
  if (haveV1 || !haveV2) {
    for (const char* mount : {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"}) {
      for (const auto& p : selfAndAncestors(v1Path)) {
        const std::string dir = files.mountRoot + mount + p;
        consider(quotaV1(dir), dir + "/cpu.cfs_quota_us");
      }
    }
  }
  return best;
}

UsableCores usableCores(const CgroupFiles& files, int affinity) {
  UsableCores u;
  if (affinity < 0) {
    // A process braid bound to one CPU still counts the cores it had
    // (Note [Pinning ranks on a full host] in rank_pinning.h).
    affinity = affinityBeforePinning();
    cpu_set_t set;
    if (affinity <= 0) affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  u.affinity = std::max(affinity, 1);
  u.quotaCores = cgroupQuotaCores(files, &u.quotaFile);
  u.cores = u.affinity;
  if (u.quotaCores > 0) {
    // A fraction of a core cannot hold a spinning thread: 2.5 cores is 2.
    const int quota = std::max(1, static_cast<int>(std::floor(u.quotaCores + 1e-9)));
    u.cores = std::min(u.cores, quota);
  }
  return u;
}

std::string UsableCores::describe() const {
  std::ostringstream s;
  s << cores << " (affinity " << affinity;
  if (quotaCores > 0) {
    s << ", cgroup quota " << quotaCores << " cores: " << quotaFile;
  } else {
    s << ", no cgroup quota";
  }
  s << ")";
  return s.str();
}

SpinPolicy chooseSpinPolicy(int cores, int ranksHere, int threadsPerRank, int64_t shmSpinUs,
                            int64_t workerSpinUs) {
  SpinPolicy p;
  p.cores = std::max(cores, 1);
  p.ranksHere = std::max(ranksHere, 1);
  p.threadsPerRank = std::max(threadsPerRank, 1);
  // Note [How long to spin]: one spinning thread per rank.
  p.everyRankHasACore = p.ranksHere <= p.cores;
  p.shortSpin = kShortSpin;
  p.longSpin = p.everyRankHasACore ? kLongSpin : kShortSpin;
  // The idle worker polls only where it has a core beside its rank's thread.
  const bool spareCores = static_cast<int64_t>(p.ranksHere) * (1 + p.threadsPerRank) <= p.cores;
  p.workerIdle = spareCores ? kLongSpin : std::chrono::microseconds(0);
  if (shmSpinUs >= 0) {
    p.shmSpinSet = true;
    p.shortSpin = p.longSpin = std::chrono::microseconds(shmSpinUs);
  }
  if (workerSpinUs >= 0) {
    p.workerSpinSet = true;
    p.workerIdle = std::chrono::microseconds(workerSpinUs);
  }
  return p;
}

namespace {
std::atomic<int> lastCores{0};  // of the last policy chosen: what coresToSpare compares with

// The host's runnable threads now ("0.50 0.40 0.30 3/120 4567": 3), 0 if unknown.
int runnableNow() {
  char buf[128];
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return 0;
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  double a, b, c;
  int running = 0, total = 0;
  return std::sscanf(buf, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total) == 5 ? running : 0;
}
}  // namespace

bool coresToSpare() {
  static std::atomic<int64_t> readAt{0};  // 0: never
  static std::atomic<bool> spare{true};
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  const int64_t now = t.tv_sec * 1000000000LL + t.tv_nsec;
  const int64_t at = readAt.load(std::memory_order_relaxed);
  if (at == 0 || now - at >= 1000000) {
    readAt.store(now, std::memory_order_relaxed);
    const int cores = lastCores.load(std::memory_order_relaxed);
    spare.store(cores <= 0 || runnableNow() <= cores, std::memory_order_relaxed);
  }
  return spare.load(std::memory_order_relaxed);
}

SpinPolicy spinPolicyFor(int ranksHere, int rank) {
  const int64_t shm = kShmSpinUs.get(), worker = kWorkerSpinUs.get();
  BRAID_ENFORCE(shm >= -1, "init", rank, "BRAID_SHM_SPIN_US must be >= 0 (or -1: automatic), got ",
                shm);
  BRAID_ENFORCE(worker >= -1, "init", rank,
                "BRAID_WORKER_SPIN_US must be >= 0 (or -1: automatic), got ", worker);
  const UsableCores u = usableCores();
  SpinPolicy p = chooseSpinPolicy(u.cores, ranksHere, kBraidThreadsPerRank, shm, worker);
  lastCores.store(u.cores, std::memory_order_relaxed);
  // Once per process, as groups of one size usually repeat (one per
  // new_group); a group of another size logs its own.
  static std::mutex mu;
  static std::string last;
  const std::string text = p.describe() + "; cores: " + u.describe();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (text == last) return p;
    last = text;
  }
  BRAID_LOG(kInfo, "spin", rank) << "spin policy: " << text;
  return p;
}

std::string SpinPolicy::describe() const {
  std::ostringstream s;
  s << ranksHere << " rank(s) here on " << cores << " core(s), " << threadsPerRank
    << " braid thread(s) per rank beside its own: "
    << (everyRankHasACore ? "every rank has a core" : "ranks outnumber the cores")
    << "; waits spin " << longSpin.count() << " us while the rank waits for the op, "
    << shortSpin.count() << " us beside its work" << (shmSpinSet ? " (BRAID_SHM_SPIN_US)" : "")
    << "; the idle worker polls " << workerIdle.count() << " us"
    << (workerSpinSet ? " (BRAID_WORKER_SPIN_US)" : "");
  return s.str();
}

namespace {
thread_local const std::atomic<int>* tlsBoost = nullptr;
const std::atomic<int> kAlways{1};
}  // namespace

SpinBoost::SpinBoost(const std::atomic<int>* waiters) : saved_(tlsBoost) { tlsBoost = waiters; }
SpinBoost::~SpinBoost() { tlsBoost = saved_; }
const std::atomic<int>* SpinBoost::always() { return &kAlways; }
bool SpinBoost::active() {
  const std::atomic<int>* f = tlsBoost;
  return f != nullptr && f->load(std::memory_order_relaxed) > 0;
}

}  // namespace braid
