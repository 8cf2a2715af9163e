// Test-only: "CUDA" on a machine without a GPU. Registers a c10 device guard
// for DeviceType::CUDA backed by braid's simulated device (cuda/device_api.h),
// so that CUDA tensors over host memory (at::from_blob with a CUDA device),
// c10 streams and events, and Futures with a CUDA device list all run braid's
// real CUDA code path, with CUDA's ordering rules.
//
// Note [Simulated CUDA in tests]
// torch's own openreg simulates a device this way (a stream is a thread with
// a queue, an event a flag set by a queued task). Only metadata and data_ptr()
// work on such tensors: no ATen kernel is registered for CUDA on a CPU-only
// torch, so tests move data with the helpers below, which run in the order of
// the caller's current (simulated) stream, as a user's kernels would.
// Installing refuses where torch already has a CUDA guard (a real CUDA build):
// the simulation never stands in for a real device.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <chrono>

#include "sim/device/sim_device.h"

namespace braid {
namespace sim {

// Registers the guard and the ATen fallback (once per process) and makes
// braid's CUDA path use the simulated device, through `setDeviceApi`: braid's
// setDeviceApiForTesting, called directly by a C++ test that links libbraid,
// or reached through torch_braid._C's testing hooks by the Python module
// (Note [Simulators outside the product] in csrc/python/testing_hooks.h).
// Throws braid::Error where torch has a CUDA guard already.
void install(int devices, void (*setDeviceApi)(cuda::DeviceApi*));
// The simulated device, once installed.
cuda::SimulatedDevice& device();
// The CUDA key's boxed fallback to CPU kernels (tests/sim/torch/sim_aten.cc).
void installAtenFallback();
// torch's CUDA hooks, where autograd asks for them (tests/sim/torch/sim_hooks.cc).
void installAcceleratorHooks();

// The simulated stream behind the current c10 stream of `device`.
cuda::Stream currentStream(int device);
// The handle of torch's stream `streamId` of `device` (for
// setStreamResolverForTesting in csrc/c10d/cuda/cuda_context.h).
cuda::Stream streamOf(int device, int64_t streamId);

// A "CUDA" tensor over simulated device memory, zero-filled.
// With `strides` (non-empty), a strided view over enough memory for them.
at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype, int device,
                 at::IntArrayRef strides = {});
// On the current stream of t's device: dst <- src (host values), not waited.
void write(const at::Tensor& dst, const at::Tensor& src);
// On the current stream of t's device, then waited: a CPU copy of t.
at::Tensor read(const at::Tensor& t);
// Every task enqueued on the current stream of `device` from now on first
// sleeps `delay`.
void delayCurrentStream(int device, std::chrono::microseconds delay);

}  // namespace sim
}  // namespace braid
