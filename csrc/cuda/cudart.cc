// Note [Loading the CUDA runtime]
// braid never links libcudart (Note [The device seam] in device_api.h). At
// the first cudaRuntime() call it takes, in this order:
//   1. BRAID_CUDART_LIBRARY, a path, when set;
//   2. the copy already in the process, found by soname with RTLD_NOLOAD:
//      libcudart.so.13, then libcudart.so.12. That is the copy torch loaded,
//      so braid and torch share one runtime, one primary context per device
//      and one set of streams; a second copy would work on the same contexts
//      but keep its own state (and its own idea of the current device);
//   3. the same sonames through the loader's search path;
//   4. the same sonames in $CUDA_HOME/lib64 and /usr/local/cuda/lib64, which
//      the loader does not search by default (a C++ program without torch on
//      a machine whose toolkit is not in ld.so.conf).
// Then every function in cudart.h is resolved by name (dlsym takes the
// default version of the versioned symbols, e.g. cudaEventRecord@@
// libcudart.so.13). A missing required symbol is an error naming it; the
// optional ones (library API, cudaStreamGetDevice) are checked where used.
// The handle is never closed: torch's copy stays loaded anyway, and closing
// ours at exit would race with CUDA's own teardown.
#include "cuda/cudart.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/settings.h"

