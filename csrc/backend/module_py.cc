// torch_braid._C: the backend class for c10d's plugin registry, build and
// settings information, and every other layer's bindings (python_parts.h).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/process_group.h"
#include "backend/python_parts.h"
#include "common/settings.h"
#include "reduce/reduce.h"

namespace py = pybind11;

namespace {

py::dict buildInfo() {
  py::dict d;
  d["version"] = BRAID_VERSION;
  d["torch_version"] = TORCH_VERSION;
  d["torch_api"] = braid::compat::kTorch2 ? "c10d::Backend (torch 2.x)"
                                          : "c10d::ProcessGroup (torch 1.x)";
  d["simd"] = braid::reduce::simdLevel();
#ifdef BRAID_WITH_CUDA
  d["cuda"] = true;
#else
  d["cuda"] = false;
#endif
  d["transports"] = std::vector<std::string>{"shm"};
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

PYBIND11_MODULE(_C, m) {
  m.doc() = "braid: a shared-memory c10d backend for PyTorch";
  m.attr("__version__") = BRAID_VERSION;
  py::object base = py::module::import("torch._C._distributed_c10d")
                        .attr(braid::compat::pythonBaseClassName());
  py::class_<braid::ProcessGroupBraid, c10::intrusive_ptr<braid::ProcessGroupBraid>>(
      m, "ProcessGroupBraid", base)
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<braid::ProcessGroupBraid>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("_shutdown", &braid::ProcessGroupBraid::shutdownNow,
           py::call_guard<py::gil_scoped_release>());
  m.def("build_info", &buildInfo);
  m.def("settings", &settings);
  for (auto& part : braid::python::parts()) part.second(m);
}
