// The same-GPU communicator: Note [Same-GPU collectives] in same_gpu.h.
#include "cuda/shared_gpu/same_gpu_comm.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "cuda/on_device.h"

namespace braid {
namespace cuda {
namespace samegpu {

Comm::Comm(DeviceApi& dev, int nranks, int rank, int device,
           std::shared_ptr<transport::shm::SharedRegion> control, size_t halfBytes, size_t smallBytes)
    : dev_(dev),
      n_(nranks),
      rank_(rank),
      device_(device),
      control_(std::move(control)),
      halfBytes_(halfBytes),
      smallBytes_(smallBytes),
      bufs_(nranks, nullptr),
      events_(nranks, nullptr) {
  buf_ = dev_.deviceAllocShareable(device_, 2 * halfBytes_);
  try {
    event_ = dev_.eventCreateShareable(device_);
    Slot& me = slot(rank_);
    me.pid = static_cast<int32_t>(getpid());
    me.halfBytes = halfBytes_;
    me.smallBytes = smallBytes_;
    const std::string mem = dev_.ipcMemHandle(buf_);
    const std::string ev = dev_.ipcEventHandle(event_);
    std::memcpy(me.mem, mem.data(), kIpcHandleBytes);
    std::memcpy(me.event, ev.data(), kIpcHandleBytes);
    me.barrier.store(0);
    me.aborted.store(0);
    me.state.store(kPublished, std::memory_order_release);
  } catch (...) {
    close();
    throw;
  }
  bufs_[rank_] = buf_;
  events_[rank_] = event_;
}

Comm::~Comm() { close(); }

Slot& Comm::slot(int q) const { return static_cast<Control*>(control_->data())->slots[q]; }

NcclResult Comm::fail(NcclResult r, std::string why) {
  lastError_ = std::move(why);
  return r;
}

bool Comm::peerGone(int q, std::string* why, bool closedIsGone) const {
  const Slot& s = slot(q);
  if (s.aborted.load(std::memory_order_acquire)) {
    *why = strCat("rank ", q, " aborted its same-GPU communicator");
    return true;
  }
  if (closedIsGone && s.state.load(std::memory_order_acquire) == kClosed) {
    *why = strCat("rank ", q, " destroyed its same-GPU communicator");
    return true;
  }
  const pid_t pid = s.pid;
  if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
    *why = strCat("rank ", q, " (pid ", pid, ") has exited");
    return true;
  }
  return false;
}

namespace {

// Whether rank q of `control` may still map its peers' buffers.
bool mapsPeers(const Control& control, int q) {
  const Slot& s = control.slots[q];
  // A peer opens the handles only after every rank published, and marks its
  // slot kClosed only after it closed them; a process that exited maps nothing.
  if (s.state.load(std::memory_order_acquire) != kPublished) return false;
  const pid_t pid = s.pid;
  return !(pid > 0 && kill(pid, 0) != 0 && errno == ESRCH);
}

// Note [Exported buffers outlive their mappings]: the buffers close() could
// not free yet, freed by a later close() in this process once no peer maps
// them, else at exit.
struct Kept {
  DeviceApi* dev;
  void* buf;
  Event event;
  std::shared_ptr<transport::shm::SharedRegion> control;
  int n, rank;
};
std::mutex keptMu;
std::vector<Kept>& kept() {
  static auto* k = new std::vector<Kept>();  // process lifetime: freed at exit by the driver
  return *k;
}

void freeKept(const Kept& k) {
  try {
    if (k.event) k.dev->eventDestroy(k.event);
    if (k.buf) k.dev->deviceFree(k.buf);
  } catch (const std::exception& e) {
    BRAID_LOG(kWarn, "same-gpu", k.rank) << "freeing a kept same-GPU buffer: " << e.what();
  }
}

void sweepKept() {
  std::vector<Kept> done;
  {
    std::lock_guard<std::mutex> lock(keptMu);
    auto& all = kept();
    for (auto it = all.begin(); it != all.end();) {
      const Control& c = *static_cast<const Control*>(it->control->data());
      bool mapped = false;
      for (int q = 0; q < it->n && !mapped; ++q) mapped = q != it->rank && mapsPeers(c, q);
      if (mapped) {
        ++it;
      } else {
        done.push_back(*it);
        it = all.erase(it);
      }
    }
  }
  for (const Kept& k : done) freeKept(k);
}

}  // namespace

bool Comm::peerMaps(int q) const {
  return mapsPeers(*static_cast<const Control*>(control_->data()), q);
}

NcclResult Comm::poll() {
  if (aborted_.load()) return fail(kNcclRemoteError, "the same-GPU communicator was aborted");
  // Checked first, of every peer that has published (its settings are
  // written before its state), so that a peer that saw the mismatch first
  // and aborted is reported as the mismatch, not as an abort.
  // The buffer size chunks every op: ranks that disagree would run different
  // numbers of barriers (Note [Settings that shape an op]).
  for (int q = 0; q < n_ && !ready_; ++q) {
    if (slot(q).state.load(std::memory_order_acquire) == kEmpty) continue;
    if (slot(q).halfBytes != halfBytes_) {
      return fail(kNcclInvalidUsage,
                  strCat("the ranks must agree on BRAID_CUDA_SAME_GPU_BYTES: this rank (", rank_,
                         ") runs with ", 2 * halfBytes_, ", rank ", q, " with ",
                         2 * slot(q).halfBytes));
    }
    // The small-message threshold picks one barrier or two per op: ranks
    // that disagree would pair different barriers (a hang until the
    // timeout, or reads of a half a peer is still writing).
    if (slot(q).smallBytes != smallBytes_) {
      return fail(kNcclInvalidUsage,
                  strCat("the ranks must agree on BRAID_CUDA_SAME_GPU_SMALL_BYTES: this rank (",
                         rank_, ") runs with ", smallBytes_, ", rank ", q, " with ",
                         slot(q).smallBytes));
    }
  }
  std::string why;
  // A peer that destroyed its communicator after its last op is no error
  // here (its buffer stays until this rank closes, see close()); one that
  // aborted or exited is.
  for (int q = 0; q < n_; ++q) {
    if (q != rank_ && slot(q).state.load(std::memory_order_acquire) != kEmpty &&
        peerGone(q, &why, /*closedIsGone=*/false)) {
      return fail(kNcclRemoteError, why);
    }
  }
  if (ready_) return kNcclSuccess;
  for (int q = 0; q < n_; ++q) {
    if (slot(q).state.load(std::memory_order_acquire) != kPublished) return kNcclInProgress;
  }
  try {
    for (int q = 0; q < n_; ++q) {
      if (q == rank_) continue;
      Slot& s = slot(q);
      bufs_[q] = dev_.ipcOpenMem(std::string(s.mem, kIpcHandleBytes));
      events_[q] = dev_.ipcOpenEvent(std::string(s.event, kIpcHandleBytes));
    }
  } catch (const std::exception& e) {
    return fail(kNcclSystemError, strCat("opening a peer's IPC handles: ", e.what()));
  }
  ready_ = true;
  return kNcclSuccess;
}

NcclResult Comm::barrier(Stream s) {
  const uint64_t k = ++barriers_;
  stream_ = s;
  try {
    dev_.eventRecord(event_, s);
  } catch (const std::exception& e) {
    return fail(kNcclUnhandledCudaError, e.what());
  }
  slot(rank_).barrier.store(k, std::memory_order_release);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int q = 0; q < n_; ++q) {
    if (q == rank_) continue;
    std::string why;
    for (int spins = 0; slot(q).barrier.load(std::memory_order_acquire) < k; ++spins) {
      if (spins < 256) {
        std::this_thread::yield();
        continue;
      }
      if (aborted_.load()) return fail(kNcclRemoteError, "the communicator was aborted");
      if (peerGone(q, &why, /*closedIsGone=*/true)) return fail(kNcclRemoteError, why);
      if (std::chrono::steady_clock::now() > deadline) {
        return fail(kNcclSystemError,
                    strCat("timed out after ", timeout_.count(), " ms waiting for rank ", q,
                           " to reach same-GPU barrier ", k, " (it is at ",
                           slot(q).barrier.load(), "): a rank that skipped or reordered a "
                           "collective"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 4096 ? 2 : 50));
    }
    // Note [A stream never waits on a dead peer]: the peer's record for
    // barrier k must have run before this stream may wait on its event.
    try {
      for (int spins = 0; !dev_.eventQuery(events_[q]); ++spins) {
        if (spins < 256) {
          std::this_thread::yield();
          continue;
        }
        if (aborted_.load()) return fail(kNcclRemoteError, "the communicator was aborted");
        if (peerGone(q, &why, /*closedIsGone=*/true)) return fail(kNcclRemoteError, why);
        if (std::chrono::steady_clock::now() > deadline) {
          return fail(kNcclSystemError,
                      strCat("timed out after ", timeout_.count(), " ms waiting for rank ", q,
                             "'s stream to reach same-GPU barrier ", k,
                             " (its host did): a peer whose GPU work is stuck or that died "
                             "with it pending"));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 4096 ? 2 : 50));
      }
      dev_.streamWaitEvent(s, events_[q]);
    } catch (const std::exception& e) {
      return fail(kNcclUnhandledCudaError, e.what());
    }
  }
  return kNcclSuccess;
}

void Comm::abort() {
  if (aborted_.exchange(true)) return;
  slot(rank_).aborted.store(1, std::memory_order_release);
  // Nothing to release on the device: no stream here waits on a peer's
  // event that has not run (Note [A stream never waits on a dead peer]),
  // and destroying an opened event would not end such a wait on CUDA.
}

void Comm::close() {
  // Kernels already enqueued may still read the peers' buffers and write
  // this one (an abort ends the waits on the peers' events, not the copies
  // and reductions after them): the stream drains before anything is
  // unmapped or freed. Bounded: past it, the memory stays mapped (a leak,
  // logged) rather than pulled from under a kernel.
  RelaxedCaptureMode relaxed(dev_);  // Note [Graph capture] in cuda/device_api.h
  if (stream_) {
    const auto drain = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool idle = false;
    try {
      while (!(idle = dev_.streamQuery(stream_)) && std::chrono::steady_clock::now() < drain) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    } catch (const std::exception&) {
      // A sticky error (an abort ended a wait on a peer's event): the stream
      // skips everything after it, so nothing more touches the buffers.
      idle = true;
    }
    if (!idle) {
      // The slot stays kPublished: the peers' buffers are still mapped here,
      // so their exporters must keep them (Note [Exported buffers outlive
      // their mappings]).
      BRAID_LOG(kError, "same-gpu", rank_)
          << "the communicator's stream is still busy after 10 s: its buffers stay mapped";
      return;
    }
  }
  for (int q = 0; q < n_; ++q) {
    if (q == rank_) continue;
    try {
      if (events_[q]) dev_.eventDestroy(events_[q]);
      if (bufs_[q]) dev_.ipcCloseMem(bufs_[q]);
    } catch (const std::exception& e) {
      BRAID_LOG(kWarn, "same-gpu", rank_) << "closing rank " << q << "'s handles: " << e.what();
    }
    events_[q] = nullptr;
    bufs_[q] = nullptr;
  }
  slot(rank_).state.store(kClosed, std::memory_order_release);
  // Note [Exported buffers outlive their mappings]: freed only once no peer
  // maps it; else kept until this process exits.
  const auto until = std::chrono::steady_clock::now() +
                     (aborted_.load() ? std::chrono::milliseconds(500) : std::chrono::seconds(2));
  int mapping = -1;  // a peer that may still map this rank's buffer
  for (int q = 0; q < n_; ++q) {
    while (q != rank_ && peerMaps(q)) {
      if (std::chrono::steady_clock::now() >= until) {
        mapping = q;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (mapping >= 0) break;
  }
  if (mapping >= 0) {
    BRAID_LOG(kWarn, "same-gpu", rank_)
        << "rank " << mapping << " may still map this rank's same-GPU buffer ("
        << 2 * halfBytes_ << " bytes): kept until it closes (seen by a later close in this "
        << "process) or this process exits";
    std::lock_guard<std::mutex> lock(keptMu);
    kept().push_back({&dev_, buf_, event_, control_, n_, rank_});
  } else {
    freeKept({&dev_, buf_, event_, control_, n_, rank_});
  }
  event_ = nullptr;
  buf_ = nullptr;
  sweepKept();
}

}  // namespace samegpu
}  // namespace cuda
}  // namespace braid
