// The CUDA runtime functions braid calls, resolved with dlsym from the
// libcudart that torch loaded (Note [Loading the CUDA runtime] in cudart.cc).
// No CUDA header is included: the few types and values are declared here and
// were checked against CUDA 13.0's driver_types.h and cuda_runtime_api.h
// (they are ABI, unchanged since CUDA 10).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/error.h"

namespace braid {
namespace cuda {
namespace rt {

using Status = int;  // cudaError_t
using StreamT = void*;
using EventT = void*;
using LibraryT = void*;  // cudaLibrary_t
using KernelT = void*;   // cudaKernel_t

constexpr Status kSuccess = 0;          // cudaSuccess
constexpr Status kErrorNotReady = 600;  // cudaErrorNotReady
constexpr int kMemcpyDefault = 4;      // cudaMemcpyDefault
constexpr unsigned kStreamNonBlocking = 0x01;     // cudaStreamNonBlocking
constexpr unsigned kEventDisableTiming = 0x02;    // cudaEventDisableTiming
constexpr unsigned kHostAllocPortable = 0x01;     // cudaHostAllocPortable
constexpr unsigned kEventWaitDefault = 0x00;      // cudaEventWaitDefault
constexpr unsigned kEventInterprocess = 0x04;     // cudaEventInterprocess
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x01;  // cudaIpcMemLazyEnablePeerAccess
constexpr int kDevAttrComputeCapabilityMajor = 75;       // cudaDevAttrComputeCapabilityMajor
constexpr int kDevAttrComputeCapabilityMinor = 76;       // cudaDevAttrComputeCapabilityMinor
// cudaFuncAttributes grew across versions (CUDA 13: 24 ints and reserved
// space); it is read into a buffer far larger than any of them.
constexpr size_t kFuncAttributesBufferBytes = 4096;

// cudaIpcMemHandle_t and cudaIpcEventHandle_t: 64 opaque bytes, passed by
// value to the Open calls.
struct IpcHandle {
  char reserved[64];
};
// cudaDeviceProp begins with char name[256], then cudaUUID_t uuid (16
// bytes), in every runtime since CUDA 10. The struct itself grew across
// versions, so it is read into a buffer far larger than any of them.
constexpr size_t kPropUuidOffset = 256;
constexpr size_t kPropBufferBytes = 16384;

struct Dim3 {  // dim3: three unsigned ints, passed by value
  unsigned int x, y, z;
};

struct Functions {
  Status (*getDeviceCount)(int*);
  Status (*getDevice)(int*);
  Status (*setDevice)(int);
  Status (*getDeviceProperties)(void* prop, int device);  // _v2 on CUDA 12
  Status (*deviceGetAttribute)(int* value, int attr, int device);
  Status (*runtimeGetVersion)(int*);
  Status (*driverGetVersion)(int*);
  const char* (*getErrorString)(Status);
  const char* (*getErrorName)(Status);
  Status (*getLastError)();
  Status (*streamCreateWithFlags)(StreamT*, unsigned);
  Status (*streamDestroy)(StreamT);
  Status (*streamSynchronize)(StreamT);
  Status (*streamQuery)(StreamT);
  Status (*eventCreateWithFlags)(EventT*, unsigned);
  Status (*eventDestroy)(EventT);
  Status (*eventRecord)(EventT, StreamT);
  Status (*streamWaitEvent)(StreamT, EventT, unsigned);
  Status (*eventQuery)(EventT);
  Status (*eventSynchronize)(EventT);
  Status (*memcpyAsync)(void*, const void*, size_t, int kind, StreamT);
  Status (*hostAlloc)(void**, size_t, unsigned);
  Status (*freeHost)(void*);
  Status (*malloc)(void**, size_t);
  Status (*free)(void*);
  Status (*launchHostFunc)(StreamT, void (*)(void*), void*);
  Status (*launchKernel)(const void*, Dim3, Dim3, void**, size_t, StreamT);
  // Takes a cudaKernel_t too, and loads it into the current device's context.
  Status (*funcGetAttributes)(void* attr, const void* func);
  Status (*ipcGetMemHandle)(IpcHandle*, void*);
  Status (*ipcOpenMemHandle)(void**, IpcHandle, unsigned);
  Status (*ipcCloseMemHandle)(void*);
  Status (*ipcGetEventHandle)(IpcHandle*, EventT);
  Status (*ipcOpenEventHandle)(EventT*, IpcHandle);
  // Optional: null when this runtime lacks them (checked where used).
  Status (*streamGetDevice)(StreamT, int*);  // CUDA 12.8 and later
  Status (*libraryLoadData)(LibraryT*, const void* code, void* jitOptions, void** jitValues,
                           unsigned numJit, void* libraryOptions, void** libraryValues,
                           unsigned numLibrary);             // CUDA 12.0
  Status (*libraryGetKernel)(KernelT*, LibraryT, const char*);  // CUDA 12.0
  // Graph capture (Note [Graph capture] in device_api.h); every runtime
  // braid loads has them (CUDA 10.1), but a table without them (a test's)
  // means "never capturing" and "no modes".
  Status (*streamIsCapturing)(StreamT, int* status);  // cudaStreamCaptureStatus
  Status (*threadExchangeStreamCaptureMode)(int* mode);
};

struct Runtime {
  Functions f;
  std::string soname;  // "libcudart.so.13", or the path it was loaded from
  int version = 0;     // cudaRuntimeGetVersion: 13000 is 13.0
  // From libcuda.so.1 when the runtime has loaded it (null otherwise):
  // CUresult cuDeviceGet(CUdevice*, int), cuDevicePrimaryCtxGetState(CUdevice,
  // unsigned* flags, int* active); CUresult and CUdevice are ints.
  int (*cuDeviceGet)(int*, int) = nullptr;
  int (*cuDevicePrimaryCtxGetState)(int, unsigned*, int*) = nullptr;
};

// false only when the driver says `device`'s primary context does not exist:
// then making it current would create one (and take memory on that GPU).
// true when it exists or the driver cannot be asked.
bool primaryContextMayExist(const Runtime& r, int device);

}  // namespace rt

class DeviceApi;
// The DeviceApi over `r`'s functions, as cudaRuntime() is over runtime()'s
// (tests drive it with a fake table). `r` must outlive it.
std::unique_ptr<DeviceApi> cudaRuntimeOver(const rt::Runtime& r);

namespace rt {

// The runtime, loaded at first call; throws braid::Error saying why it could
// not be (later calls throw the same error again).
const Runtime& runtime();

// Throws braid::Error("braid: <call> failed: <message> (<code> <name>)").
// `call` names the function and its arguments. Also clears the runtime's
// last error, which torch checks after its own launches, so that it does not
// blame torch's next kernel for braid's failure.
[[noreturn]] void fail(Status err, const std::string& call);

// if (err != cudaSuccess) fail(err, strCat(...)): the message is only built
// on failure.
#define BRAID_CUDART(expr, ...)                                                     \
  do {                                                                             \
    const ::braid::cuda::rt::Status braid_err_ = (expr);                            \
    if (braid_err_ != ::braid::cuda::rt::kSuccess) {                               \
      ::braid::cuda::rt::fail(braid_err_, ::braid::strCat(__VA_ARGS__));          \
    }                                                                              \
  } while (0)

}  // namespace rt
}  // namespace cuda
}  // namespace braid
