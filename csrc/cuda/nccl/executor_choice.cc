#include "cuda/nccl/executor_choice.h"

#include <map>
#include <stdexcept>

#include "common/error.h"
#include "common/settings.h"
#include "cuda/kernel_images.h"

namespace braid {
namespace cuda {
namespace {

BRAID_SETTING_STRING(kCudaExecutor, "BRAID_CUDA_EXECUTOR", "auto",
                     "How a group runs CUDA tensors: auto (NCCL when every rank has its own GPU "
                     "and the same NCCL; braid's same-GPU collectives when all ranks share one "
                     "GPU; hierarchical (same-GPU within each GPU, NCCL between the GPUs' "
                     "leaders) when several GPUs each hold the same number of ranks; else staged "
                     "through host memory), nccl (NCCL or an error saying why not), same-gpu "
                     "(or an error), hier (or an error) or staged. Equal on every rank.");

bool validSetting(const std::string& s) {
  return s == "auto" || s == "nccl" || s == "staged" || s == "same-gpu" || s == "hier";
}

std::string versionText(int v) {
  if (v == 0) return "none";
  return strCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace

HierLayout hierLayoutOf(const std::vector<CudaRankInfo>& ranks) {
  HierLayout l;
  std::map<std::string, int> gpuOfUuid;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto it = gpuOfUuid.emplace(ranks[r].uuid, static_cast<int>(l.ranksOn.size())).first;
    if (it->second == static_cast<int>(l.ranksOn.size())) l.ranksOn.emplace_back();
    l.gpuOf.push_back(it->second);
    l.ranksOn[it->second].push_back(static_cast<int>(r));
  }
  return l;
}

const char* toString(CudaExecutorKind k) {
  switch (k) {
    case CudaExecutorKind::kNccl:
      return "nccl";
    case CudaExecutorKind::kSameGpu:
      return "same-gpu";
    case CudaExecutorKind::kHier:
      return "hier";
    case CudaExecutorKind::kStaged:
      break;
  }
  return "staged";
}

std::string CudaRankInfo::encode() const {
  return strCat(setting, ";", ncclVersion, ";", device, ";", cc, ";", process, ";", kernels.size(),
                ";", kernels, uuid);
}

CudaRankInfo CudaRankInfo::decode(const std::string& s, int rank) {
  // setting;nccl;device;cc;process;length;<kernels><uuid>: the two free
  // texts last, the first by its length (either may hold a ';').
  std::vector<std::string> fields;
  size_t at = 0;
  for (int i = 0; i < 6; ++i) {
    const size_t end = s.find(';', at);
    BRAID_ENFORCE(end != std::string::npos, "init", rank, "malformed CUDA device info '", s, "'");
    fields.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  CudaRankInfo info;
  info.setting = fields[0];
  int64_t numbers[5] = {};
  const char* names[5] = {"NCCL version", "device", "compute capability", "process",
                          "kernel report length"};
  for (int i = 0; i < 5; ++i) {
    try {
      size_t used = 0;
      numbers[i] = std::stoll(fields[i + 1], &used);
      if (used != fields[i + 1].size() || numbers[i] < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      BRAID_THROW(Error, "init", rank, "malformed ", names[i], " in CUDA device info '", s, "'");
    }
  }
  info.ncclVersion = static_cast<int>(numbers[0]);
  info.device = static_cast<int>(numbers[1]);
  info.cc = static_cast<int>(numbers[2]);
  info.process = numbers[3];
  const size_t length = static_cast<size_t>(numbers[4]);
  BRAID_ENFORCE(length <= s.size() - at, "init", rank, "malformed CUDA device info '", s,
                "': a kernel report of ", length, " bytes");
  info.kernels = s.substr(at, length);
  info.uuid = s.substr(at + length);
  return info;
}

namespace {
// Why braid's kernels cannot run on every rank's device, or "" (Note [Kernel
// images] in cuda/kernel_images.h): the first rank whose device said no.
std::string whyNoKernels(const std::vector<CudaRankInfo>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].kernels.empty()) {
      return strCat("braid's kernels do not load on device ", ranks[r].device, " (",
                    smName(ranks[r].cc), ") of rank ", r, ": ", ranks[r].kernels);
    }
  }
  return "";
}
// Why ranks sharing a GPU cannot open each other's IPC handles, or "": the
// first two that share a GPU and a process (Note [Thread ranks on one GPU]).
std::string whyNoIpc(const std::vector<CudaRankInfo>& ranks) {
  std::map<std::pair<std::string, int64_t>, size_t> first;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].process == 0) continue;
    auto it = first.emplace(std::make_pair(ranks[r].uuid, ranks[r].process), r).first;
    if (it->second != r) {
      return strCat("ranks ", it->second, " and ", r, " share GPU ", ranks[r].uuid,
                    " and are threads of one process (", ranks[r].process,
                    "), and CUDA IPC, which the same-GPU collectives need, does not open a "
                    "handle in the process that exported it");
    }
  }
  return "";
}
}  // namespace

