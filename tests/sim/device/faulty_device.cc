// Note [Injected device failures] in faulty_device.h.
#include "sim/device/faulty_device.h"

#include "common/error.h"

namespace braid {
namespace cuda {

void FaultyDevice::inject(DeviceFault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(Armed{std::move(fault), 0});
}

void FaultyDevice::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
  stuck_ = false;
}

int FaultyDevice::calls(const std::string& call) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(call);
  return it == calls_.end() ? 0 : it->second;
}

int FaultyDevice::failures() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(failed_.size());
}

std::vector<std::string> FaultyDevice::failedCalls() {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void FaultyDevice::check(const char* call, const std::string& args) {
  const DeviceFault* hit = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[call];
    if (stuck_) {
      hit = &sticky_;
    } else {
      for (Armed& a : faults_) {
        if (a.fault.call != "*" && a.fault.call != call) continue;
        ++a.seen;
        if (a.seen == a.fault.nth || (a.fault.every && a.seen > a.fault.nth)) {
          hit = &a.fault;
          break;
        }
      }
      if (hit != nullptr && hit->sticky) {
        stuck_ = true;
        sticky_ = *hit;
        hit = &sticky_;
      }
    }
    if (hit == nullptr) return;
    failed_.push_back(call);
    // The text cudaRuntime() gives the same CUDA error (rt::fail), marked injected.
    throw Error(strCat("braid: ", call, args, " failed: ", hit->message, " (", hit->code, " ",
                       hit->errorName, ") [injected]"));
  }
}

namespace {
std::string ptr(const void* p) { return strCat("(", p, ")"); }
std::string dev(int d) { return strCat("(device=", d, ")"); }
}  // namespace

int FaultyDevice::deviceCount() {
  check("deviceCount", "");
  return inner_.deviceCount();
}
int FaultyDevice::getDevice() {
  check("getDevice", "");
  return inner_.getDevice();
}
void FaultyDevice::setDevice(int device) {
  check("setDevice", dev(device));
  inner_.setDevice(device);
}
std::string FaultyDevice::deviceUuid(int device) {
  check("deviceUuid", dev(device));
  return inner_.deviceUuid(device);
}
bool FaultyDevice::primaryContextActive(int device) {
  check("primaryContextActive", dev(device));
  return inner_.primaryContextActive(device);
}
int FaultyDevice::computeCapability(int device) {
  check("computeCapability", dev(device));
  return inner_.computeCapability(device);
}
std::string FaultyDevice::kernelLoadError(int device) {
  check("kernelLoadError", dev(device));
  return inner_.kernelLoadError(device);
}
Stream FaultyDevice::streamCreate(int device) {
  check("streamCreate", dev(device));
  return inner_.streamCreate(device);
}
void FaultyDevice::streamDestroy(Stream s) {
  check("streamDestroy", ptr(s));
  inner_.streamDestroy(s);
}
void FaultyDevice::streamSynchronize(Stream s) {
  check("streamSynchronize", ptr(s));
  inner_.streamSynchronize(s);
}
bool FaultyDevice::streamQuery(Stream s) {
  check("streamQuery", ptr(s));
  return inner_.streamQuery(s);
}
Event FaultyDevice::eventCreate(int device) {
  check("eventCreate", dev(device));
  return inner_.eventCreate(device);
}
void FaultyDevice::eventDestroy(Event e) {
  check("eventDestroy", ptr(e));
  inner_.eventDestroy(e);
}
void FaultyDevice::eventRecord(Event e, Stream s) {
  check("eventRecord", ptr(e));
  inner_.eventRecord(e, s);
}
void FaultyDevice::streamWaitEvent(Stream s, Event e) {
  check("streamWaitEvent", ptr(s));
  inner_.streamWaitEvent(s, e);
}
bool FaultyDevice::eventQuery(Event e) {
  check("eventQuery", ptr(e));
  return inner_.eventQuery(e);
}
void FaultyDevice::eventSynchronize(Event e) {
  check("eventSynchronize", ptr(e));
  inner_.eventSynchronize(e);
}
void FaultyDevice::memcpyAsync(void* dst, const void* src, size_t bytes, Stream s) {
  check("memcpyAsync", strCat("(", bytes, " bytes)"));
  inner_.memcpyAsync(dst, src, bytes, s);
}
void* FaultyDevice::hostAlloc(size_t bytes) {
  check("hostAlloc", strCat("(", bytes, " bytes)"));
  return inner_.hostAlloc(bytes);
}
void FaultyDevice::hostFree(void* p) {
  check("hostFree", ptr(p));
  inner_.hostFree(p);
}
void* FaultyDevice::deviceAlloc(int device, size_t bytes) {
  check("deviceAlloc", dev(device));
  return inner_.deviceAlloc(device, bytes);
}
void FaultyDevice::deviceFree(void* p) {
  check("deviceFree", ptr(p));
  inner_.deviceFree(p);
}
void FaultyDevice::reduceAsync(DataType type, ReduceOp op, void* dst, const void* src,
                               size_t count, Stream s) {
  check("reduceAsync", strCat("(", count, " elements)"));
  inner_.reduceAsync(type, op, dst, src, count, s);
}
void FaultyDevice::reduceMultiAsync(DataType type, ReduceOp op, void* dst,
                                    const void* const* srcs, int n, double divisor, size_t count,
                                    Stream s) {
  check("reduceMultiAsync", strCat("(", count, " elements)"));
  inner_.reduceMultiAsync(type, op, dst, srcs, n, divisor, count, s);
}
void FaultyDevice::reduceMultiAsyncOn(int device, DataType type, ReduceOp op, void* dst,
                                      const void* const* srcs, int n, double divisor,
                                      size_t count, Stream s) {
  check("reduceMultiAsync", strCat("(device=", device, ", ", count, " elements)"));
  inner_.reduceMultiAsyncOn(device, type, op, dst, srcs, n, divisor, count, s);
}
void* FaultyDevice::deviceAllocShareable(int device, size_t bytes) {
  check("deviceAllocShareable", dev(device));
  return inner_.deviceAllocShareable(device, bytes);
}
std::string FaultyDevice::ipcMemHandle(void* p) {
  check("ipcMemHandle", ptr(p));
  return inner_.ipcMemHandle(p);
}
void* FaultyDevice::ipcOpenMem(const std::string& handle) {
  check("ipcOpenMem", "");
  return inner_.ipcOpenMem(handle);
}
void FaultyDevice::ipcCloseMem(void* p) {
  check("ipcCloseMem", ptr(p));
  inner_.ipcCloseMem(p);
}
Event FaultyDevice::eventCreateShareable(int device) {
  check("eventCreateShareable", dev(device));
  return inner_.eventCreateShareable(device);
}
std::string FaultyDevice::ipcEventHandle(Event e) {
  check("ipcEventHandle", ptr(e));
  return inner_.ipcEventHandle(e);
}
Event FaultyDevice::ipcOpenEvent(const std::string& handle) {
  check("ipcOpenEvent", "");
  return inner_.ipcOpenEvent(handle);
}

int64_t FaultyDevice::processId() { return inner_.processId(); }

}  // namespace cuda
}  // namespace braid
