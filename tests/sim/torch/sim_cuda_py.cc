// braid_sim._C: the simulated CUDA device for Python tests (Note [Simulated
// CUDA in tests] in sim_cuda.h). A module of its own, never shipped: it
// plugs into torch_braid._C through its testing hooks (Note [Simulators
// outside the product] in csrc/python/testing_hooks.h).
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "python/testing_hooks.h"
#include "sim/device/faulty_device.h"
#include "sim/device/sim_device.h"
#include "sim/nccl/faulty_nccl.h"
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

// The installed device wrapped for injected failures (faults_install), or null.
braid::cuda::FaultyDevice* gFaulty = nullptr;

braid::cuda::FaultyDevice& faulty() {
  if (!gFaulty) throw std::runtime_error("braid_sim: call faults_install() first");
  return *gFaulty;
}

// The simulated NCCL wrapped for injected failures (nccl_faults_install), or null.
braid::cuda::FaultyNccl* gFaultyNccl = nullptr;

braid::cuda::FaultyNccl& faultyNccl() {
  if (!gFaultyNccl) throw std::runtime_error("braid_sim: call nccl_faults_install() first");
  return *gFaultyNccl;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Test-only: braid's simulated CUDA device and NCCL (never shipped).";
  m.def(
      "install",
      [](int devices) {
        braid::sim::install(devices, hooks().setDeviceApi);
        hooks().setStreamResolver(&braid::sim::streamOf);
      },
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
  // Note [Simulated graph capture] in tests/sim/device/sim_device.h.
  m.def(
      "begin_capture",
      [](int device, const std::string& mode) {
        using M = braid::cuda::DeviceApi::CaptureMode;
        M m = mode == "global"         ? M::kGlobal
              : mode == "thread_local" ? M::kThreadLocal
              : mode == "relaxed"      ? M::kRelaxed
                                       : throw std::invalid_argument(
                                             "capture mode: global, thread_local or relaxed");
        braid::sim::device().beginCapture(braid::sim::currentStream(device), m);
      },
      py::arg("device"), py::arg("mode") = "global",
      "Starts capturing a CUDA graph on the device's current stream, from this thread.");
  m.def(
      "end_capture",
      [](int device) { return braid::sim::device().endCapture(braid::sim::currentStream(device)); },
      py::arg("device"),
      "Ends the capture on the device's current stream: the number of tasks captured; raises "
      "when a prohibited call invalidated it.");
  m.def(
      "is_current_stream_capturing",
      [](int device) {
        return braid::sim::device().streamIsCapturing(braid::sim::currentStream(device));
      },
      py::arg("device"));
  m.def(
      "set_thread_process", [](int id) { braid::cuda::sim::setThreadProcess(id); },
      py::arg("id"),
      "Tests only: the calling thread counts as simulated process `id` (0: the real one) for "
      "CUDA IPC's rules and DeviceApi::processId (Note [Simulated IPC] in "
      "tests/sim/device/sim_ipc.h).");
  m.def(
      "synchronize", [](int device) { braid::sim::device().deviceSynchronize(device); },
      py::arg("device") = 0, py::call_guard<py::gil_scoped_release>(),
      "torch.cuda.synchronize() on the simulated device: every stream of `device`, braid's "
      "included.");
  m.def(
      "delay_current_stream",
      [](int device, int64_t us) {
        braid::sim::delayCurrentStream(device, std::chrono::microseconds(us));
      },
      py::arg("device"), py::arg("us"));
  // Note [Simulated kernel images] in tests/sim/device/sim_arch.h.
  m.def(
      "set_compute_capability",
      [](int device, std::pair<int, int> cc) {
        braid::sim::device().setComputeCapability(device, cc.first * 10 + cc.second);
      },
      py::arg("device"), py::arg("capability"),
      "The simulated device's compute capability, (major, minor); (0, 0): the default.");
  m.def(
      "compute_capability",
      [](int device) {
        const int cc = braid::sim::device().computeCapability(device);
        return std::make_pair(cc / 10, cc % 10);
      },
      py::arg("device"));
  m.def(
      "set_kernel_images",
      [](std::optional<std::vector<std::string>> images) {
        std::optional<braid::cuda::KernelImages> k;
        if (images) {
          std::string list;
          for (const auto& i : *images) list += (list.empty() ? "" : ",") + i;
          k = braid::cuda::KernelImages::parse(list, "set_kernel_images");
        }
        braid::sim::device().setKernelImages(k);
      },
      py::arg("images"),
      "The kernel images the simulated build holds (['sm_80', 'compute_90']; [] for a build "
      "without nvcc; None: the default).");
  m.def(
      "kernel_load_error", [](int device) { return braid::sim::device().kernelLoadError(device); },
      py::arg("device"), "'' when braid's kernels load on the simulated device, else why not.");
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
  // Note [Injected device failures] in tests/sim/device/faulty_device.h.
  m.def(
      "faults_install",
      [] {
        // Process lifetime, as the simulated device it wraps.
        if (!gFaulty) gFaulty = new braid::cuda::FaultyDevice(braid::sim::device());
        hooks().setDeviceApi(gFaulty);
      },
      "Serve CUDA tensors with the installed simulated device wrapped so that "
      "inject_device_fault can make braid's device calls fail.");
  m.def(
      "inject_device_fault",
      [](const std::string& call, int nth, bool every, bool sticky, int code,
         const std::string& name, const std::string& message) {
        braid::cuda::DeviceFault f;
        f.call = call;
        f.nth = nth;
        f.every = every;
        f.sticky = sticky;
        f.code = code;
        f.errorName = name;
        f.message = message;
        faulty().inject(f);
      },
      py::arg("call"), py::arg("nth") = 1, py::arg("every") = false, py::arg("sticky") = false,
      py::arg("code") = 700, py::arg("name") = "cudaErrorIllegalAddress",
      py::arg("message") = "an illegal memory access was encountered",
      "The nth call (from now) of the DeviceApi call `call` ('hostFree', ...; '*': any) fails "
      "with CUDA's error, and every later one with `every`; `sticky`: every later call of any "
      "kind too (a corrupt context).");
  m.def("clear_device_faults", [] { faulty().clear(); });
  m.def("device_failures", [] { return faulty().failures(); },
        "Device calls failed by injection so far.");
  m.def("device_calls", [](const std::string& call) { return faulty().calls(call); },
        py::arg("call"),
        "How many times braid has called the DeviceApi call `call` ('deviceAlloc', "
        "'deviceFree', ...) since faults_install (the simulated tensors' own memory is not "
        "counted: it does not pass through the wrapper).");
  // Note [Injected NCCL failures] in tests/sim/nccl/faulty_nccl.h.
  m.def(
      "nccl_faults_install",
      [] {
        // Process lifetime, as nccl_install's simulated NCCL.
        if (!gFaultyNccl) {
          static auto* nccl = new braid::cuda::SimulatedNccl(braid::sim::device());
          gFaultyNccl = new braid::cuda::FaultyNccl(*nccl);
        }
        hooks().setNcclApi(gFaultyNccl);
      },
      "As nccl_install(), with the simulated NCCL wrapped so that inject_nccl_fault, "
      "nccl_async_error and nccl_hang_finalize can make its calls fail.");
  m.def(
      "inject_nccl_fault",
      [](const std::string& call, int nth, bool every, bool sticky, int result,
         const std::string& text) {
        braid::cuda::NcclFault f;
        f.call = call;
        f.nth = nth;
        f.every = every;
        f.sticky = sticky;
        f.result = static_cast<braid::cuda::NcclResult>(result);
        f.text = text;
        faultyNccl().inject(f);
      },
      py::arg("call"), py::arg("nth") = 1, py::arg("every") = false, py::arg("sticky") = false,
      py::arg("result") = static_cast<int>(braid::cuda::kNcclSystemError),
      py::arg("text") = "injected: a NIC went away",
      "The nth call (from now) of the NcclApi call `call` ('allReduce', 'commFinalize', ...; "
      "'*': any) answers `result` (an ncclResult_t), every later one with `every`; `sticky`: "
      "every later call of any kind too.");
  m.def(
      "nccl_async_error",
      [](int result, const std::string& text) {
        faultyNccl().asyncError(static_cast<braid::cuda::NcclResult>(result), text);
      },
      py::arg("result"), py::arg("text"),
      "From now on ncclCommGetAsyncError reports `result` on every communicator.");
  m.def(
      "nccl_hang_finalize", [](int64_t destroyHangMs) {
        faultyNccl().hangFinalize(std::chrono::milliseconds(destroyHangMs));
      },
      py::arg("destroy_hang_ms") = 20000,
      "A dead peer: finalizes never complete, and a destroy without one blocks that long.");
  m.def("clear_nccl_faults", [] { faultyNccl().clear(); });
  m.def(
      "nccl_teardown",
      [] {
        std::vector<std::string> calls;
        for (const auto& t : faultyNccl().teardown()) calls.push_back(t.call);
        return calls;
      },
      "The commFinalize, commDestroy and commAbort calls made so far, in order.");
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