std::string cudaExecutorSetting(int rank) {
  std::string v = kCudaExecutor.get();
  BRAID_ENFORCE(validSetting(v), "init", rank, "BRAID_CUDA_EXECUTOR='", v,
                "' is not one of auto, nccl, same-gpu, hier, staged");
  return v;
}

CudaExecutorChoice chooseCudaExecutor(const std::vector<CudaRankInfo>& ranks, int rank) {
  BRAID_ENFORCE(!ranks.empty(), "init", rank, "no ranks to choose a CUDA executor for");
  const std::string& setting = ranks[0].setting;
  for (size_t r = 0; r < ranks.size(); ++r) {
    BRAID_ENFORCE(validSetting(ranks[r].setting), "init", rank, "rank ", r,
                  " runs with BRAID_CUDA_EXECUTOR='", ranks[r].setting,
                  "', not one of auto, nccl, same-gpu, hier, staged");
    BRAID_ENFORCE(ranks[r].setting == setting, "init", rank,
                  "the ranks must agree on BRAID_CUDA_EXECUTOR: rank 0 runs with '", setting,
                  "', rank ", r, " with '", ranks[r].setting, "'");
  }
  if (setting == "staged") {
    return {CudaExecutorKind::kStaged, "BRAID_CUDA_EXECUTOR=staged"};
  }
  // Every rank on one GPU: braid's own collectives over CUDA IPC (Note
  // [Same-GPU collectives] in same_gpu.h), where NCCL refuses and staging is
  // bound by host memory.
  bool oneGpu = ranks.size() > 1;
  for (size_t r = 1; r < ranks.size() && oneGpu; ++r) oneGpu = ranks[r].uuid == ranks[0].uuid;
  BRAID_ENFORCE(setting != "hier" || !oneGpu, "init", rank, "BRAID_CUDA_EXECUTOR=hier, but all ",
                ranks.size(), " ranks share GPU ", ranks[0].uuid, "; use same-gpu or auto");
  std::string noKernels = whyNoKernels(ranks);
  // Thread ranks: as though the same-GPU collectives could not run.
  if (noKernels.empty()) noKernels = whyNoIpc(ranks);
  if (setting == "same-gpu" || (setting == "auto" && oneGpu)) {
    BRAID_ENFORCE(oneGpu, "init", rank, "BRAID_CUDA_EXECUTOR=same-gpu, but the ranks do not all "
                  "share one GPU (rank 0 has ", ranks[0].uuid, ranks.size() > 1 ? strCat(
                  ", rank ", ranks.size() - 1, " ", ranks.back().uuid) : std::string(
                  ", and it is alone"), "); use auto, nccl or staged");
    // NCCL refuses a GPU twice, so staging is what is left.
    BRAID_ENFORCE(setting != "same-gpu" || noKernels.empty(), "init", rank,
                  "BRAID_CUDA_EXECUTOR=same-gpu, but ", noKernels, "; use auto or staged");
    if (!noKernels.empty()) {
      return {CudaExecutorKind::kStaged,
              strCat("all ", ranks.size(), " ranks share GPU ", ranks[0].uuid,
                     ", but the same-GPU collectives cannot run there: ", noKernels)};
    }
    return {CudaExecutorKind::kSameGpu,
            strCat("all ", ranks.size(), " ranks share GPU ", ranks[0].uuid)};
  }
  // Why NCCL cannot run, or "".
  std::string why;
  std::map<std::string, size_t> firstWith;
  for (size_t r = 0; r < ranks.size() && why.empty(); ++r) {
    auto it = firstWith.emplace(ranks[r].uuid, r).first;
    if (it->second != r) {
      why = strCat("ranks ", it->second, " and ", r, " share GPU ", ranks[r].uuid,
                   ", and NCCL refuses a communicator with a GPU twice (\"Duplicate GPU "
                   "detected\")");
    }
  }
  for (size_t r = 0; r < ranks.size() && why.empty(); ++r) {
    if (ranks[r].ncclVersion == 0) {
      why = strCat("rank ", r, " cannot load NCCL (libnccl.so.2)");
    } else if (ranks[r].ncclVersion != ranks[0].ncclVersion) {
      why = strCat("rank 0 loads NCCL ", versionText(ranks[0].ncclVersion), " and rank ", r,
                   " NCCL ", versionText(ranks[r].ncclVersion),
                   ", and NCCL refuses mismatched versions in one communicator");
    }
  }
  const HierLayout layout = hierLayoutOf(ranks);
  const size_t gpus = layout.ranksOn.size();
  const bool shared = gpus < ranks.size();  // some GPU holds two ranks or more
  if (why.empty() && setting != "hier") {
    return {CudaExecutorKind::kNccl,
            strCat("every rank has its own GPU and NCCL ", versionText(ranks[0].ncclVersion))};
  }
  BRAID_ENFORCE(setting != "nccl", "init", rank, "BRAID_CUDA_EXECUTOR=nccl, but ", why,
                "; use auto or staged");
  // Several GPUs, some shared: hierarchical (Note [Hierarchical CUDA
  // collectives] in multi_gpu.h) where the layout allows it.
  std::string whyNotHier;
  const size_t perGpu = layout.ranksOn[0].size();
  if (gpus == 1) {
    whyNotHier = strCat("all ", ranks.size(), " ranks share GPU ", ranks[0].uuid,
                        " (use same-gpu)");
  } else if (!shared) {
    whyNotHier = "every rank has its own GPU (use nccl)";
  }
  for (size_t g = 1; g < gpus && whyNotHier.empty(); ++g) {
    if (layout.ranksOn[g].size() != perGpu) {
      whyNotHier = strCat("the hierarchical executor needs the same number of ranks on every GPU, "
                          "and GPU ", ranks[layout.ranksOn[0][0]].uuid, " holds ", perGpu,
                          " (rank ", layout.ranksOn[0][0], " first) where GPU ",
                          ranks[layout.ranksOn[g][0]].uuid, " holds ", layout.ranksOn[g].size(),
                          " (rank ", layout.ranksOn[g][0], " first)");
    }
  }
  if (whyNotHier.empty() && perGpu > static_cast<size_t>(kHierMaxRanksPerGpu)) {
    whyNotHier = strCat(perGpu, " ranks per GPU, and the same-GPU collectives take at most ",
                        kHierMaxRanksPerGpu);
  }
  const int leaderNccl = ranks[layout.ranksOn[0][0]].ncclVersion;
  for (size_t g = 0; g < gpus && whyNotHier.empty(); ++g) {
    const int leader = layout.ranksOn[g][0];
    if (ranks[leader].ncclVersion == 0) {
      whyNotHier = strCat("rank ", leader, ", the leader of GPU ", ranks[leader].uuid,
                          ", cannot load NCCL (libnccl.so.2), which runs between the GPUs' "
                          "leaders");
    } else if (ranks[leader].ncclVersion != leaderNccl) {
      whyNotHier = strCat("the GPUs' leaders load different NCCLs: rank ", layout.ranksOn[0][0],
                          " NCCL ", versionText(leaderNccl), ", rank ", leader, " NCCL ",
                          versionText(ranks[leader].ncclVersion));
    }
  }
  if (whyNotHier.empty()) whyNotHier = noKernels;
  if (whyNotHier.empty()) {
    std::string leaders;
    for (size_t g = 0; g < gpus; ++g) {
      leaders += strCat(g ? ", " : "", layout.ranksOn[g][0]);
    }
    return {CudaExecutorKind::kHier,
            strCat(ranks.size(), " ranks on ", gpus, " GPUs, ", perGpu,
                   " per GPU: braid's same-GPU collectives within each GPU, NCCL ",
                   versionText(leaderNccl), " between the GPUs' leaders (ranks ", leaders, ")")};
  }
  BRAID_ENFORCE(setting != "hier", "init", rank, "BRAID_CUDA_EXECUTOR=hier, but ", whyNotHier,
                "; use auto or staged");
  if (why.empty()) why = whyNotHier;
  else if (shared) why = strCat(why, "; and ", whyNotHier);
  return {CudaExecutorKind::kStaged, why};
}

}  // namespace cuda
}  // namespace braid
