// braid_sim._C: the simulated CUDA device for Python tests (Note [Simulated
// CUDA in tests] in sim_cuda.h). A module of its own, never shipped: it
// plugs into torch_braid._C through its testing hooks (Note [Simulators
// outside the product] in csrc/python/testing_hooks.h).
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "python/testing_hooks.h"
#include "sim/device/sim_device.h"
#include "sim/nccl/nccl_sim.h"
#include "sim/nccl/same_gpu_as_nccl.h"
#include "sim/torch/sim_cuda.h"

namespace py = pybind11;

namespace {

// torch_braid._C's table, checked against this build's view of it.
const braid::TestingHooks& hooks() {
  static const braid::TestingHooks* table = [] {
    py::object capsule = py::module_::import("torch_braid._C").attr("_testing_hooks")();
    auto* t = static_cast<const braid::TestingHooks*>(
        PyCapsule_GetPointer(capsule.ptr(), "torch_braid._C.testing_hooks"));
    if (!t) throw py::error_already_set();
    if (t->version != braid::kTestingHooksVersion || t->size != sizeof(braid::TestingHooks) ||
        t->deviceApiSize != sizeof(braid::cuda::DeviceApi)) {
      throw std::runtime_error(
          "braid_sim: torch_braid._C's testing hooks are version " + std::to_string(t->version) +
          " (" + std::to_string(t->size) + " bytes), this module expects version " +
          std::to_string(braid::kTestingHooksVersion) + " (" +
          std::to_string(sizeof(braid::TestingHooks)) + " bytes): rebuild both from one tree");
    }
    return t;
  }();
  return *table;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Test-only: braid's simulated CUDA device and NCCL (never shipped).";
  m.def(
      "install", [](int devices) { braid::sim::install(devices, hooks().setDeviceApi); },
      py::arg("devices") = 2,
      "Serve CUDA tensors with braid's simulated device, on a torch without CUDA.");
  m.def(
      "empty",
      [](std::vector<int64_t> sizes, py::object dtype, int device, std::vector<int64_t> strides) {
        return braid::sim::empty(sizes, torch::python::detail::py_object_to_dtype(dtype), device,
                                 strides);
      },
      py::arg("sizes"), py::arg("dtype"), py::arg("device"),
      py::arg("strides") = std::vector<int64_t>{},
      "A zero-filled CUDA tensor over simulated device memory (strided when asked).");
  m.def("write", &braid::sim::write, py::arg("dst"), py::arg("src"),
        "dst <- src (a CPU tensor), on dst's device's current stream, not waited.");
  m.def("read", &braid::sim::read, py::arg("tensor"), py::call_guard<py::gil_scoped_release>(),
        "A CPU copy of a CUDA tensor, in the order of its device's current stream.");
  m.def(
      "set_device", [](int device) { braid::sim::device().setDevice(device); },
      py::arg("device"), "The calling thread's current device (cudaSetDevice): makes its context.");
  m.def(
      "current_device", [] { return braid::sim::device().getDevice(); },
      "The calling thread's current device (0 where it set none; makes no context).");
  m.def(
      "contexts", [] { return braid::sim::device().contexts(); },
      "The devices this process holds a primary context on, ascending: what nvidia-smi "
      "--query-compute-apps lists for it (Note [Simulated contexts] in "
      "tests/sim/device/sim_device.h).");
  m.def(
      "forget_contexts", [] { braid::sim::device().forgetContexts(); },
      "Tests only: as if this process held no context yet.");
  m.def(
      "delay_current_stream",
      [](int device, int64_t us) {
        braid::sim::delayCurrentStream(device, std::chrono::microseconds(us));
      },
      py::arg("device"), py::arg("us"));
  m.def(
      "nccl_install",
      [](bool crossProcess) {
        auto& dev = braid::sim::device();
        if (crossProcess) {
          hooks().setNcclApi(&braid::cuda::sameGpuCollectivesAsNccl(dev));
          return;
        }
        // Process lifetime: groups may use it until exit.
        static auto* nccl = new braid::cuda::SimulatedNccl(dev);
        hooks().setNcclApi(nccl);
      },
      py::arg("cross_process") = false,
      "Groups on the simulated device use braid's simulated NCCL (ranks must be threads of "
      "this process: its communicators meet in-process), or with cross_process braid's "
      "same-GPU collectives standing in for it (ranks may be processes; used between the "
      "GPUs' leaders of the multi-GPU collectives).");
  m.def(
      "delay_comm_stream",
      [](py::object group, int64_t us) {
        std::vector<braid::cuda::Stream> streams;
        if (!hooks().commStreams(group.ptr(), &streams)) throw py::error_already_set();
        for (auto s : streams) braid::sim::device().setStreamDelay(s, std::chrono::microseconds(us));
      },
      py::arg("group"), py::arg("us"),
      "Every task of the group's comm streams from now on first sleeps `us`.");
}
