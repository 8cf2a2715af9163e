// Python side of the hooks: torch_braid._C._CommHook (a shared C++ hook) and
// its factories. python/torch_braid/hooks.py wraps them into DDP hook
// functions and states; see the contract at the top of hooks/comm_hook.h.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "c10d/compat_reducer.h"
#include "python/python_parts.h"
#include "common/error.h"
#include "hooks/comm_hook.h"
#include "reducer/comm_hook_py.h"

namespace py = pybind11;

namespace braid {
namespace hooks {
namespace {

using PG = c10::intrusive_ptr<c10d::ProcessGroup>;

// Runs a hook on Python's view of a bucket and returns a torch.futures.Future
// whose value is [averaged buffer].
py::object runFromPython(CommHook& hook, const at::Tensor& buffer, int64_t index, bool isLast,
                         const std::vector<at::Tensor>& gradients) {
  BRAID_ENFORCE(index >= 0, hook.name(), hook.rank(), "bucket index must be >= 0, got ", index);
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    // PowerSGD waits for a collective inside run(); a backend may need the
    // GIL to make progress (a Python store, a Python backend).
    py::gil_scoped_release noGil;
    BucketView view;
    view.index = static_cast<size_t>(index);
    view.isLast = isLast;
    view.buffer = buffer;
    if (hook.needsLayout() && !gradients.empty())
      view.setLayout(gradients, hook.name(), hook.rank());
    fut = hook.run(view);
  }
  return torch::jit::toPyObject(c10::IValue(fut));
}

}  // namespace
}  // namespace hooks
}  // namespace braid

BRAID_PY_PART(hooks, m) {
  using namespace braid::hooks;
  // A subclass of torch_braid._C.CommHook (c10d::CommHookInterface), so the
  // reducer's register_comm_hook takes it as is.
  braid::python::bindCommHookBase(m);
  py::class_<CommHook, c10d::CommHookInterface, std::shared_ptr<CommHook>>(
      m, "_CommHook",
      "A C++ DDP communication hook (braid::hooks::CommHook). Create it through "
      "torch_braid.hooks.*_state(); state._cpp_hook() returns it.")
      .def_property_readonly("name", [](const CommHook& h) { return std::string(h.name()); })
      .def_property_readonly("needs_layout", &CommHook::needsLayout)
      .def_property_readonly("rank", &CommHook::rank)
      .def_property_readonly("world_size", &CommHook::worldSize)
      .def_property_readonly("process_group", &CommHook::processGroup)
      .def("run", &runFromPython, py::arg("buffer"), py::arg("index"), py::arg("is_last"),
           py::arg("gradients") = std::vector<at::Tensor>(),
           "Runs the hook on a flat bucket buffer; gradients are the per-parameter views of "
           "the buffer (PowerSGD needs them). Returns a torch.futures.Future of [buffer].")
      .def_property_readonly("payload_bytes", &CommHook::payloadBytes,
                             "Bytes this rank handed to collectives so far.")
      .def_property_readonly("wire_bytes", &CommHook::wireBytes,
                             "Bytes each rank moved on the wire so far (allreduce S*2(n-1)/n, "
                             "allgather S*(n-1)).")
      .def_property_readonly("device_steps", &CommHook::deviceSteps,
                             "Arithmetic steps run as ATen ops on a device bucket so far "
                             "(Note [Which branch a hook ran]).")
      .def_property_readonly("host_steps", &CommHook::hostSteps,
                             "Arithmetic steps run on host memory (the CPU loops) so far.")
      .def("reset_counters", &CommHook::resetCounters)
      .def_property_readonly("iteration", &CommHook::iteration)
      .def(
          "residual",
          [](const CommHook& h, int64_t index) -> py::object {
            if (index < 0) return py::none();
            at::Tensor r = h.residual(static_cast<size_t>(index));
            if (!r.defined()) return py::none();
            return py::cast(r);
          },
          py::arg("bucket_index"),
          "The error-feedback residual kept for a bucket (a copy), or None. Call between "
          "steps.");

  m.def(
      "_register_on_reducer",
      [](const std::shared_ptr<c10d::Reducer>& reducer, std::shared_ptr<CommHook> hook) {
        BRAID_ENFORCE(reducer, "register", -1, "the DDP model has no reducer");
        BRAID_ENFORCE(hook, "register", -1, "no hook given");
        try {
          reducer->register_comm_hook(asUniqueHook(hook));
        } catch (const c10::Error& e) {
          // torch's check that a reducer takes one hook; name ours too.
          BRAID_THROW(::braid::Error, "register", hook->rank(), "DDP refused ", hook->name(), ": ",
                      e.what_without_backtrace());
        }
      },
      py::arg("reducer"), py::arg("hook"),
      "Registers a C++ hook on PyTorch DDP's C++ reducer (Note [Reaching DDP's reducer]).");
  m.def(
      "_allreduce_hook", [](PG pg) { return makeAllreduceHook(std::move(pg)); },
      py::arg("process_group"));
  m.def(
      "_fp16_compress_hook", [](PG pg) { return makeFp16CompressHook(std::move(pg)); },
      py::arg("process_group"));
  m.def(
      "_bf16_compress_hook", [](PG pg) { return makeBf16CompressHook(std::move(pg)); },
      py::arg("process_group"));
  m.def(
      "_powersgd_hook",
      [](PG pg, int64_t rank, int64_t start, double minRate, bool errorFeedback, bool warmStart,
         double epsilon, uint64_t seed) {
        PowerSGDOptions o;
        o.matrixApproximationRank = rank;
        o.startPowerSGDIter = start;
        o.minCompressionRate = minRate;
        o.useErrorFeedback = errorFeedback;
        o.warmStart = warmStart;
        o.orthogonalizationEpsilon = epsilon;
        o.randomSeed = seed;
        return makePowerSGDHook(std::move(pg), o);
      },
      py::arg("process_group"), py::arg("matrix_approximation_rank"),
      py::arg("start_powerSGD_iter"), py::arg("min_compression_rate"),
      py::arg("use_error_feedback"), py::arg("warm_start"), py::arg("orthogonalization_epsilon"),
      py::arg("random_seed"));
  m.def(
      "_int8_hook",
      [](PG pg, int64_t chunkSize, bool errorFeedback) {
        Int8Options o;
        o.chunkSize = chunkSize;
        o.useErrorFeedback = errorFeedback;
        return makeInt8Hook(std::move(pg), o);
      },
      py::arg("process_group"), py::arg("chunk_size"), py::arg("use_error_feedback"));
}
