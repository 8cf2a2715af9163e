// torch_braid._C._testing_hooks(): the table of Note [Simulators outside the
// product] (python/testing_hooks.h), in a PyCapsule named
// "torch_braid._C.testing_hooks".
#include <torch/extension.h>

#include "c10d/cuda/cuda_context.h"
#include "c10d/process_group.h"
#include "python/python_parts.h"
#include "python/testing_hooks.h"

namespace py = pybind11;

namespace braid {
namespace {

bool commStreams(PyObject* group, std::vector<cuda::Stream>* out) {
  try {
    auto& pg = py::handle(group).cast<ProcessGroupBraid&>();
    auto ctx = pg.cudaContext();
    if (!ctx) throw std::runtime_error("braid: the group has run no CUDA op yet");
    *out = ctx->commStreams();
    return true;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return false;
}

const TestingHooks kHooks = {kTestingHooksVersion, sizeof(TestingHooks), sizeof(cuda::DeviceApi),
                             &setDeviceApiForTesting, &setNcclApiForTesting, &commStreams,
                             &setStreamResolverForTesting};

}  // namespace
}  // namespace braid

BRAID_PY_PART(testing, m) {
  m.def(
      "_testing_hooks",
      [] {
        return py::capsule(const_cast<braid::TestingHooks*>(&braid::kHooks),
                           "torch_braid._C.testing_hooks");
      },
      "For braid's own tests: the seams its simulated device plugs into (Note [Simulators "
      "outside the product]).");
}
