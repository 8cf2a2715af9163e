#include "c10d/compat.h"

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace braid {
namespace compat {

const char* pythonBaseClassName() { return BRAID_TORCH2 ? "Backend" : "ProcessGroup"; }

bool premulSumFactor(const c10d::ReduceOp& op, double* factor) {
  auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (!sup) return false;
#if BRAID_TORCH2
  const bool hasTensor = sup->tensor_factor.defined();
  *factor = hasTensor ? sup->tensor_factor.item<double>() : sup->double_factor;
#else
  const bool hasTensor = !sup->tensor_factors.empty();
  *factor = hasTensor ? sup->tensor_factors[0].item<double>() : sup->double_factor;
#endif
  return true;
}

BackendBase* backendFor(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, c10::DeviceType device) {
  if (!pg) return nullptr;
#if BRAID_TORCH2
  try {
    return pg->getBackend(device).get();
  } catch (const std::exception&) {
    return nullptr;  // no backend registered for that device type
  }
#else
  (void)device;
  return pg.get();
#endif
}

void applyLibuvSetting(c10d::TCPStoreOptions* opts) {
#if BRAID_TORCH2
  const char* v = std::getenv("USE_LIBUV");
  opts->useLibUV = !(v && std::string(v) == "0");
#else
  (void)opts;
#endif
}

c10d::GradBucket makeGradBucket(size_t index, size_t bucketCount, const at::Tensor& buffer,
                                const std::vector<size_t>& offsets,
                                const std::vector<size_t>& lengths,
                                const std::vector<c10::IntArrayRef>& sizes,
                                const std::vector<at::Tensor>& parameters) {
#if BRAID_TORCH2
  return c10d::GradBucket(index, bucketCount, buffer, offsets, lengths, sizes, parameters,
                          std::nullopt);
#else
  return c10d::GradBucket(index, bucketCount, buffer, offsets, lengths, sizes, parameters);
#endif
}

std::exception_ptr asTorchError(std::exception_ptr error) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (!error) return error;
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return std::make_exception_ptr(
        c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, __LINE__}, e.what()));
  } catch (const PeerLostError& e) {
    return std::make_exception_ptr(
        c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, __LINE__}, e.what()));
  } catch (...) {
  }
#endif
  return error;
}

c10::intrusive_ptr<c10d::ProcessGroup> wrapAsProcessGroup(
    const c10::intrusive_ptr<BackendBase>& backend, const c10::intrusive_ptr<c10d::Store>& store) {
#if BRAID_TORCH2
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  // One backend serves both devices (Note [The staged CUDA executor]), as
  // the Python registration's ["cpu", "cuda"] does.
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return pg;
#else
  (void)store;
  return backend;
#endif
}

std::pair<std::string, std::string> groupNameAndDesc(const BackendBase& backend) {
#if BRAID_TORCH2
  return {backend.getGroupUid(), backend.getGroupDesc()};
#else
  (void)backend;
  return {"", ""};
#endif
}

std::string storeHost(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> s = store;
  for (int depth = 0; s && depth < 16; ++depth) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) return tcp->getHost();
    auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s.get());
    if (!prefixed) break;
    s = prefixed->getUnderlyingStore();
  }
  const char* addr = std::getenv("MASTER_ADDR");
  return addr ? addr : "";
}

}  // namespace compat
}  // namespace braid
