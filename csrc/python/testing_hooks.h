// What a test-only module may reach inside torch_braid._C: the seams that the
// simulated device and NCCL plug into.
//
// Note [Simulators outside the product]
// braid's simulated CUDA device and NCCL (tests/sim/) never ship: they are
// built only with BRAID_BUILD_SIM (tools/setup.sh turns it on, `pip install .`
// leaves it off), into test-only targets:
//   - C++ tests link them beside libbraid or braid's object libraries and call
//     setDeviceApiForTesting / setNcclApiForTesting (c10d/cuda/cuda_context.h)
//     directly;
//   - Python tests import braid_sim (tests/sim/python/), an extension module
//     of its own. Python loads extension modules with RTLD_LOCAL, so
//     braid_sim cannot bind to _C's symbols (and must not link libbraid, a
//     second copy of the backend): _C hands it this table instead, in a
//     PyCapsule (`torch_braid._C._testing_hooks()`), as NumPy hands its C API
//     to other extensions. braid_sim carries its own copy of the torch-free
//     code it builds on (common/, cuda/): only the interfaces below cross.
// The table is versioned (kTestingHooksVersion plus the sizes of what it
// passes): a braid_sim built from another tree refuses to install instead
// of calling through a table it misreads. Nothing else of a simulator
// remains in _C or libbraid; CI checks their symbols (tools/check_shipped.sh).
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

#include "cuda/device_api.h"

namespace braid {
namespace cuda {
class NcclApi;
}  // namespace cuda

constexpr uint32_t kTestingHooksVersion = 2;

struct TestingHooks {
  uint32_t version;       // kTestingHooksVersion
  uint32_t size;          // sizeof(TestingHooks)
  uint32_t deviceApiSize;  // sizeof(cuda::DeviceApi): the vtable's layout is the header's
  void (*setDeviceApi)(cuda::DeviceApi* api);
  void (*setNcclApi)(cuda::NcclApi* nccl);
  // The streams a group's collectives run on (CudaContext::commStreams), for
  // a torch_braid._C.ProcessGroupBraid; raises (returns false with a Python
  // error set) when `group` is not one or has run no CUDA op yet.
  bool (*commStreams)(PyObject* group, std::vector<cuda::Stream>* out);
  // setStreamResolverForTesting (c10d/cuda/cuda_context.h): a torch stream's
  // handle on the device set for testing.
  void (*setStreamResolver)(cuda::Stream (*)(int device, int64_t streamId));
};

}  // namespace braid
