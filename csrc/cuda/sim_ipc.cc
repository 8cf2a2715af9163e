// Note [Simulated IPC] in sim_ipc.h.
#include "cuda/sim_ipc.h"

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
namespace {

constexpr size_t kHeader = 64;  // the nonce, then padding: data stays 64-byte aligned
constexpr uint32_t kMagic = 0x6d697362;  // "bsim"

struct Handle {  // kIpcHandleBytes at most
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t pad;
  uint64_t bytes;
  uint64_t nonce;
};
static_assert(sizeof(Handle) <= kIpcHandleBytes, "a simulated IPC handle fits CUDA's");

uint64_t randomNonce() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(getpid()) << 32));
  uint64_t n = 0;
  while (n == 0) n = gen();
  return n;
}

bool alive(pid_t pid) { return pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace

std::shared_ptr<SharedRegion> SharedRegion::create(size_t bytes, const char* call) {
  std::shared_ptr<SharedRegion> r(new SharedRegion());
  r->bytes_ = bytes;
  r->mapped_ = kHeader + (bytes > 0 ? bytes : 1);
  r->fd_ = memfd_create("braid-sim-ipc", MFD_CLOEXEC);
  if (r->fd_ < 0) throw Error(strCat("braid: ", call, ": memfd_create: ", std::strerror(errno)));
  if (ftruncate(r->fd_, static_cast<off_t>(r->mapped_)) != 0) {
    throw Error(strCat("braid: ", call, "(", bytes, " bytes): ftruncate: ", std::strerror(errno)));
  }
  r->base_ = mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (r->base_ == MAP_FAILED) {
    r->base_ = nullptr;
    throw Error(strCat("braid: ", call, "(", bytes, " bytes): mmap: ", std::strerror(errno)));
  }
  r->data_ = static_cast<char*>(r->base_) + kHeader;
  r->pid_ = getpid();
  r->exportFd_ = r->fd_;
  r->nonce_ = randomNonce();
  std::memcpy(r->base_, &r->nonce_, sizeof(r->nonce_));
  return r;
}

std::shared_ptr<SharedRegion> SharedRegion::open(const std::string& handle, const char* call) {
  Handle h{};
  if (handle.size() != kIpcHandleBytes) {
    throw Error(strCat("braid: ", call, ": a handle of ", handle.size(), " bytes, expected ",
                       kIpcHandleBytes));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  if (h.magic != kMagic) throw Error(strCat("braid: ", call, ": not a simulated IPC handle"));
  const std::string path = strCat("/proc/", h.pid, "/fd/", h.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw Error(strCat("braid: ", call, ": cannot open ", path, " (", std::strerror(errno),
                       "): the exporting process (pid ", h.pid, ") has exited or freed it"));
  }
  std::shared_ptr<SharedRegion> r(new SharedRegion());
  r->bytes_ = h.bytes;
  r->mapped_ = kHeader + (h.bytes > 0 ? h.bytes : 1);
  r->base_ = mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the pages
  if (r->base_ == MAP_FAILED) {
    r->base_ = nullptr;
    throw Error(strCat("braid: ", call, ": mmap of ", path, ": ", std::strerror(err)));
  }
  uint64_t nonce = 0;
  std::memcpy(&nonce, r->base_, sizeof(nonce));
  if (nonce != h.nonce) {
    throw Error(strCat("braid: ", call, ": ", path, " is not the memory this handle named (pid ",
                       h.pid, " freed it and reused the descriptor)"));
  }
  r->data_ = static_cast<char*>(r->base_) + kHeader;
  r->pid_ = h.pid;
  r->exportFd_ = h.fd;
  r->nonce_ = h.nonce;
  return r;
}

SharedRegion::~SharedRegion() {
  if (base_ != nullptr) munmap(base_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

std::string SharedRegion::handle() const {
  Handle h{kMagic, static_cast<int32_t>(pid_), exportFd_, 0, bytes_, nonce_};
  std::string out(kIpcHandleBytes, '\0');
  std::memcpy(&out[0], &h, sizeof(h));
  return out;
}

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

void SharedEvent::waitFor(const std::shared_ptr<SharedRegion>& region,
                          const std::shared_ptr<std::atomic<bool>>& closed, uint64_t g) {
  auto* done = doneOf(*region);
  for (int spins = 0; done->load(std::memory_order_acquire) < g; ++spins) {
    if (spins < 200) {
      std::this_thread::yield();
      continue;
    }
    if (closed->load()) {
      throw Error(strCat("braid: streamWaitEvent: the event exported by pid ", region->exporter(),
                         " was closed while a stream waited on it (an abort)"));
    }
    if (!alive(region->exporter())) {
      throw Error(strCat("braid: streamWaitEvent: the process that exports this event (pid ",
                         region->exporter(), ") has exited before recording it"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void SharedEvent::waitOn(const std::shared_ptr<SimStream>& s) {
  const uint64_t g = latestOf(*region_)->load(std::memory_order_acquire);
  if (doneOf(*region_)->load(std::memory_order_acquire) >= g) return;
  auto region = region_;
  auto closed = closed_;
  s->enqueue("streamWaitEvent (shareable)", [region, closed, g] { waitFor(region, closed, g); },
             /*work=*/false);
}

bool SharedEvent::query() {
  return doneOf(*region_)->load(std::memory_order_acquire) >=
         latestOf(*region_)->load(std::memory_order_acquire);
}

void SharedEvent::synchronize() {
  waitFor(region_, closed_, latestOf(*region_)->load(std::memory_order_acquire));
}

}  // namespace sim
}  // namespace cuda
}  // namespace braid
