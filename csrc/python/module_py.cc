// torch_braid._C: the backend class for c10d's plugin registry, build and
// settings information, and every other layer's bindings (python_parts.h).
#include <torch/csrc/Dtype.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "engine/engine.h"
#include "c10d/cuda/cuda_context.h"
#include "c10d/process_group.h"
#include "cuda/cuda_kernels.h"
#include "cuda/kernel_images.h"
#include "cuda/nccl/nccl_executor.h"
#include "common/exit_guard.h"
#include "python/python_parts.h"
#include "common/settings.h"
#include "math/reduce.h"

namespace py = pybind11;

namespace braid {
namespace python {

// Note [Releasing the GIL on destruction]
// destroy_process_group() drops the last Python reference while holding the
// GIL. Our destructor joins the worker thread, which may at that moment be
// dropping the last reference to a finished Work's tensors, and freeing a
// tensor that has a Python object needs the GIL: a deadlock. This holder
// releases the GIL around the destruction, as torch's own holder for its
// ProcessGroup does.
template <typename T>
class NoGilHolder {
 public:
  NoGilHolder() = default;
  NoGilHolder(c10::intrusive_ptr<T> p) : impl_(std::move(p)) {}  // NOLINT: implicit by design
  explicit NoGilHolder(T* p) : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(p)) {}
  ~NoGilHolder() {
    if (impl_ && PyGILState_Check()) {
      py::gil_scoped_release release;
      impl_.reset();
    }
  }
  T& operator*() const { return *impl_; }
  T* operator->() const { return impl_.get(); }
  T* get() const { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};

}  // namespace python
}  // namespace braid

PYBIND11_DECLARE_HOLDER_TYPE(T, braid::python::NoGilHolder<T>, true);

