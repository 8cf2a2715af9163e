// Note [Pinning ranks on a full host] in rank_pinning.h.
#include "common/rank_pinning.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "common/cpu_cores.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"

namespace braid {

BRAID_SETTING_STRING(kPinRanks, "BRAID_PIN_RANKS", "auto",
                     "auto: where a single-host group's ranks outnumber the usable cores and "
                     "nobody placed the process (its mask allows every online CPU), bind each "
                     "rank's process to one CPU, rank r to the (r mod k)-th CPU of its mask (Note "
                     "[Pinning ranks on a full host]); 1: bind every single-host group's ranks "
                     "so, within whatever mask they have; 0: never. Undone when the groups are "
                     "destroyed. Ranks need not agree.");

namespace {

std::atomic<int> countBefore{0};

cpu_set_t toSet(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  return set;
}

std::vector<int> fromSet(const cpu_set_t& set) {
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<pid_t> threadsOfThisProcess() {
  std::vector<pid_t> tids;
  DIR* d = opendir("/proc/self/task");
  if (!d) return tids;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') tids.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
  }
  closedir(d);
  return tids;
}

// Sets `to` on every thread of the process whose mask is `from` (every thread
// when `from` is empty). A thread that exits meanwhile fails with ESRCH,
// which is fine; a thread the program placed itself keeps its place.
void rebindThreads(const std::vector<int>& from, const std::vector<int>& to) {
  const cpu_set_t target = toSet(to);
  for (pid_t tid : threadsOfThisProcess()) {
    cpu_set_t now;
    if (!from.empty()) {
      if (sched_getaffinity(tid, sizeof(now), &now) != 0 || fromSet(now) != from) continue;
    }
    sched_setaffinity(tid, sizeof(target), &target);
  }
}

std::mutex mu;
std::weak_ptr<RankPin> current;  // under mu

}  // namespace

std::vector<int> currentAffinity() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  return fromSet(set);
}

int affinityBeforePinning() { return countBefore.load(std::memory_order_relaxed); }

PinMode pinModeFromSetting(int rank) {
  const std::string v = kPinRanks.get();
  if (v == "auto" || v.empty()) return PinMode::kAuto;
  if (v == "0") return PinMode::kOff;
  if (v == "1") return PinMode::kOn;
  BRAID_THROW(Error, "init", rank, "BRAID_PIN_RANKS must be auto, 0 or 1, got '", v, "'");
}

PinDecision choosePin(PinMode mode, int localRank, int ranksHere, const std::vector<int>& maskCpus,
                      int onlineCpus, int usableCores) {
  PinDecision d;
  const int k = static_cast<int>(maskCpus.size());
  if (mode == PinMode::kOff) {
    d.why = "BRAID_PIN_RANKS=0";
  } else if (k == 0 || localRank < 0 || ranksHere < 1) {
    d.why = "no affinity mask to choose from";
  } else if (mode == PinMode::kAuto && k < onlineCpus) {
    d.why = strCat("the process is already placed (its mask allows ", k, " of ", onlineCpus,
                   " CPUs)");
  } else if (mode == PinMode::kAuto && ranksHere <= usableCores) {
    d.why = strCat(ranksHere, " ranks here on ", usableCores,
                   " usable cores: every rank has a core");
  } else {
    d.pin = true;
    d.cpu = maskCpus[static_cast<size_t>(localRank % k)];
    d.why = strCat(mode == PinMode::kOn ? "BRAID_PIN_RANKS=1" : "BRAID_PIN_RANKS=auto", ", ",
                   ranksHere, " ranks here on ", usableCores, " usable cores: local rank ",
                   localRank, " on CPU ", d.cpu);
  }
  return d;
}

namespace {
PinDecision choosePinFrom(PinMode mode, int localRank, int ranksHere, const std::vector<int>& mask) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return choosePin(mode, localRank, ranksHere, mask, static_cast<int>(online), usableCores().cores);
}
}  // namespace

PinDecision choosePinHere(PinMode mode, int localRank, int ranksHere) {
  return choosePinFrom(mode, localRank, ranksHere, currentAffinity());
}

RankPin::RankPin(int cpu, std::vector<int> before) : cpu_(cpu), before_(std::move(before)) {
  countBefore.store(static_cast<int>(before_.size()), std::memory_order_relaxed);
  rebindThreads({}, {cpu_});
}

RankPin::~RankPin() {
  rebindThreads({cpu_}, before_);
  countBefore.store(0, std::memory_order_relaxed);
}

std::shared_ptr<RankPin> pinRankIfFull(PinMode mode, int localRank, int ranksHere, int rank) {
  std::lock_guard<std::mutex> lock(mu);
  if (auto pin = current.lock()) return pin;  // the first group's binding holds
  if (mode == PinMode::kOff) return nullptr;
  // One read of the mask: the decision and the restore see the same one.
  std::vector<int> mask = currentAffinity();
  const PinDecision d = choosePinFrom(mode, localRank, ranksHere, mask);
  BRAID_LOG(kInfo, "pin", rank) << (d.pin ? "bound: " : "not bound: ") << d.why;
  if (!d.pin) return nullptr;
  auto pin = std::make_shared<RankPin>(d.cpu, std::move(mask));
  current = pin;
  return pin;
}

}  // namespace braid
