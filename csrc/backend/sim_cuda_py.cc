// Test-only bindings of the simulated CUDA device (Note [Simulated CUDA in
// tests], backend/sim_cuda.h): torch_braid._C._sim_*.
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "backend/cuda_context.h"
#include "backend/process_group.h"
#include "backend/python_parts.h"
#include "backend/sim_cuda.h"
#include "cuda/nccl_sim.h"
#include "cuda/same_gpu.h"

namespace py = pybind11;

BRAID_PY_PART(sim_cuda, m) {
  m.def("_sim_cuda_install", &braid::sim::install, py::arg("devices") = 2,
        "Test-only: serve CUDA tensors with braid's simulated device, on a torch without CUDA.");
  m.def(
      "_sim_empty",
      [](std::vector<int64_t> sizes, py::object dtype, int device, std::vector<int64_t> strides) {
        return braid::sim::empty(sizes, torch::python::detail::py_object_to_dtype(dtype), device,
                                 strides);
      },
      py::arg("sizes"), py::arg("dtype"), py::arg("device"),
      py::arg("strides") = std::vector<int64_t>{},
      "A zero-filled CUDA tensor over simulated device memory (strided when asked).");
  m.def("_sim_write", &braid::sim::write, py::arg("dst"), py::arg("src"),
        "dst <- src (a CPU tensor), on dst's device's current stream, not waited.");
  m.def("_sim_read", &braid::sim::read, py::arg("tensor"), py::call_guard<py::gil_scoped_release>(),
        "A CPU copy of a CUDA tensor, in the order of its device's current stream.");
  m.def(
      "_sim_delay_current_stream",
      [](int device, int64_t us) {
        braid::sim::delayCurrentStream(device, std::chrono::microseconds(us));
      },
      py::arg("device"), py::arg("us"));
  m.def(
      "_sim_nccl_install",
      [](bool crossProcess) {
        if (crossProcess) {
          braid::useSimulatedNccl(&braid::cuda::sameGpuCollectivesAsNccl(braid::cudaApi()));
          return;
        }
        // Process lifetime: groups may use it until exit.
        static auto* nccl = new braid::cuda::SimulatedNccl(braid::cudaApi());
        braid::useSimulatedNccl(nccl);
      },
      py::arg("cross_process") = false,
      "Test-only: groups on the simulated device use braid's simulated NCCL (ranks must be "
      "threads of this process: its communicators meet in-process), or with cross_process "
      "braid's same-GPU collectives standing in for it (ranks may be processes; used between "
      "the GPUs' leaders of the hierarchical collectives).");
  m.def(
      "_sim_delay_comm_stream",
      [](const braid::ProcessGroupBraid& pg, int64_t us) {
        auto ctx = pg.cudaContext();
        TORCH_CHECK(ctx, "the group has run no CUDA op yet");
        ctx->setCommDelay(std::chrono::microseconds(us));
      },
      py::arg("group"), py::arg("us"),
      "Every task of the group's comm stream from now on first sleeps `us`.");
}
