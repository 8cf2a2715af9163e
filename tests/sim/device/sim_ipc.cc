// Note [Simulated IPC] in sim_ipc.h.
#include "sim/device/sim_ipc.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "common/error.h"
#include "cuda/device_api.h"

namespace braid {
namespace cuda {
namespace sim {
// ---- events -----------------------------------------------------------------

std::atomic<uint64_t>* SharedEvent::latestOf(const SharedRegion& r) {
  return static_cast<std::atomic<uint64_t>*>(r.data());
}
std::atomic<uint64_t>* SharedEvent::doneOf(const SharedRegion& r) {
  return static_cast<std::atomic<uint64_t>*>(r.data()) + 1;
}

SharedEvent::SharedEvent(int device)
    : device_(device), owner_(true), region_(SharedRegion::create(64, "eventCreateShareable")) {
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters shared between processes");
  new (latestOf(*region_)) std::atomic<uint64_t>(0);
  new (doneOf(*region_)) std::atomic<uint64_t>(0);
}

SharedEvent::SharedEvent(int device, const std::string& handle)
    : device_(device), owner_(false), region_(SharedRegion::open(handle, "ipcOpenEvent")) {}

void SharedEvent::record(const std::shared_ptr<SimStream>& s) {
  if (!owner_) {
    throw Error("braid: eventRecord: an event opened with ipcOpenEvent is recorded by its "
                "creator only (braid's simulated device)");
  }
  const uint64_t g = latestOf(*region_)->fetch_add(1) + 1;
  auto region = region_;
  s->enqueue("eventRecord (shareable)",
             [region, g] { doneOf(*region)->store(g, std::memory_order_release); },
             /*work=*/false);
}

void SharedEvent::waitFor(const std::shared_ptr<SharedRegion>& region, uint64_t g) {
  // Note [Simulated IPC]: no way out but the record, as on a GPU.
  auto* done = doneOf(*region);
  for (int spins = 0; done->load(std::memory_order_acquire) < g; ++spins) {
    if (spins < 200) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void SharedEvent::waitOn(const std::shared_ptr<SimStream>& s) {
  const uint64_t g = latestOf(*region_)->load(std::memory_order_acquire);
  if (doneOf(*region_)->load(std::memory_order_acquire) >= g) return;
  auto region = region_;
  s->enqueue("streamWaitEvent (shareable)", [region, g] { waitFor(region, g); },
             /*work=*/false);
}

bool SharedEvent::query() {
  return doneOf(*region_)->load(std::memory_order_acquire) >=
         latestOf(*region_)->load(std::memory_order_acquire);
}

void SharedEvent::synchronize() {
  waitFor(region_, latestOf(*region_)->load(std::memory_order_acquire));
}

}  // namespace sim
}  // namespace cuda
}  // namespace braid
