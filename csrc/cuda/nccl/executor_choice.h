// Which executor runs a group's CUDA ops: NCCL, or braid's staged one
// (through pinned host memory and the CPU collectives). Torch-free.
//
// Note [Choosing a CUDA executor]
// - NCCL 2.28 refuses a communicator in which two ranks use the same GPU
//   ("Duplicate GPU detected", init.cc), and ranks with different NCCL
//   versions ("Mismatched NCCL version"). So when a group is created every
//   rank publishes a CudaRankInfo (its device's UUID, the NCCL version it
//   loads or 0, and its BRAID_CUDA_EXECUTOR) through the store (the backend
//   does, e.g. with transport::exchangeThroughStore), and every rank calls
//   chooseCudaExecutor with all of them. The answer depends only on that
//   list, so every rank gets the same one, or throws the same error.
// - BRAID_CUDA_EXECUTOR=auto (the default): NCCL when every rank has its own
//   GPU and all load the same NCCL; else staged, with the reason (which ranks
//   share which GPU, which rank has no NCCL), except that a group whose ranks
//   all share one GPU runs braid's same-GPU collectives (Note [Same-GPU
//   collectives] in same_gpu.h), and a group whose ranks share several
//   GPUs, the same number on each (4 ranks on 2 GPUs), runs hierarchically
//   (Note [Hierarchical CUDA collectives] in multi_gpu.h: same-GPU collectives
//   within each GPU, NCCL between the GPUs' leaders, the lowest rank of
//   each GPU) when every leader loads the same NCCL and no GPU holds more
//   than 16 ranks. An uneven layout (3 ranks on one GPU, 1 on another) is
//   staged, and the reason says which GPUs hold how many. =nccl: NCCL, and
//   an Error when it cannot run (naming why) instead of a silent fallback;
//   =same-gpu and =hier likewise. =staged: staged.
// - The same-GPU and hierarchical executors launch braid's kernels, so each
//   rank also publishes whether they load on its device (Note [Kernel
//   images] in cuda/kernel_images.h): its index, compute capability and
//   DeviceApi::kernelLoadError. Where any rank's device cannot run them, or
//   the build has none, auto stages instead, saying which device (sm_XY) and
//   CUDA's text; =same-gpu and =hier fail saying so. NCCL needs none of them.
// - The setting shapes every CUDA op of the group (Note [Settings that shape
//   an op] in collectives/shm/plan.h), so the ranks must agree: it travels in
//   CudaRankInfo, and a difference fails the group's creation on every rank,
//   naming both values, as BRAID_SHM_SLOT_BYTES does for the window. It needs
//   no op header field: the choice is made once per group and never per op,
//   and NCCL ops carry no braid header.
// - Read once per group, when it is created (Note in common/settings.h).
#pragma once

#include <string>
#include <vector>

namespace braid {
namespace cuda {

enum class CudaExecutorKind { kNccl, kSameGpu, kHier, kStaged };
const char* toString(CudaExecutorKind k);

// What one rank contributes to the choice.
struct CudaRankInfo {
  std::string setting;  // BRAID_CUDA_EXECUTOR: "auto", "nccl", "same-gpu", "hier" or "staged"
  int ncclVersion = 0;  // NcclApi::version() of ncclLibrary(); 0: none loads
  std::string uuid;     // DeviceApi::deviceUuid of the rank's device
  int device = 0;       // the rank's device index, for messages
  int cc = 0;           // DeviceApi::computeCapability of it (75 is sm_75)
  std::string kernels;  // DeviceApi::kernelLoadError of it: "" when braid's kernels load
  // DeviceApi::processId of the rank (0: unknown). Note [Thread ranks on one GPU].
  int64_t process = 0;

  // One line for the store ("auto;22809;0;90;4242;0;<kernels><uuid>", 4242
  // the process, the 0 before them the length of `kernels`) and back; decode throws braid::Error naming
  // `rank` (the publisher) for a malformed value.
  std::string encode() const;
  static CudaRankInfo decode(const std::string& s, int rank);
};

// BRAID_CUDA_EXECUTOR, checked: throws braid::Error naming "init", `rank`
// and the valid values for anything else.
std::string cudaExecutorSetting(int rank);

// Note [Thread ranks on one GPU]
// The same-GPU collectives (and the hierarchical executor's GPU-local part)
// open every peer's buffer and event through CUDA IPC, which refuses a
// handle in the process that exported it: ranks that are threads of one
// process cannot serve each other that way, though they share the GPU's
// UUID. So each rank publishes its process (DeviceApi::processId) with its
// device info, and ranks that share a GPU and a process are refused by
// BRAID_CUDA_EXECUTOR=same-gpu or hier with an error naming both ranks, the
// GPU and the process; under auto they are staged through host memory
// (which needs no IPC), the reason saying why. Only a test's simulated
// device counts threads as processes (sim::setThreadProcess), so that the
// C++ tests may run ranks as threads under CUDA's IPC rules.

struct CudaExecutorChoice {
  CudaExecutorKind kind;
  std::string reason;  // for logs and torch_braid.info
};

// The ranks grouped by GPU (device UUID): GPUs numbered in the order of
// their lowest rank, which leads the GPU (Note [Hierarchical CUDA
// collectives] in multi_gpu.h).
struct HierLayout {
  std::vector<int> gpuOf;                 // rank -> GPU
  std::vector<std::vector<int>> ranksOn;  // GPU -> its ranks, ascending
};
HierLayout hierLayoutOf(const std::vector<CudaRankInfo>& ranks);
// The same-GPU collectives' limit (samegpu::kMaxRanks).
constexpr int kHierMaxRanksPerGpu = 16;

// `ranks[r]` is rank r's info; `rank` is the caller's, for messages. Throws
// braid::Error when the ranks' settings differ, or when "nccl" is asked for
// and cannot run.
CudaExecutorChoice chooseCudaExecutor(const std::vector<CudaRankInfo>& ranks, int rank);

}  // namespace cuda
}  // namespace braid
