// Test-only: ATen operators on simulated CUDA tensors.
//
// Note [ATen on the simulated device]
// A CPU-only torch registers no kernel for DispatchKey::CUDA, so without
// help a simulated CUDA tensor (Note [Simulated CUDA in tests]) supports
// metadata only, and nothing that trains a model (DDP, the comm hooks, an
// optimizer) can run on it. The simulated device's memory is host memory, so
// every CPU kernel can serve it: one boxed fallback for the CUDA key
// re-describes each CUDA argument as a CPU tensor over the same bytes, runs
// the op's CPU kernel, and re-describes the results as CUDA tensors: a
// result over an argument's bytes (an in-place op, an out= op, a view)
// becomes a view of that argument's own storage, so aliasing, version
// counters and `is_alias_of` behave as on a GPU; a fresh result keeps its CPU
// allocation, now labelled with the device. Device arguments of factory ops
// (`empty(..., device="cuda:1")`) become the CPU, and their results get the
// device back.
//
// Ordering: a GPU kernel runs on the caller's current stream, after what is
// queued there. The fallback runs on the calling thread, so it first waits
// for the current simulated stream of the op's device to drain: an op after
// `Work.wait()` (a stream wait on braid's end event) sees the collective's
// results, and one before a collective is complete when braid's comm stream
// waits on the caller's stream. Ordering is therefore as strict as a GPU's,
// never looser.
//
// A CPU kernel that resizes an alias (an out= op, resize_) resizes only the
// alias: the fallback then gives the caller's CUDA tensor the alias's shape
// and, where it grew, its bytes. Ops without a CPU kernel fail with the
// op's name, as they would on a torch without the device.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/library.h>
#include <torch/version.h>

#include <cstring>
#include <memory>
#include <vector>

#include "sim/torch/sim_cuda.h"
#include "common/error.h"

namespace braid {
namespace sim {
namespace {

void* rawData(const c10::Storage& st) { return st.unsafeGetStorageImpl()->data_ptr().get(); }

// Host memory labelled as a simulated device's: what a resizable CUDA tensor
// grows into.
class DeviceAllocator final : public c10::Allocator {
 public:
  explicit DeviceAllocator(c10::DeviceIndex device) : device_(device) {}
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    auto* host = new c10::DataPtr(c10::GetCPUAllocator()->allocate(n));
    return c10::DataPtr(
        host->get(), host, [](void* h) { delete static_cast<c10::DataPtr*>(h); },
        c10::Device(c10::DeviceType::CUDA, device_));
  }
  // torch 2.x's Allocator asks for it; 1.13's has none.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

 private:
  const c10::DeviceIndex device_;
};

c10::Allocator* allocatorFor(c10::Device device) {
  if (device.is_cpu()) return c10::GetCPUAllocator();
  static std::vector<DeviceAllocator>* all = [] {
    auto* v = new std::vector<DeviceAllocator>();
    for (c10::DeviceIndex d = 0; d < 16; ++d) v->emplace_back(d);
    return v;
  }();
  return &(*all)[static_cast<size_t>(device.index()) % all->size()];
}

// A storage over st's bytes, labelled with `device`, that keeps st alive; as
// resizable as st (a resize of the new one never reaches st: the fallback
// carries it back, Call::carryBack).
c10::DataPtr relabeledPtr(const c10::Storage& st, c10::Device device) {
  auto* keep = new c10::Storage(st);
  return c10::DataPtr(
      rawData(st), keep, [](void* k) { delete static_cast<c10::Storage*>(k); }, device);
}

c10::Storage relabel(const c10::Storage& st, c10::Device device) {
  const bool resizable = st.resizable();
  return c10::Storage(c10::Storage::use_byte_size_t(), st.nbytes(), relabeledPtr(st, device),
                      resizable ? allocatorFor(device) : nullptr, resizable);
}

// A tensor with t's shape, strides and offset over `storage`, on `key`'s backend.
at::Tensor describe(c10::Storage storage, c10::DispatchKey key, const at::Tensor& t) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides());
  impl->set_storage_offset(t.storage_offset());
  return at::Tensor(std::move(impl));
}

// v with `leaf` applied to each value in it that is not a list (lists, of
// tensors or of anything, are rebuilt with the same element type).
template <class F>
c10::IValue mapLeaves(const c10::IValue& v, const F& leaf) {
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(leaf(c10::IValue(t)).toTensor());
    return c10::IValue(std::move(out));
  }
  if (v.isList()) {
    c10::impl::GenericList in = v.toList();
    c10::impl::GenericList out(in.elementType());
    for (const c10::IValue& e : in) out.push_back(mapLeaves(e, leaf));
    return c10::IValue(std::move(out));
  }
  return leaf(v);
}

// One op's translation: the CUDA tensors it was given, with their CPU aliases.
class Call {
 public:
  explicit Call(const char* op) : op_(op) {}

  c10::IValue toCpu(const c10::IValue& v) {
    return mapLeaves(v, [this](const c10::IValue& x) -> c10::IValue {
      if (x.isTensor()) return toCpu(x.toTensor());
      if (x.isStorage()) return toCpu(x.toStorage());
      if (!x.isDevice() || !x.toDevice().is_cuda()) return x;
      noteDevice(x.toDevice());
      return c10::Device(c10::kCPU);
    });
  }

  c10::IValue toCuda(const c10::IValue& v) {
    return mapLeaves(v, [this](const c10::IValue& x) -> c10::IValue {
      return x.isTensor() ? c10::IValue(toCuda(x.toTensor())) : x;
    });
  }

