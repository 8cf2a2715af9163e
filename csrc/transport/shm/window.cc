#include "transport/shm/window.h"

#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/cpu_cores.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "transport/shm/ring.h"

namespace braid {
namespace transport {
namespace shm {

BRAID_SETTING_INT(kSlotBytes, "BRAID_SHM_SLOT_BYTES", 1 << 20,
                  "Data bytes per shared-memory slot: the largest chunk of pipelined collectives "
                  "and one-shot op. Must be equal on every rank.");
BRAID_SETTING_BOOL(kUseCma, "BRAID_SHM_CMA", true,
                   "Let large transfers read peers' memory directly (process_vm_readv) when "
                   "the OS permits it; 0 keeps every transfer in shared memory.");
BRAID_SETTING_INT(kChannelBytes, "BRAID_SHM_P2P_BYTES", 0,
                  "Bytes of each point-to-point ring (one per ordered pair of ranks); 0: 1 MiB "
                  "up to 17 ranks, then 16 MiB / (ranks - 1), at least 256 KiB (Note [Ring "
                  "size]). Must be equal on every rank.");

// Note [Ring size]
// A message larger than its ring goes through it in rounds: the writer fills
// it, sleeps until the reader has drained some, and so on, a pair of wake-ups
// per round. 256 KiB rings cost a 1 MiB message four rounds. A ring shift
// (every rank sends to the next with isend and irecv, benchmarks/collectives.py
// sendrecv, 2 ranks, alternating runs) took 292-330 us at 1 MiB and 8.4 ms at
// 16 MiB with 256 KiB rings, 208-224 us and 4.9-5.0 ms with 1 MiB; 4 MiB rings
// gained little more (5.1 against 5.6 ms in one sweep); at 4 ranks on 2 cores,
// 16 MiB took 11.6-14.5 ms against 8.5-10.4 (benchmarks/results/p2p-rings.txt).
// Each rank's segment holds one ring per peer, but tmpfs gives a ring pages
// only once a message runs through it (Note [Reserved shared memory]), so a
// pair that exchanges no point-to-point message costs nothing. A group whose
// every pair does costs n(n-1) rings, hence at most 16 MiB of rings per rank:
// 1 MiB up to 17 ranks, less above, never below the 256 KiB of old.
size_t defaultChannelBytes(int size) {
  constexpr size_t kMost = 1 << 20, kLeast = 256 << 10, kPerRank = 16 << 20;
  if (size <= 1) return kMost;
  const size_t share = kPerRank / static_cast<size_t>(size - 1) / 4096 * 4096;
  return std::max(kLeast, std::min(kMost, share));
}

namespace {
constexpr uint64_t kMagic = 0x62726169642d7731ULL;  // "braid-w1"
constexpr size_t kHeaderBytes = 4096;
constexpr std::chrono::milliseconds kLivenessPeriod{100};

size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << ']';
  return os.str();
}
}  // namespace

// Note [A rank that gives up]
// A rank whose op failed because of a third party (a timeout, a lost peer,
// or in a hierarchical op a failed stage across hosts) leaves its group
// broken, and its host mates may be waiting for it in a step it will never
// publish. Timing out there would blame this rank, a second-hand error, and
// only at their deadline. So Communicator::markBroken publishes its reason
// here (gaveUp, then why), pokes its step counter, and every wait on this
// rank fails at once with that reason, which names the rank or host really
// lost. A 2 hosts x 2 ranks job whose other host stops: the host mate of
// the rank whose TCP stage timed out used to time out in the shared-memory
// stage, naming its host mate, up to a stage later.
constexpr size_t kWhyBytes = 2048;

struct ShmWindow::RankHeader {
  Counter step;      // the last step this rank published
  Counter activity;  // poked when a peer touches one of this rank's channels
  uint64_t magic;
  uint64_t totalBytes;
  int32_t pid;
  std::atomic<int32_t> closed;
  uint64_t probeAddr;   // address, in this process, of a word holding probeValue
  uint64_t probeValue;
  std::atomic<int32_t> gaveUp;  // why holds the reason once set (release/acquire)
  char why[kWhyBytes];
};

namespace {
// Reads `bytes` from `pid`'s memory; returns false on any failure.
bool cmaRead(int pid, uint64_t addr, void* dst, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers cannot see what the kernel reads. With threads as ranks
  // (the C++ tests) the peer's memory is ours: copy it in user space, so
  // that ASan checks the source and TSan sees the read.
  if (pid == getpid()) {
    std::memcpy(dst, reinterpret_cast<const void*>(addr), bytes);
    return true;
  }
#endif
  auto* out = static_cast<uint8_t*>(dst);
  while (bytes > 0) {
    struct iovec local{out, bytes};
    struct iovec remote{reinterpret_cast<void*>(addr), bytes};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) return false;
    out += n;
    addr += n;
    bytes -= n;
  }
  return true;
}
}  // namespace

ShmWindow::ShmWindow(int rank, int size, size_t slotBytes, size_t controlBytes,
                     size_t channelBytes)
    : rank_(rank),
      size_(size),
      slotBytes_(slotBytes),
      controlBytes_(controlBytes),
      channelBytes_(channelBytes) {
  static_assert(sizeof(RankHeader) <= kHeaderBytes, "the rank header outgrew its page");
  controlOffset_ = kHeaderBytes;
  dataOffset_ = roundUp(controlOffset_ + kSlots * controlBytes_, 4096);
  channelOffset_ = roundUp(dataOffset_ + kSlots * slotBytes_, 4096);
  totalBytes_ = channelOffset_ + size_ * (sizeof(RingHeader) + channelBytes_);
}

std::unique_ptr<ShmWindow> ShmWindow::create(Store& store, int rank, int size,
                                             const WindowOptions& opts) {
  size_t slot = opts.slotBytes ? opts.slotBytes : static_cast<size_t>(kSlotBytes.get());
  const int64_t chanSetting = kChannelBytes.get();
  BRAID_ENFORCE(chanSetting >= 0, "init", rank, "BRAID_SHM_P2P_BYTES must be >= 0, got ",
                chanSetting);
  size_t chan = opts.channelBytes;
  if (!chan) chan = chanSetting ? static_cast<size_t>(chanSetting) : defaultChannelBytes(size);
  BRAID_ENFORCE(slot >= 4096 && slot % 64 == 0, "init", rank,
                "BRAID_SHM_SLOT_BYTES must be a multiple of 64 and at least 4096, got ", slot);
  BRAID_ENFORCE(slot >= 64 * static_cast<size_t>(size), "init", rank,
                "BRAID_SHM_SLOT_BYTES must be at least 64 bytes per rank (", 64 * size, "), got ",
                slot);
  BRAID_ENFORCE(chan >= 4096, "init", rank, "BRAID_SHM_P2P_BYTES must be at least 4096, got ",
                chan);
  size_t control = roundUp(std::max<size_t>(opts.controlBytes, 64), 64);
  std::unique_ptr<ShmWindow> w(new ShmWindow(rank, size, slot, control, chan));
  // Read per group, as settings.h promises (a process can sweep it), not once
  // per process; Note [How long to spin] in common/cpu_cores.h.
  const SpinPolicy policy = spinPolicyFor(size, rank);
  if (opts.spinUs >= 0) {
    w->spin_ = w->longSpin_ = std::chrono::microseconds(opts.spinUs);
  } else {
    w->spin_ = policy.shortSpin;
    w->longSpin_ = policy.longSpin;
  }
  w->longBudgetNs_.store(w->longSpin_.count(), std::memory_order_relaxed);
  w->names_ = opts.peerNames;
  // Note [Spin, then sleep]: with more ranks than cores a long spin cannot make a rank faster
  // (the kernel preempts the spinner for the peer it waits for) but takes the core from every
  // other thread there (benchmarks/concurrency.py, 4 ranks on 2 cores, 100000 us: gloo beside it
  // ran 1.8x slower at 4 KiB and braid had 35x the involuntary switches at 1 MiB). The automatic
  // policy never does that; an explicit value is kept, with a warning.
  static std::atomic<bool> warned{false};  // once per process, not per group and rank
  const auto longest = std::chrono::duration_cast<std::chrono::microseconds>(w->longSpin_);
  if (longest.count() > 200 && !policy.everyRankHasACore && !warned.exchange(true)) {
    BRAID_LOG(kWarn, "shm", rank) << "BRAID_SHM_SPIN_US=" << longest.count() << " with " << size
                                  << " ranks on " << policy.cores
                                  << " usable cores: spinning waiters take the cores of the ranks "
                                     "they wait for; keep it at a few tens of microseconds";
  }

  // Keys carry an incarnation number so that a reused store (file://) never
  // hands out a name from an earlier group. See Note [Segment lifetime].
  int64_t ticket = store.add("braid/shm/incarnation", 1);
  std::string prefix = "braid/shm/" + std::to_string((ticket - 1) / size) + "/";
  // Everyone arrives before anyone creates a segment, which keeps the window
  // in which a name exists in /dev/shm as short as possible. Arriving ranks
  // bring the sizes that fix the segment's layout, so that a difference fails
  // every rank here, naming both values, instead of one rank's open() while
  // the others wait (Note [Settings that shape an op]).
  const std::string layout = std::to_string(slot) + "," + std::to_string(chan);
  store.set(prefix + "here/" + std::to_string(rank), bytesOf(layout));
  for (int r = 0; r < size; ++r) {
    std::string theirs = stringOf(store.get(prefix + "here/" + std::to_string(r), opts.timeout));
    if (theirs == layout) continue;
    const std::string theirSlot = theirs.substr(0, theirs.find(','));
    const std::string theirChan = theirs.substr(theirs.find(',') + 1);
    const bool slotDiffers = theirSlot != std::to_string(slot);
    BRAID_THROW(Error, "init", rank, "rank ", r, " runs with ",
                slotDiffers ? "BRAID_SHM_SLOT_BYTES=" : "BRAID_SHM_P2P_BYTES=",
                slotDiffers ? theirSlot : theirChan, ", this rank with ",
                slotDiffers ? "BRAID_SHM_SLOT_BYTES=" : "BRAID_SHM_P2P_BYTES=",
                slotDiffers ? slot : chan,
                " (settings that shape the shared memory must be equal on every rank)");
  }

  sweepStale();
  w->segments_.resize(size);
  Segment& mine = w->segments_[rank];
  const std::string failedMark(1, '\x01');  // a name key that says why there is no segment
  try {
    // Note [Reserved shared memory]: what is touched now or by every op.
    mine = Segment::create(w->totalBytes_);
    mine.reserve(0, w->channelOffset_, "this rank's slots");
    for (int j = 0; j < size; ++j) {
      mine.reserve(w->ringOffset(j), sizeof(RingHeader), "this rank's rings");
    }
  } catch (const Error& e) {
    mine.unlink();
    // The peers wait for this rank's segment: they fail now, with its reason.
    store.set(prefix + "name/" + std::to_string(rank), bytesOf(failedMark + e.what()));
    BRAID_THROW(Error, "init", rank, e.what());
  }
  try {
    auto* h = new (mine.base()) RankHeader();
    h->magic = kMagic;
    h->totalBytes = w->totalBytes_;
    h->pid = getpid();
    h->closed.store(0);
    h->gaveUp.store(0);
    w->probe_ = std::make_unique<uint64_t>(0x9e3779b97f4a7c15ULL ^ (uint64_t(rank) << 17));
    h->probeAddr = reinterpret_cast<uint64_t>(w->probe_.get());
    h->probeValue = *w->probe_;
    for (int j = 0; j < size; ++j) new (mine.base() + w->ringOffset(j)) RingHeader();
    store.set(prefix + "name/" + std::to_string(rank), bytesOf(mine.name()));
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      std::string name = stringOf(store.get(prefix + "name/" + std::to_string(r), opts.timeout));
      if (name.compare(0, failedMark.size(), failedMark) == 0) {
        BRAID_THROW(Error, "init", rank, "rank ", r, " could not make its shared memory: ",
                    name.substr(failedMark.size()));
      }
      w->segments_[r] = Segment::open(name, w->totalBytes_);
      BRAID_ENFORCE(w->header(r)->magic == kMagic, "init", rank, "segment of rank ", r,
                    " has a foreign layout");
    }
    // Note [Direct transfers]: probe whether this rank may read every peer's
    // private memory; the group uses direct reads only if all ranks may.
    bool canRead = opts.useCma >= 0 ? opts.useCma != 0 : kUseCma.get();
    for (int r = 0; r < size && canRead; ++r) {
      uint64_t got = 0;
      RankHeader* ph = w->header(r);
      canRead = cmaRead(ph->pid, ph->probeAddr, &got, sizeof(got)) && got == ph->probeValue;
    }
    store.set(prefix + "mapped/" + std::to_string(rank), {static_cast<uint8_t>(canRead)});
    w->canReadPeers_ = true;
    for (int r = 0; r < size; ++r) {
      auto v = store.get(prefix + "mapped/" + std::to_string(r), opts.timeout);
      w->canReadPeers_ = w->canReadPeers_ && !v.empty() && v[0] == 1;
    }
    for (int r = 0; r < size; ++r) w->pids_.push_back(w->header(r)->pid);
  } catch (...) {
    mine.unlink();
    throw;
  }
  mine.unlink();
  w->layout();
  BRAID_LOG(kInfo, "shm", rank) << "window ready: " << size << " ranks, " << slot
                                << " B slots, " << chan << " B p2p rings, direct reads "
                                << (w->canReadPeers_ ? "on" : "off");
  return w;
}

