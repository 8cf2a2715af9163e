// Note [Adopting a repeated buffer] in buffer_adoption.h.
#include "c10d/buffer_adoption.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/engine.h"
#include "common/settings.h"
#include "transport/shm/shared_region.h"

namespace braid {

BRAID_SETTING_BOOL(kAdoptBuffers, "BRAID_ADOPT_BUFFERS", false,
                   "1: move a CPU buffer that a single-host group allreduces again and again (a "
                   "DDP gradient bucket: allocator-owned, viewed by other tensors, reduced at "
                   "least twice before) into memory every rank maps, so that its allreduce works "
                   "in place (Note [Adopting a repeated buffer]). Off by default: a raw pointer "
                   "into the buffer taken before (numpy, DLPack) would then point at freed "
                   "memory, and the 2-core measurements show no gain beyond their noise. Ranks "
                   "that disagree move nothing.");
BRAID_SETTING_INT(kAdoptMinBytes, "BRAID_ADOPT_MIN_BYTES", int64_t{1} << 20,
                  "The smallest buffer BRAID_ADOPT_BUFFERS moves, in bytes (smaller ones gain "
                  "little: their allreduce is latency-bound).");

namespace {

constexpr int kTimesBefore = 2;      // allreduces of the same storage before it moves
constexpr size_t kMaxTracked = 256;  // storages remembered; more: start over

// What the registered memory's DataPtr owns: the region, and its registration,
// released when the storage lets go of it (any thread).
struct AdoptedMemory {
  std::shared_ptr<transport::shm::SharedRegion> region;
  std::shared_ptr<collectives::RegionTable> table;
  uint64_t id;
  ~AdoptedMemory() {
    if (table) table->release(id);
  }
};

void freeAdopted(void* ctx) { delete static_cast<AdoptedMemory*>(ctx); }

// Whether t's storage is one the Note allows to move, apart from its history.
bool movable(const at::Tensor& t, size_t minBytes) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || !t.is_contiguous() ||
      t.storage_offset() != 0 || !t.has_storage()) {
    return false;
  }
  const c10::Storage& st = t.storage();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (bytes == 0 || st.nbytes() != bytes || bytes < minBytes) {
    return false;
  }
  at::Allocator* cpu = c10::GetAllocator(c10::DeviceType::CPU);
  const c10::DataPtr& dp = st.data_ptr();
  return cpu && st.unsafeGetStorageImpl()->allocator() == cpu && cpu->raw_deleter() &&
         dp.get_deleter() == cpu->raw_deleter() && dp.get() == dp.get_context() &&
         st.use_count() >= 2;
}

}  // namespace

std::shared_ptr<BufferAdoption> BufferAdoption::makeIfEnabled() {
  return kAdoptBuffers.get() ? std::make_shared<BufferAdoption>() : nullptr;
}

BufferAdoption::BufferAdoption()
    : minBytes_(static_cast<size_t>(std::max<int64_t>(1, kAdoptMinBytes.get()))) {}

bool BufferAdoption::offer(const at::Tensor& t, ReduceOp redop) {
  if (redop == ReduceOp::kPremulSum || !movable(t, minBytes_)) return false;
  const void* key = t.storage().unsafeGetStorageImpl();
  const void* data = t.data_ptr();
  const size_t bytes = t.storage().nbytes();
  std::lock_guard<std::mutex> lock(mu_);
  if (seen_.size() >= kMaxTracked && !seen_.count(key)) seen_.clear();
  Seen& s = seen_[key];
  if (s.data != data || s.bytes != bytes) s = {data, bytes, 0};
  if (s.times < 0) return false;  // refused once
  return ++s.times > kTimesBefore;
}

void BufferAdoption::adopt(Engine* e, const collectives::OpDesc& d, const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  const size_t bytes = impl->nbytes();
  auto region = transport::shm::SharedRegion::create(bytes, "allreduce");
  collectives::OpDesc r = d;
  r.kind = collectives::OpKind::kRegister;
  r.dtype = DataType::kUInt8;
  r.redop = ReduceOp::kSum;
  r.count = bytes;  // the same on every rank: the allreduce's sizes agreed
  r.shape = {};
  r.shape.ndim = 1;
  r.shape.dims[0] = static_cast<int64_t>(bytes);
  r.offersBuffer = false;
  r.inAddr = r.outAddr = 0;
  r.peerAddrs.clear();
  const uint64_t id = e->group().registerBuffer(r, region);
  if (id == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = seen_.find(impl);
    if (it != seen_.end()) it->second.times = -1;
    return;
  }
  std::memcpy(region->data(), impl->data_ptr().get(), bytes);
  auto* owner = new AdoptedMemory{region, e->regionTable(), id};
  c10::DataPtr fresh(region->data(), owner, &freeAdopted, c10::Device(c10::DeviceType::CPU));
  c10::DataPtr old = impl->set_data_ptr(std::move(fresh));
  (void)old;  // freed here, by the allocator that made it
  moved_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  seen_.erase(impl);
}

}  // namespace braid