  // An out= or resize_ op resized a CPU alias (its metadata, perhaps its
  // storage): the caller's CUDA tensor takes the same shape and bytes.
  // set_ gave an alias another storage: the caller's tensor takes the CUDA
  // storage that storage stands for.
  void carryBack() {
    for (const Pair& p : pairs_) {
      c10::TensorImpl* cuda = p.cuda.unsafeGetTensorImpl();
      const c10::TensorImpl* cpu = p.cpu.unsafeGetTensorImpl();
      c10::StorageImpl* cudaSt = p.cuda.storage().unsafeGetStorageImpl();
      const c10::Storage& cpuSt = p.cpu.storage();
      if (cpuSt.unsafeGetStorageImpl() != p.cpuStorage) {
        cuda->set_storage_keep_dtype(cudaStorageFor(cpuSt, p.cuda.device()));
      } else if (rawData(cpuSt) != cudaSt->data_ptr().get() || cpuSt.nbytes() != cudaSt->nbytes()) {
        cudaSt->set_data_ptr_noswap(relabeledPtr(cpuSt, p.cuda.device()));
        cudaSt->set_nbytes(cpuSt.nbytes());
      }
      if (cuda->sizes() != cpu->sizes() || cuda->strides() != cpu->strides() ||
          cuda->storage_offset() != cpu->storage_offset()) {
        cuda->set_sizes_and_strides(cpu->sizes(), cpu->strides());
        cuda->set_storage_offset(cpu->storage_offset());
      }
    }
  }

  // The device whose stream orders the op (the current device where no
  // argument names one).
  c10::Device device() const {
    if (device_.has_value()) return *device_;
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
  }

 private:
  void noteDevice(c10::Device d) {
    if (d.index() < 0) d = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
    if (!device_.has_value()) device_ = d;
  }

  at::Tensor toCpu(const at::Tensor& t) {
    if (!t.defined() || !t.is_cuda()) return t;
    noteDevice(t.device());
    at::Tensor cpu = describe(toCpu(t.storage()), c10::DispatchKey::CPU, t);
    pairs_.push_back({t, cpu, cpu.storage().unsafeGetStorageImpl()});
    return cpu;
  }

  c10::Storage toCpu(const c10::Storage& st) {
    if (!st.device().is_cuda()) return st;
    c10::Storage cpu = relabel(st, c10::Device(c10::kCPU));
    storages_.push_back({st, cpu});
    return cpu;
  }

  c10::Storage cudaStorageFor(const c10::Storage& cpu, c10::Device device) const {
    for (const auto& s : storages_)
      if (s.second.unsafeGetStorageImpl() == cpu.unsafeGetStorageImpl()) return s.first;
    return relabel(cpu, device);
  }

  at::Tensor toCuda(const at::Tensor& out) {
    if (!out.defined() || !out.device().is_cpu()) return out;
    for (const auto& p : pairs_) {
      if (!out.is_alias_of(p.cpu)) continue;
      // In-place and out= ops return their argument: give back the caller's.
      if (out.is_same(p.cpu)) return p.cuda;
      return describe(p.cuda.storage(), c10::DispatchKey::CUDA, out);
    }
    BRAID_ENFORCE(out.has_storage(), op_, -1, "simulated CUDA: a result without storage");
    return describe(cudaStorageFor(out.storage(), device()), c10::DispatchKey::CUDA, out);
  }

  struct Pair {
    at::Tensor cuda, cpu;
    const c10::StorageImpl* cpuStorage;  // the alias's storage before the op
  };
  const char* op_;
  std::vector<Pair> pairs_;
  std::vector<std::pair<c10::Storage, c10::Storage>> storages_;  // CUDA, its CPU alias
  c10::optional<c10::Device> device_;
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.schema().name();
  const size_t nargs = op.schema().arguments().size();
  if (name == "aten::record_stream") {  // the caching allocator's business: none here
    torch::jit::drop(*stack, nargs);
    return;
  }
  Call call(name.c_str());
  auto args = stack->end() - static_cast<std::ptrdiff_t>(nargs);
  for (auto it = args; it != stack->end(); ++it) *it = call.toCpu(*it);
  // Run in the order of the current stream (Note [ATen on the simulated device]).
  sim::device().streamSynchronize(currentStream(call.device().index()));
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  call.carryBack();
  const size_t nrets = op.schema().returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(nrets); it != stack->end(); ++it)
    *it = call.toCuda(*it);
}

// c10d's Reducer times each iteration with a Timer made for its parameters'
// device type; libtorch_cuda registers CUDA's (events on the device), and
// without one DDP's logger asserts. This one times on the host, as c10d's
// CpuTimer does: what the simulated device runs, it runs by then.
class HostTimer final : public c10d::Timer {
 public:
  explicit HostTimer(c10::Device) {}
  c10::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t a = getTimeRef(start), b = getTimeRef(end);
    if (a == c10d::kUnsetTime || b == c10d::kUnsetTime || b < a) return c10::nullopt;
    return b - a;
  }
};

}  // namespace

void installAtenFallback() {
  c10d::TimerRegistry()->Register(c10::DeviceType::CUDA, [](c10::Device d) {
    return std::unique_ptr<c10d::Timer>(new HostTimer(d));
  });
  // Lives as long as the process, as torch's own registrations do.
  static torch::Library* lib = [] {
    auto* l = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::CUDA, __FILE__,
                                 __LINE__);
    l->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
    return l;
  }();
  // Composite kernels that pick a device kernel by the tensors' device type
  // (copy_'s copy_stub) would look for a CUDA one: these take the fallback
  // as their CUDA kernel instead, which a composite kernel cannot override.
  static torch::Library* aten = [] {
    auto* l = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA, __FILE__,
                                 __LINE__);
    for (const char* op : {"copy_"})
      l->impl(op, torch::CppFunction::makeFromBoxedFunction<&fallback>());
    return l;
  }();
  (void)lib;
  (void)aten;
}

}  // namespace sim
}  // namespace braid