void ShmWindow::layout() {
  to_.resize(size_);
  from_.resize(size_);
  for (int peer = 0; peer < size_; ++peer) {
    const size_t mineOff = ringOffset(peer), theirsOff = ringOffset(rank_);
    uint8_t* m = segments_[rank_].base() + mineOff;
    uint8_t* t = segments_[peer].base() + theirsOff;
    // Note [Reserved shared memory]: a ring's pages when it first carries a message.
    auto reserve = [this, mineOff, peer] {
      segments_[rank_].reserve(mineOff, sizeof(RingHeader) + channelBytes_,
                               strCat("the ring to ", who(peer)));
    };
    to_[peer] = std::make_unique<RingChannel>(reinterpret_cast<RingHeader*>(m),
                                              m + sizeof(RingHeader), channelBytes_,
                                              &header(peer)->activity, reserve);
    from_[peer] = std::make_unique<RingChannel>(reinterpret_cast<RingHeader*>(t),
                                                t + sizeof(RingHeader), channelBytes_,
                                                &header(peer)->activity);
  }
}

ShmWindow::~ShmWindow() { markClosed(); }

ShmWindow::RankHeader* ShmWindow::header(int r) const {
  return reinterpret_cast<RankHeader*>(segments_[r].base());
}

uint8_t* ShmWindow::data(int r, uint64_t step) {
  return segments_[r].base() + dataOffset_ + (step % kSlots) * slotBytes_;
}

