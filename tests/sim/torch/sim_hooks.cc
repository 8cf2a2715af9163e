// Test-only: the simulated device answers as torch's CUDA accelerator.
//
// Note [The simulated device as torch's accelerator]
// From torch 2.7 on, the autograd engine asks `at::getAccelerator(true)` for
// the device type whose streams order a backward pass, and fails ("Cannot
// access accelerator device when none is available") on any backward over
// CUDA tensors where no CUDA hooks are built, as on a CPU-only torch. torch
// 1.13's engine stashes the caller's streams only for devices whose hooks say
// they have a context, and then reads the stash for every CUDA leaf: with
// none, it reads past an empty vector and crashes. torch
// finds the accelerator through the hooks registered under "CUDAHooks"
// (libtorch_cuda registers the real ones): these answer for the simulated
// device, with what the engine asks (is it built and available, how many
// devices, has a device a context), and nothing else. torch makes its hooks
// object once, on first use, and `import torch` already uses it: so where
// that object is torch's default (which has no state, only a vtable), the
// simulated hooks are constructed in its place; the registration serves a
// process that had not yet asked. Test-only, and never over real hooks:
// install() refuses where torch has CUDA. torch 2.6 never asks: there this
// is a no-op.
#include <torch/version.h>

#include "sim/torch/sim_cuda.h"

// 1.13 and 2.7+ ask for CUDA's hooks in backward; 2.6 does not.
#if TORCH_VERSION_MAJOR < 2 || TORCH_VERSION_MINOR >= 7
#define BRAID_SIM_HOOKS 1
#define BRAID_SIM_ACCELERATOR_HOOKS (TORCH_VERSION_MAJOR >= 2)
#endif

#ifdef BRAID_SIM_HOOKS
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <new>
#include <typeinfo>

#include "common/logging.h"

namespace braid {
namespace sim {
namespace {

const c10::impl::DeviceGuardImplInterface& cudaGuard() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

struct SimulatedCudaHooks final : at::CUDAHooksInterface {
  explicit SimulatedCudaHooks(at::CUDAHooksArgs) {}
  bool hasCUDA() const override { return true; }
  int getNumGPUs() const override { return cudaGuard().deviceCount(); }
#if !BRAID_SIM_ACCELERATOR_HOOKS
  // 1.13: the engine stashes the caller's current streams only where CUDA
  // has a context, and later reads them for every CUDA leaf.
  bool hasPrimaryContext(int64_t) const override { return true; }
  int64_t current_device() const override { return cudaGuard().getDevice().index(); }
#else
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return cudaGuard().deviceCount(); }
  c10::DeviceIndex current_device() const override { return cudaGuard().getDevice().index(); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    cudaGuard().setDevice(c10::Device(c10::DeviceType::CUDA, d));
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return cudaGuard().exchangeDevice(c10::Device(c10::DeviceType::CUDA, d)).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  void deviceSynchronize(c10::DeviceIndex d) const override {
    cudaGuard().synchronizeDevice(d);
  }
#endif
};

}  // namespace

void installAcceleratorHooks() {
  static bool once = [] {
    at::CUDAHooksRegistry()->Register(
        "CUDAHooks",
        [](at::CUDAHooksArgs args) -> std::unique_ptr<at::CUDAHooksInterface> {
          return std::make_unique<SimulatedCudaHooks>(args);
        },
        c10::REGISTRY_PREFERRED);
    static_assert(sizeof(SimulatedCudaHooks) == sizeof(at::CUDAHooksInterface),
                  "the simulated hooks must fit in the place of torch's default ones");
    const at::CUDAHooksInterface& made = at::detail::getCUDAHooks();
    if (typeid(made) == typeid(at::CUDAHooksInterface)) {
      auto* place = const_cast<at::CUDAHooksInterface*>(&made);
      place->~CUDAHooksInterface();
      new (place) SimulatedCudaHooks(at::CUDAHooksArgs{});
    } else if (!dynamic_cast<const SimulatedCudaHooks*>(&made)) {
      BRAID_LOG(kWarn, "simulated cuda", -1)
          << "torch has CUDA hooks of its own: backward over simulated CUDA tensors may fail "
             "(Note [The simulated device as torch's accelerator])";
    }
    return true;
  }();
  (void)once;
}

}  // namespace sim
}  // namespace braid

#else

namespace braid {
namespace sim {
void installAcceleratorHooks() {}
}  // namespace sim
}  // namespace braid

#endif
