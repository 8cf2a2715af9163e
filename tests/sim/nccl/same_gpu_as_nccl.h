// Test-only: braid's same-GPU collectives standing in for NCCL on the
// simulated device, for the GPUs' leaders of the multi-GPU collectives when
// the ranks are separate processes (the simulated NCCL meets its
// communicators in one process only; test_cuda_sim_multi_gpu.py). The
// simulated device's memory and events are shared memory, so one
// communicator may span its devices; a real GPU's are not, so this pairing
// exists only here.
#pragma once

#include "cuda/nccl/nccl_api.h"
#include "cuda/shared_gpu/same_gpu.h"
#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {

constexpr int kSameGpuAsNcclVersion = 1;  // "0.0.1": not a real NCCL

inline NcclApi& sameGpuCollectivesAsNccl(SimulatedDevice& dev) {
  return sameGpuCollectives(dev, kSameGpuAsNcclVersion);
}

}  // namespace cuda
}  // namespace braid