uint8_t* ShmWindow::control(int r, uint64_t step) {
  return segments_[r].base() + controlOffset_ + (step % kSlots) * controlBytes_;
}

uint8_t* ShmWindow::lineBytes(int r) {
  static_assert(sizeof(Counter::beside) >= kLineBytes, "the step counter's line is too short");
  return header(r)->step.beside;
}

uint64_t ShmWindow::published(int r) const {
  return header(r)->step.value.load(std::memory_order_acquire);
}

void ShmWindow::publish(uint64_t step) { header(rank_)->step.publish(step); }

bool ShmWindow::peerGone(int peer, std::string* why) {
  RankHeader* h = header(peer);
  if (h->gaveUp.load(std::memory_order_acquire)) {
    if (why) {
      *why = strCat(who(peer), " gave up on the group after an error: ",
                    std::string(h->why, strnlen(h->why, kWhyBytes)));
    }
    return true;
  }
  if (h->closed.load(std::memory_order_acquire)) {
    if (why) *why = strCat(who(peer), " left the group (destroyed it or exited)");
    return true;
  }
  if (h->pid != getpid() && processGone(h->pid)) {
    if (why) *why = strCat(who(peer), " (pid ", h->pid, ") exited");
    return true;
  }
  return false;
}

void ShmWindow::wait(int peer, uint64_t step, const WaitContext& ctx) {
  Counter& c = header(peer)->step;
  if (c.value.load(std::memory_order_acquire) >= step) return;
  for (;;) {
    if (aborted_.load(std::memory_order_relaxed)) {
      BRAID_THROW(PeerLostError, ctx.op, rank_, "the group was shut down while op #", ctx.opSeq,
                  " waited for ", who(peer));
    }
    auto now = Clock::now();
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(ctx.deadline - now);
    auto slice = std::min<std::chrono::microseconds>(std::max(left, std::chrono::microseconds(1)),
                                                     kLivenessPeriod);
    // Note [Spin less when spinning fails]
    // The policy counts cores, not what else runs on them: beside a compiler
    // on both of this machine's cores, 2 ranks spinning 1 ms per wait took
    // 400-650 us per 4-byte allreduce (38 us with 20 us of spin), each rank
    // spinning while the peer it waits for had no core. So a long spin that
    // ends without the peer halves the next one (down to the short spin),
    // and each wait the spin saw through earns an eighth of the budget back:
    // a peer that keeps coming late (a loaded host, or ranks out of step by
    // more than the spin) makes the waits sleep as before, and spinning comes
    // back once the peers are prompt again. (Two more guards: a wait spins
    // long only while the host's runnable threads fit its cores, Note [Nobody
    // else wants the cores] in common/cpu_cores.h, and stops when preempted,
    // Note [A preempted spinner sleeps] in futex.cc.)
    const int64_t budget = longBudgetNs_.load(std::memory_order_relaxed);
    bool spunOut = false;
    const WaitResult r =
        waitAtLeast(c, step, slice, spin_, std::chrono::nanoseconds(budget), &spunOut);
    if (spunOut) {
      longBudgetNs_.store(std::max<int64_t>(spin_.count(), budget / 2), std::memory_order_relaxed);
    } else if (r == WaitResult::kReached && budget < longSpin_.count()) {
      longBudgetNs_.store(std::min<int64_t>(longSpin_.count(), budget + budget / 8 + spin_.count()),
                          std::memory_order_relaxed);
    }
    if (r == WaitResult::kReached) return;
    std::string why;
    if (peerGone(peer, &why)) {
      BRAID_THROW(PeerLostError, ctx.op, rank_, why, " while this rank waited for it in op #",
                  ctx.opSeq);
    }
    if (Clock::now() >= ctx.deadline) failWait({peer}, step, ctx);
  }
}

