#include "backend/compat.h"

namespace braid {
namespace compat {

const char* pythonBaseClassName() { return BRAID_TORCH2 ? "Backend" : "ProcessGroup"; }

c10::intrusive_ptr<c10d::ProcessGroup> wrapAsProcessGroup(
    const c10::intrusive_ptr<BackendBase>& backend, const c10::intrusive_ptr<c10d::Store>& store) {
#if BRAID_TORCH2
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return pg;
#else
  (void)store;
  return backend;
#endif
}

}  // namespace compat
}  // namespace braid
