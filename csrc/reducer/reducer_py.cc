// torch_braid._C bindings of the reducer, used by python/torch_braid/ddp.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/python_comm_hook.h>
#include <torch/csrc/utils/pybind.h>  // intrusive_ptr holders (ProcessGroup), Tensor casters

#include "python/python_parts.h"
#include "reducer/comm_hook_py.h"
#include "reducer/param_sync.h"
#include "reducer/reducer.h"

namespace py = pybind11;

namespace braid {
namespace {

// allreduce, then divide by the world size out of place: the default path as
// a C++ hook, to test and illustrate the CommHook contract.
class AllreduceMeanHook : public c10d::CommHookInterface {
 public:
  explicit AllreduceMeanHook(c10::intrusive_ptr<c10d::ProcessGroup> pg) : pg_(std::move(pg)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> ts{bucket.getBufferRef()};
    const int world = pg_->getSize();
    return pg_->allreduce(ts)->getFuture()->then(
        [world](c10::ivalue::Future& f) {
          return c10::IValue(f.value().toTensorVector()[0] / world);
        },
        c10::TensorType::get());
  }
  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
};

}  // namespace
}  // namespace braid

BRAID_PY_PART(reducer, m) {
  using braid::Reducer;
  using Release = py::call_guard<py::gil_scoped_release>;
  braid::python::bindCommHookBase(m);
  py::class_<braid::AllreduceMeanHook, c10d::CommHookInterface,
             std::shared_ptr<braid::AllreduceMeanHook>>(m, "_AllreduceMeanCommHook")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>>(), py::arg("process_group"));

  py::class_<Reducer>(m, "Reducer",
                      "braid's DDP gradient reducer; use torch_braid.ddp.DistributedDataParallel.")
      .def(py::init([](std::vector<at::Tensor> params, std::vector<std::string> names,
                       c10::intrusive_ptr<c10d::ProcessGroup> pg, int64_t firstBucketBytes,
                       int64_t bucketCapBytes, bool findUnused, bool bucketView, bool staticGraph) {
             braid::ReducerOptions o;
             o.first_bucket_bytes = firstBucketBytes;
             o.bucket_cap_bytes = bucketCapBytes;
             o.find_unused_parameters = findUnused;
             o.gradient_as_bucket_view = bucketView;
             o.static_graph = staticGraph;
             return std::make_unique<Reducer>(std::move(params), std::move(names), std::move(pg),
                                              o);
           }),
           py::arg("params"), py::arg("names"), py::arg("process_group"),
           py::arg("first_bucket_bytes"), py::arg("bucket_cap_bytes"),
           py::arg("find_unused_parameters"), py::arg("gradient_as_bucket_view"),
           py::arg("static_graph"))
      .def("prepare_for_forward", &Reducer::prepareForForward, Release())
      .def("prepare_for_backward", &Reducer::prepareForBackward, py::arg("outputs"), Release())
      // Every method that takes the reducer's lock drops the GIL first: the
      // lock's holder (an autograd hook) may be waiting for the GIL to run a
      // Python comm hook.
      .def("set_sync", &Reducer::setSync, py::arg("sync"), Release())
      .def("sync", &Reducer::sync, Release())
      .def("register_comm_hook", &Reducer::registerCommHook, py::arg("hook"), Release())
      .def(
          "register_python_comm_hook",
          [](Reducer& r, py::object state, py::object hook) {
            // torch's adapter: calls hook(state, GradBucket) under the GIL.
            std::shared_ptr<c10d::CommHookInterface> h =
                std::make_shared<c10d::PythonCommHook>(std::move(state), std::move(hook));
            py::gil_scoped_release release;
            r.registerCommHook(std::move(h));
          },
          py::arg("state"), py::arg("hook"))
      .def("bucket_indices", &Reducer::bucketIndices, Release())
      .def("buckets_rebuilt", &Reducer::bucketsRebuilt, Release())
      .def("buckets_averaged_in_allreduce", &Reducer::bucketsAveragedInAllreduce, Release())
      .def("buckets_registered", &Reducer::bucketsRegistered, Release())
      .def("synced_iterations", &Reducer::syncedIterations, Release());

  m.def("_ddp_verify_params", &braid::verifyParamsAcrossRanks, py::arg("process_group"),
        py::arg("params"), py::arg("names"), Release());
  m.def(
      "_ddp_broadcast_coalesced",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::vector<at::Tensor>& tensors,
         int root) { braid::broadcastCoalesced(pg, tensors, root); },
      py::arg("process_group"), py::arg("tensors"), py::arg("root") = 0, Release());
}