// Each rank polls its peers starting from the next rank up (issue 30): in
// rank order every waiter would spin on rank 0's counter line first, and a
// publish there would answer n-1 readers at once; staggered, the waiters
// spread over the lines of the ranks they still miss.
void ShmWindow::waitAll(uint64_t step, const WaitContext& ctx) {
  for (int k = 1; k < size_; ++k) {
    const int r = (rank_ + k) % size_;
    try {
      wait(r, step, ctx);
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int q = 0; q < size_; ++q) {
        if (q != rank_ && published(q) < step) missing.push_back(q);
      }
      failWait(missing, step, ctx);
    }
  }
}

void ShmWindow::failWait(const std::vector<int>& missing, uint64_t step, const WaitContext& ctx) {
  if (names_.empty()) {
    BRAID_THROW(TimeoutError, ctx.op, rank_, "Timed out after ", ctx.timeout.count(),
                " ms waiting for rank(s) ", rankList(missing), " (op #", ctx.opSeq, ")");
  }
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i) list += strCat(i ? ", " : "", who(missing[i]));
  BRAID_THROW(TimeoutError, ctx.op, rank_, "Timed out after ", ctx.timeout.count(),
              " ms waiting for ", list, " (op #", ctx.opSeq, ")");
}

size_t ShmWindow::ringOffset(int peer) const {
  return channelOffset_ + peer * (sizeof(RingHeader) + channelBytes_);
}