namespace {

py::dict buildInfo() {
  py::dict d;
  d["version"] = BRAID_VERSION;
  d["torch_version"] = TORCH_VERSION;
  d["torch_api"] = braid::compat::kTorch2 ? "c10d::Backend (torch 2.x)"
                                          : "c10d::ProcessGroup (torch 1.x)";
  d["simd"] = braid::reduce::simdLevel();
  // The CUDA path is always built (Note [The device seam]); the GPU kernels
  // only where nvcc was found.
  d["cuda"] = true;
  d["cuda_kernels"] = braid::cuda::haveKernels();
  // Which GPUs they run on (Note [Kernel images] in cuda/kernel_images.h).
  d["cuda_kernel_images"] = braid::cuda::builtKernelImages().str();
  // Within a host and between hosts (Note [Choosing a group's transport]).
  d["transports"] = std::vector<std::string>{"shm", "tcp"};
  // Note [One pybind11 per process] (CMakeLists.txt): the headers used.
  d["pybind11"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                  std::to_string(PYBIND11_VERSION_MINOR) + "." + PYBIND11_TOSTRING(PYBIND11_VERSION_PATCH);
#ifdef BRAID_PYBIND11_INCLUDE_DIR
  d["pybind11_include"] = BRAID_PYBIND11_INCLUDE_DIR;
#endif
#if defined(__clang__)
  d["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
  d["compiler"] = "gcc " __VERSION__;
#endif
  return d;
}

py::list settings() {
  py::list out;
  for (const auto& s : braid::allSettings()) {
    py::dict d;
    d["name"] = s.name;
    d["type"] = s.type;
    d["default"] = s.defaultValue;
    d["value"] = s.currentValue();
    d["doc"] = s.doc;
    out.append(d);
  }
  return out;
}

}  // namespace

namespace {
// Joins the worker without holding the GIL (torch 2.x destroys the backend
// from its own ProcessGroup, outside our holder).
void releaseGilAround(const std::function<void()>& f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release release;
    f();
  } else {
    f();
  }
}
}  // namespace

namespace {
// Note [One pybind11 per process] (CMakeLists.txt): a module built with other
// pybind11 headers than torch's keeps its own type registry, in which torch's
// c10d classes do not exist; objects then cross between the two registries
// and crash far from here. Refuse to import instead.
void requireTorchsPybind11() {
  py::module::import("torch._C._distributed_c10d");  // registers torch's c10d types
  if (py::detail::get_type_info(typeid(braid::compat::BackendBase))) return;
  throw py::import_error(
      std::string("torch_braid._C was built with pybind11 ") + std::to_string(PYBIND11_VERSION_MAJOR) +
      "." + std::to_string(PYBIND11_VERSION_MINOR) + " headers whose type registry does not hold "
      "torch's c10d::" + braid::compat::pythonBaseClassName() +
      ": it must be built with the pybind11 that torch " TORCH_VERSION " was built with. "
      "Rebuild braid (setup.py picks torch's own headers).");
}
}  // namespace

namespace {
// errored() as torchft expects it: an exception object or None. The type is
// the one braid's failed ops raise (compat::asTorchError): DistBackendError
// where torch has it, else RuntimeError.
py::object erroredAsException(const braid::ProcessGroupBraid& pg) {
  std::string why = pg.errored();
  if (why.empty()) return py::none();
  py::object dist = py::module::import("torch.distributed");
  py::object type = py::hasattr(dist, "DistBackendError")
                        ? dist.attr("DistBackendError")
                        : py::module::import("builtins").attr("RuntimeError");
  return type(why);
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  requireTorchsPybind11();
  braid::setBlockingCallWrapper(&releaseGilAround);
  m.doc() = "braid: a shared-memory c10d backend for PyTorch";
  m.attr("__version__") = BRAID_VERSION;
  // Note [Dropping Python objects at exit]: torch_braid registers it with atexit.
  m.def("_begin_exit", [] { braid::beginExit(); }, py::call_guard<py::gil_scoped_release>());
  py::object base = py::module::import("torch._C._distributed_c10d")
                        .attr(braid::compat::pythonBaseClassName());
  using Holder = braid::python::NoGilHolder<braid::ProcessGroupBraid>;
  py::class_<braid::ProcessGroupBraid, Holder>(m, "ProcessGroupBraid", base)
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return Holder(
                 c10::make_intrusive<braid::ProcessGroupBraid>(store, rank, size, timeout));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("_shutdown", &braid::ProcessGroupBraid::abort,
           py::call_guard<py::gil_scoped_release>())
      // torch 2.8+ binds these on Backend already; older torch gets them here.
      .def("shutdown", &braid::ProcessGroupBraid::shutdown,
           py::call_guard<py::gil_scoped_release>(),
           "Lets issued ops finish, then stops the group's threads and frees its memory.")
      .def("abort", &braid::ProcessGroupBraid::abort, py::call_guard<py::gil_scoped_release>(),
           "Fails every pending and queued op now; ranks blocked in an op return at once.")
      .def("set_timeout", &braid::ProcessGroupBraid::setTimeout, py::arg("timeout"),
           "The timeout of ops issued from now on (ops already issued keep theirs).")
      .def("errored", &erroredAsException,
           "torchft's errored(): the error that made the group unusable (a timeout, a lost "
           "peer, abort()), as an exception object, or None while the group is usable.")
      .def(
          "_cuda_executor",
          [](const braid::ProcessGroupBraid& pg) {
            auto ctx = pg.cudaContext();
            return ctx ? ctx->executorDescription() : std::string();
          },
          "Which executor runs this group's CUDA collectives and why (Note [Choosing a CUDA "
          "executor]); empty before its first CUDA collective.")
      .def(
          "_cuda_executor_stats",
          [](const braid::ProcessGroupBraid& pg) {
            auto ctx = pg.cudaContext();
            braid::CudaExecutorStats s = ctx ? ctx->stats() : braid::CudaExecutorStats();
            py::dict d;
            d["executor"] = s.executor;
            d["staged_ops"] = s.staged.ops;
            d["staged_d2h_bytes"] = s.staged.d2hBytes;
            d["staged_h2d_bytes"] = s.staged.h2dBytes;
            d["nccl_ops"] = s.ncclOps;
            d["nccl_bytes"] = s.ncclBytes;
            return d;
          },
          "What the group's CUDA executors ran so far (Note [Counting what an executor "
          "moved]): executor ('nccl', 'same-gpu', 'hier', 'staged'; '' before the first CUDA "
          "collective), the staged executor's ops and the bytes it copied device-to-host and "
          "host-to-device, and the NCCL executor's ops and the bytes of their buffers. Tests "
          "see which path an op took.")
      .def(
          "_registered_empty",
          [](braid::ProcessGroupBraid& pg, int64_t numel, const py::object& dtype) {
            if (!THPDtype_Check(dtype.ptr())) throw py::type_error("dtype must be a torch.dtype");
            const at::ScalarType st = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
            py::gil_scoped_release nogil;
            return pg.registeredEmpty(numel, st);
          },
          py::arg("numel"), py::arg("dtype"),
           "Collective: a zeroed CPU tensor in memory every rank maps (Note [Registered "
           "buffers]); ordinary memory where the group cannot register it.")
      .def("_is_registered", &braid::ProcessGroupBraid::isRegistered, py::arg("tensor"),
           "Whether the tensor's memory is registered with this group.")
      .def("_adopted_buffers", &braid::ProcessGroupBraid::adoptedBuffers,
           "How many buffers this rank moved into registered memory (Note [Adopting a "
           "repeated buffer]).")
      .def("_fr_describe", &braid::ProcessGroupBraid::describeForRecorder, py::arg("name"),
           py::arg("global_ranks"),
           "The group's name and members' global ranks, for the flight recorder's dumps.");
  m.def("build_info", &buildInfo);
  m.def("settings", &settings);
  for (auto& part : braid::python::parts()) part.second(m);
}
