// Registered buffers from the backend (Note [Registered buffers] in
// collectives/shm/registered.h): the memory, its registration through the
// group, and a CPU tensor over it whose deleter releases it.
#include "c10d/process_group.h"

#include "c10d/buffer_adoption.h"
#include "engine/engine.h"
#include "common/error.h"
#include "transport/shm/shared_region.h"

namespace braid {

using collectives::OpDesc;
using collectives::OpKind;

at::Tensor ProcessGroupBraid::registeredEmpty(int64_t numel, at::ScalarType dtype) {
  std::shared_ptr<transport::shm::SharedRegion> region;
  auto id = std::make_shared<uint64_t>(0);
  auto work = guarded(OpKind::kRegister, [&] {
    const int rank = getRank();
    BRAID_ENFORCE(numel >= 0, "register_buffer", rank, "numel must be >= 0, got ", numel);
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    region = transport::shm::SharedRegion::create(bytes, "register_buffer");
    OpDesc d = desc(OpKind::kRegister, std::chrono::milliseconds(0));
    d.dtype = DataType::kUInt8;
    d.count = bytes;  // compared in the header: every rank brings the same size
    d.shape.ndim = 1;
    d.shape.dims[0] = static_cast<int64_t>(bytes);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::UNKNOWN, "braid:register_buffer", {},
                  [e, d, region, id] { *id = e->group().registerBuffer(d, region); });
  });
  work->wait();
  std::function<void(void*)> release = [region, t = engine_->regionTable(), rid = *id](void*) {
    if (t && rid) t->release(rid);  // region itself goes with this function
  };
  return at::from_blob(region->data(), {numel}, release, at::TensorOptions().dtype(dtype));
}

bool ProcessGroupBraid::isRegistered(const at::Tensor& t) const {
  const auto table = engine_->regionTable();
  collectives::RegionTable::Ref ref;
  return table && t.defined() && t.device().is_cpu() && t.is_contiguous() &&
         table->find(t.data_ptr(), t.numel() * t.element_size(), &ref);
}

uint64_t ProcessGroupBraid::adoptedBuffers() const {
  return adoption_ ? adoption_->moved() : 0;
}

}  // namespace braid