std::string ShmWindow::who(int r) const {
  return r < static_cast<int>(names_.size()) ? names_[r] : strCat("rank ", r);
}

ByteChannel& ShmWindow::to(int peer) { return *to_.at(peer); }
ByteChannel& ShmWindow::from(int peer) { return *from_.at(peer); }

uint32_t ShmWindow::activityEpoch() {
  return header(rank_)->activity.futexWord.load(std::memory_order_seq_cst);
}

void ShmWindow::waitActivity(uint32_t epoch, std::chrono::microseconds maxWait) {
  if (aborted_.load()) return;
  sleepOnWord(header(rank_)->activity, epoch, maxWait);
}

void ShmWindow::notifyActivity() { header(rank_)->activity.poke(); }

void ShmWindow::readPeer(int peer, uint64_t remoteAddr, void* dst, size_t bytes,
                         const WaitContext& ctx) {
  if (bytes == 0) return;
  if (!cmaRead(pids_[peer], remoteAddr, dst, bytes)) {
    int e = errno;
    std::string why;
    if (peerGone(peer, &why)) BRAID_THROW(PeerLostError, ctx.op, rank_, why, " in op #", ctx.opSeq);
    // Note [A peer that leaves during a direct read]
    // A peer publishes its
    // buffer's address and keeps it mapped until its readers are done, unless
    // it leaves the op. ESRCH: its address space is gone, it is exiting (not
    // yet a zombie, so peerGone cannot tell yet). EFAULT: it is alive but left
    // the op (its op failed because of another rank, or it shut down) and
    // freed the buffer. Either way the ranks are out of step: a lost peer.
    if (e == ESRCH) {
      BRAID_THROW(PeerLostError, ctx.op, rank_, who(peer), " (pid ", pids_[peer],
                  ") exited while this rank read its memory in op #", ctx.opSeq);
    }
    if (e == EFAULT) {
      BRAID_THROW(PeerLostError, ctx.op, rank_, who(peer), " left op #", ctx.opSeq,
                  " while this rank read its memory (it no longer maps the buffer it shared: "
                  "its op failed or its group was shut down)");
    }
    BRAID_THROW(Error, ctx.op, rank_, "reading ", bytes, " bytes of ", who(peer),
                "'s memory failed: ", std::strerror(e), " (set BRAID_SHM_CMA=0 to avoid direct reads)");
  }
}

