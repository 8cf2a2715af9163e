// Note [Loading braid's kernels]
// The fatbin (machine code for several GPUs and PTX for newer ones: Note
// [Kernel images] in kernel_images.h) is loaded with
// cudaLibraryLoadData, which is context-independent: one library and one
// cudaKernel_t per kernel serve every device, and the runtime loads the code
// into a device's context at the first launch there (lazy loading). A
// cudaKernel_t is passed to cudaLaunchKernel in place of a function pointer.
// The handles are kept for the life of the process, never unloaded (as with
// the runtime itself, Note [Loading the CUDA runtime]).
#include "cuda/cuda_kernels.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "cuda/host_kernels.h"
#include "cuda/kernel_images.h"
#include "cuda/kernels.cuh"

namespace braid {
namespace cuda {

#ifdef BRAID_CUDA_HAVE_FATBIN
extern const unsigned char braid_kernels_fatbin[];  // braid_kernels_fatbin.cc (generated)
extern const size_t braid_kernels_fatbin_size;
#endif

namespace {

constexpr unsigned kThreads = 256;
// Kernels are grid-stride loops, so the grid can be capped: 8192 blocks of
// 256 threads are several waves on any current GPU.
constexpr size_t kMaxBlocks = 8192;

rt::KernelT kernel(const rt::Runtime& r, const char* name) {
#ifndef BRAID_CUDA_HAVE_FATBIN
  (void)r;
  throw Error(strCat("braid: reduce on a CUDA device needs braid's CUDA kernels (", name,
                     "), but this braid was built without nvcc; rebuild with nvcc available "
                     "(CUDA_HOME, or -DBRAID_CUDA_KERNELS=ON)"));
#else
  static std::mutex mu;
  static rt::LibraryT library = nullptr;
  static auto* kernels = new std::unordered_map<std::string, rt::KernelT>();  // never freed
  std::lock_guard<std::mutex> lk(mu);
  auto it = kernels->find(name);
  if (it != kernels->end()) return it->second;
  if (r.f.libraryLoadData == nullptr || r.f.libraryGetKernel == nullptr) {
    throw Error(strCat("braid: ", r.soname, " (version ", r.version,
                       ") has no cudaLibraryLoadData/cudaLibraryGetKernel, which braid's CUDA "
                       "kernels need (CUDA runtime 12.0 or newer)"));
  }
  if (library == nullptr) {
    BRAID_CUDART(r.f.libraryLoadData(&library, braid_kernels_fatbin, nullptr, nullptr, 0,
                                     nullptr, nullptr, 0),
                 "cudaLibraryLoadData(braid's kernels, ", braid_kernels_fatbin_size, " bytes)");
  }
  rt::KernelT k = nullptr;
  BRAID_CUDART(r.f.libraryGetKernel(&k, library, name), "cudaLibraryGetKernel(", name, ")");
  (*kernels)[name] = k;
  return k;
#endif
}

}  // namespace

bool haveKernels() {
#ifdef BRAID_CUDA_HAVE_FATBIN
  return true;
#else
  return false;
#endif
}

const unsigned char* kernelFatbin(size_t* bytes) {
#ifdef BRAID_CUDA_HAVE_FATBIN
  *bytes = braid_kernels_fatbin_size;
  return braid_kernels_fatbin;
#else
  *bytes = 0;
  return nullptr;
#endif
}

std::string kernelLoadError(const rt::Runtime& r, int cc) {
  if (!haveKernels()) {
    return "this braid was built without nvcc, so it has no CUDA kernels (rebuild with nvcc "
           "available: CUDA_HOME, or -DBRAID_CUDA_KERNELS=ON)";
  }
  const KernelImages& images = builtKernelImages();
  if (!images.runOn(cc)) {
    return strCat(kNoKernelImageText, ": braid's kernels hold ", images.str(), ", none of which runs on ",
                  smName(cc), " (rebuild with -DBRAID_CUDA_ARCHS=", cc, ")");
  }
  // The rule says yes; loading one kernel into this device's context says
  // whether the driver agrees (it may be too old for the PTX, say). All the
  // kernels are in one fatbin, so one stands for all.
  const char* name = reduceKernelName(DataType::kFloat32, ReduceOp::kSum);
  try {
    rt::KernelT k = kernel(r, name);
    std::vector<unsigned char> attrs(rt::kFuncAttributesBufferBytes);
    BRAID_CUDART(r.f.funcGetAttributes(attrs.data(), k), "cudaFuncGetAttributes(", name,
                 ", ", smName(cc), ")");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void launchReduce(const rt::Runtime& r, DataType type, ReduceOp op, void* dst, const void* src,
                  size_t count, rt::StreamT stream) {
  checkReduceArgs("reduceAsync", type, op, dst, src, count);
  if (count == 0) return;
  const char* name = reduceKernelName(type, op);
  rt::KernelT k = kernel(r, name);
  const size_t blocks = std::min(kMaxBlocks, (count + kThreads - 1) / kThreads);
  void* args[] = {&dst, &src, &count};
  BRAID_CUDART(r.f.launchKernel(k, rt::Dim3{static_cast<unsigned>(blocks), 1, 1},
                                rt::Dim3{kThreads, 1, 1}, args, 0, stream),
               "cudaLaunchKernel(", name, ", dst=", dst, ", src=", src, ", count=", count,
               ", stream=", stream, ")");
}

void launchReduceMulti(const rt::Runtime& r, DataType type, ReduceOp op, void* dst,
                       const void* const* srcs, int n, double divisor, size_t count,
                       rt::StreamT stream) {
  checkReduceMultiArgs("reduceMultiAsync", type, op, dst, srcs, n, divisor, count);
  if (count == 0) return;
  const char* name = reduceMultiKernelName(type, op);
  rt::KernelT k = kernel(r, name);
  kernels::ReduceSources sources{};
  for (int i = 0; i < n; ++i) sources.p[i] = srcs[i];
  const size_t blocks = std::min(kMaxBlocks, (count + kThreads - 1) / kThreads);
  void* args[] = {&dst, &sources, &n, &divisor, &count};
  BRAID_CUDART(r.f.launchKernel(k, rt::Dim3{static_cast<unsigned>(blocks), 1, 1},
                                rt::Dim3{kThreads, 1, 1}, args, 0, stream),
               "cudaLaunchKernel(", name, ", dst=", dst, ", ", n, " sources, count=", count,
               ", stream=", stream, ")");
}

}  // namespace cuda
}  // namespace braid