namespace braid {
namespace cuda {
namespace rt {
namespace {

BRAID_SETTING_STRING(kCudartLibrary, "BRAID_CUDART_LIBRARY", "",
                     "Path of the libcudart.so to load for CUDA tensors; empty: the copy torch "
                     "loaded, else libcudart.so.13/.12 from the loader's search path or the CUDA "
                     "toolkit.");

const char* const kSonames[] = {"libcudart.so.13", "libcudart.so.12"};

void* openRuntime(std::string* soname) {
  std::string firstError;
  auto attempt = [&](const std::string& name, int flags) -> void* {
    dlerror();
    void* h = dlopen(name.c_str(), flags);
    if (h != nullptr) {
      *soname = name;
    } else if (firstError.empty() && !(flags & RTLD_NOLOAD)) {
      const char* e = dlerror();
      firstError = e ? e : name + ": unknown dlopen error";
    }
    return h;
  };
  const std::string path = kCudartLibrary.get();
  if (!path.empty()) {
    if (void* h = attempt(path, RTLD_NOW | RTLD_LOCAL)) return h;
    throw Error(strCat("braid: BRAID_CUDART_LIBRARY=", path, " could not be loaded: ",
                       firstError));
  }
  for (const char* name : kSonames) {
    if (void* h = attempt(name, RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  for (const char* name : kSonames) {
    if (void* h = attempt(name, RTLD_NOW | RTLD_LOCAL)) return h;
  }
  std::vector<std::string> dirs;
  if (const char* home = std::getenv("CUDA_HOME")) dirs.push_back(std::string(home) + "/lib64");
  dirs.push_back("/usr/local/cuda/lib64");
  for (const std::string& dir : dirs) {
    for (const char* name : kSonames) {
      if (void* h = attempt(dir + "/" + name, RTLD_NOW | RTLD_LOCAL)) return h;
    }
  }
  throw Error(strCat("braid: CUDA tensors need the CUDA runtime, but libcudart.so.13/.12 could "
                     "not be loaded: ",
                     firstError));
}

std::string message(const Functions& f, Status err, const std::string& call) {
  const char* text = f.getErrorString(err);
  const char* name = f.getErrorName(err);
  return strCat("braid: ", call, " failed: ", text ? text : "unknown error", " (", err, " ",
                name ? name : "?", ")");
}

template <class F>
void resolve(void* handle, const Runtime& r, const char* name, F* out, bool required = true) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr && required) {
    throw Error(strCat("braid: ", r.soname, " has no ", name,
                       " (braid needs the CUDA 12 or 13 runtime)"));
  }
  *out = reinterpret_cast<F>(sym);
}

std::unique_ptr<Runtime> load() {
  auto r = std::make_unique<Runtime>();
  void* h = openRuntime(&r->soname);
  Functions& f = r->f;
  resolve(h, *r, "cudaGetDeviceCount", &f.getDeviceCount);
  resolve(h, *r, "cudaGetDevice", &f.getDevice);
  resolve(h, *r, "cudaSetDevice", &f.setDevice);
  // CUDA 12 exports the old cudaGetDeviceProperties (its CUDA 11 struct) and
  // cudaGetDeviceProperties_v2; CUDA 13 has only the new one, unsuffixed.
  // Both begin with name and uuid (kPropUuidOffset).
  resolve(h, *r, "cudaGetDeviceProperties_v2", &f.getDeviceProperties, false);
  if (f.getDeviceProperties == nullptr) {
    resolve(h, *r, "cudaGetDeviceProperties", &f.getDeviceProperties);
  }
  resolve(h, *r, "cudaDeviceGetAttribute", &f.deviceGetAttribute);
  resolve(h, *r, "cudaRuntimeGetVersion", &f.runtimeGetVersion);
  resolve(h, *r, "cudaDriverGetVersion", &f.driverGetVersion);
  resolve(h, *r, "cudaGetErrorString", &f.getErrorString);
  resolve(h, *r, "cudaGetErrorName", &f.getErrorName);
  resolve(h, *r, "cudaGetLastError", &f.getLastError);
  resolve(h, *r, "cudaStreamCreateWithFlags", &f.streamCreateWithFlags);
  resolve(h, *r, "cudaStreamDestroy", &f.streamDestroy);
  resolve(h, *r, "cudaStreamSynchronize", &f.streamSynchronize);
  resolve(h, *r, "cudaStreamQuery", &f.streamQuery);
  resolve(h, *r, "cudaEventCreateWithFlags", &f.eventCreateWithFlags);
  resolve(h, *r, "cudaIpcGetMemHandle", &f.ipcGetMemHandle);
  resolve(h, *r, "cudaIpcOpenMemHandle", &f.ipcOpenMemHandle);
  resolve(h, *r, "cudaIpcCloseMemHandle", &f.ipcCloseMemHandle);
  resolve(h, *r, "cudaIpcGetEventHandle", &f.ipcGetEventHandle);
  resolve(h, *r, "cudaIpcOpenEventHandle", &f.ipcOpenEventHandle);
  resolve(h, *r, "cudaEventDestroy", &f.eventDestroy);
  resolve(h, *r, "cudaEventRecord", &f.eventRecord);
  resolve(h, *r, "cudaStreamWaitEvent", &f.streamWaitEvent);
  resolve(h, *r, "cudaEventQuery", &f.eventQuery);
  resolve(h, *r, "cudaEventSynchronize", &f.eventSynchronize);
  resolve(h, *r, "cudaMemcpyAsync", &f.memcpyAsync);
  resolve(h, *r, "cudaHostAlloc", &f.hostAlloc);
  resolve(h, *r, "cudaFreeHost", &f.freeHost);
  resolve(h, *r, "cudaMalloc", &f.malloc);
  resolve(h, *r, "cudaFree", &f.free);
  resolve(h, *r, "cudaLaunchHostFunc", &f.launchHostFunc);
  resolve(h, *r, "cudaLaunchKernel", &f.launchKernel);
  resolve(h, *r, "cudaFuncGetAttributes", &f.funcGetAttributes);
  resolve(h, *r, "cudaStreamGetDevice", &f.streamGetDevice, false);
  resolve(h, *r, "cudaLibraryLoadData", &f.libraryLoadData, false);
  resolve(h, *r, "cudaLibraryGetKernel", &f.libraryGetKernel, false);
  resolve(h, *r, "cudaStreamIsCapturing", &f.streamIsCapturing, false);
  resolve(h, *r, "cudaThreadExchangeStreamCaptureMode", &f.threadExchangeStreamCaptureMode, false);
  // The driver's primary-context query (DeviceGuard in cuda_runtime.cc). The
  // runtime has loaded libcuda.so.1 by the time it reports a device; without
  // it, guards always restore the previous device.
  dlerror();
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    r->cuDeviceGet = reinterpret_cast<decltype(r->cuDeviceGet)>(dlsym(driver, "cuDeviceGet"));
    r->cuDevicePrimaryCtxGetState = reinterpret_cast<decltype(r->cuDevicePrimaryCtxGetState)>(
        dlsym(driver, "cuDevicePrimaryCtxGetState"));
  }
  // Not fail(): runtime() is still being loaded (and holds its lock).
  const Status err = f.runtimeGetVersion(&r->version);
  if (err != kSuccess) throw Error(message(f, err, "cudaRuntimeGetVersion"));
  return r;
}

}  // namespace

const Runtime& runtime() {
  // Loaded once; a failure is remembered and thrown again, so that every
  // caller sees the same reason (dlopen failures do not heal).
  static std::mutex mu;
  static Runtime* loaded = nullptr;  // never freed: Note [Loading the CUDA runtime]
  static std::string failure;
  std::lock_guard<std::mutex> lk(mu);
  if (loaded != nullptr) return *loaded;
  if (!failure.empty()) throw Error(failure);
  try {
    loaded = load().release();
  } catch (const Error& e) {
    failure = e.what();
    throw;
  }
  return *loaded;
}

bool primaryContextMayExist(const Runtime& r, int device) {
  if (r.cuDeviceGet == nullptr || r.cuDevicePrimaryCtxGetState == nullptr) return true;
  int dev = 0;
  unsigned flags = 0;
  int active = 0;
  if (r.cuDeviceGet(&dev, device) != 0) return true;
  if (r.cuDevicePrimaryCtxGetState(dev, &flags, &active) != 0) return true;
  return active != 0;
}

void fail(Status err, const std::string& call) {
  // runtime() is loaded whenever there is an error code to explain.
  const Functions& f = runtime().f;
  f.getLastError();
  throw Error(message(f, err, call));
}

}  // namespace rt
}  // namespace cuda
}  // namespace braid