void ShmWindow::abort() {
  aborted_.store(true);
  // Wake our own sleepers: they may sleep on any peer's counter.
  for (int r = 0; r < size_; ++r) {
    if (segments_[r].base()) {
      header(r)->step.poke();
    }
  }
  header(rank_)->activity.poke();
}

void ShmWindow::giveUp(const std::string& why) {
  if (segments_.empty() || !segments_[rank_].base() || gaveUp_.exchange(true)) return;
  RankHeader* h = header(rank_);
  const size_t n = std::min(why.size(), kWhyBytes - 1);
  std::memcpy(h->why, why.data(), n);
  h->why[n] = '\0';
  h->gaveUp.store(1, std::memory_order_release);
  wakeWaitersOnMe();
}

void ShmWindow::markClosed() {
  if (segments_.empty() || !segments_[rank_].base()) return;
  header(rank_)->closed.store(1, std::memory_order_release);
  wakeWaitersOnMe();
}

// Peers sleep on this rank's step counter (collectives) or on their own
// activity word (point-to-point pollers): wake both kinds to see its state.
void ShmWindow::wakeWaitersOnMe() {
  header(rank_)->step.poke();
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && segments_[r].base()) header(r)->activity.poke();
  }
}

}  // namespace shm
}  // namespace transport
}  // namespace braid
