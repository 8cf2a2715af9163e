// ncclLibrary(): NcclApi over a dlopen'ed libnccl.so.2 (Note [Loading NCCL]
// in nccl_api.h).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "common/error.h"
#include "common/settings.h"
#include "cuda/nccl/nccl_api.h"

namespace braid {
namespace cuda {
namespace {

BRAID_SETTING_STRING(
    kNcclLibrary, "BRAID_NCCL_LIBRARY", "",
    "Path of the libnccl.so.2 to load for CUDA tensors; empty: the copy torch "
    "loaded, else libnccl.so.2 from the loader's search path or the CUDA toolkit.");

// ncclConfig_t as NCCL 2.28 lays it out (ncclConfig_v22800). NCCL copies
// min(size, its own sizeof) bytes and reads fields by the version they came
// with, so an older 2.14+ library takes the prefix it knows and a newer one
// fills what it added with its defaults.
struct NcclConfig {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
};
constexpr int kUndefInt = -2147483647 - 1;  // NCCL_CONFIG_UNDEF_INT (INT_MIN)

NcclConfig configInitializer() {  // NCCL_CONFIG_INITIALIZER
  NcclConfig c;
  c.size = sizeof(NcclConfig);
  c.magic = 0xcafebeef;
  c.version = 22809;  // NCCL_VERSION(2, 28, 9): the layout above
  c.blocking = c.cgaClusterSize = c.minCTAs = c.maxCTAs = kUndefInt;
  c.netName = nullptr;
  c.splitShare = c.trafficClass = kUndefInt;
  c.commName = nullptr;
  c.collnetEnable = c.CTAPolicy = c.shrinkShare = c.nvlsCTAs = kUndefInt;
  c.nChannelsPerNetPeer = c.nvlinkCentricSched = kUndefInt;
  return c;
}

// The C prototypes (ncclResult_t and the enums are ints; handles are pointers).
using Stream_ = void*;
struct Fns {
  int (*GetVersion)(int*);
  const char* (*GetErrorString)(int);
  const char* (*GetLastError)(NcclComm);
  int (*GetUniqueId)(NcclUniqueId*);
  int (*CommInitRankConfig)(NcclComm*, int, NcclUniqueId, int, NcclConfig*);
  int (*CommDestroy)(NcclComm);
  int (*CommAbort)(NcclComm);
  int (*CommGetAsyncError)(NcclComm, int*);
  int (*CommFinalize)(NcclComm);  // optional: NCCL 2.14 and later
  int (*GroupStart)();
  int (*GroupEnd)();
  int (*AllReduce)(const void*, void*, size_t, int, int, NcclComm, Stream_);
  int (*Broadcast)(const void*, void*, size_t, int, int, NcclComm, Stream_);
  int (*Reduce)(const void*, void*, size_t, int, int, int, NcclComm, Stream_);
  int (*AllGather)(const void*, void*, size_t, int, NcclComm, Stream_);
  int (*ReduceScatter)(const void*, void*, size_t, int, int, NcclComm, Stream_);
  int (*Send)(const void*, size_t, int, int, NcclComm, Stream_);
  int (*Recv)(void*, size_t, int, int, NcclComm, Stream_);
  int (*RedOpCreatePreMulSum)(int*, void*, int, int, NcclComm);
  int (*RedOpDestroy)(int, NcclComm);
};

class LoadedNccl : public NcclApi {
 public:
  LoadedNccl(void* handle, std::string how, const Fns& f, int version)
      : handle_(handle), how_(std::move(how)), f_(f), version_(version) {}

  std::string name() const override {
    return strCat("NCCL ", version_ / 10000, ".", (version_ / 100) % 100, ".", version_ % 100, " (",
                  how_, ")");
  }
  bool simulated() const override { return false; }
  int version() override { return version_; }
  const char* getErrorString(NcclResult r) override {
    const char* s = f_.GetErrorString(r);
    return s ? s : ncclResultName(r);
  }
  std::string lastError(NcclComm comm) override {
    const char* s = f_.GetLastError(comm);
    return s ? s : "";
  }
  NcclResult getUniqueId(NcclUniqueId* id) override { return R(f_.GetUniqueId(id)); }
  NcclResult commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          bool blocking) override {
    NcclConfig c = configInitializer();
    c.blocking = blocking ? 1 : 0;
    return R(f_.CommInitRankConfig(comm, nranks, id, rank, &c));
  }
  NcclResult commDestroy(NcclComm comm) override { return R(f_.CommDestroy(comm)); }
  NcclResult commAbort(NcclComm comm) override { return R(f_.CommAbort(comm)); }
  bool hasCommFinalize() override { return f_.CommFinalize != nullptr; }
  NcclResult commFinalize(NcclComm comm) override {
    return f_.CommFinalize ? R(f_.CommFinalize(comm)) : kNcclInvalidUsage;
  }
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* err) override {
    int e = kNcclSuccess;
    NcclResult r = R(f_.CommGetAsyncError(comm, &e));
    *err = R(e);
    return r;
  }
  NcclResult groupStart() override { return R(f_.GroupStart()); }
  NcclResult groupEnd() override { return R(f_.GroupEnd()); }
  NcclResult allReduce(const void* s, void* r, size_t n, NcclDataType t, NcclRedOp op, NcclComm c,
                       Stream st) override {
    return R(f_.AllReduce(s, r, n, t, op, c, st));
  }
  NcclResult broadcast(const void* s, void* r, size_t n, NcclDataType t, int root, NcclComm c,
                       Stream st) override {
    return R(f_.Broadcast(s, r, n, t, root, c, st));
  }
  NcclResult reduce(const void* s, void* r, size_t n, NcclDataType t, NcclRedOp op, int root,
                    NcclComm c, Stream st) override {
    return R(f_.Reduce(s, r, n, t, op, root, c, st));
  }
  NcclResult allGather(const void* s, void* r, size_t n, NcclDataType t, NcclComm c,
                       Stream st) override {
    return R(f_.AllGather(s, r, n, t, c, st));
  }
  NcclResult reduceScatter(const void* s, void* r, size_t n, NcclDataType t, NcclRedOp op,
                           NcclComm c, Stream st) override {
    return R(f_.ReduceScatter(s, r, n, t, op, c, st));
  }
  NcclResult send(const void* b, size_t n, NcclDataType t, int peer, NcclComm c,
                  Stream st) override {
    return R(f_.Send(b, n, t, peer, c, st));
  }
  NcclResult recv(void* b, size_t n, NcclDataType t, int peer, NcclComm c, Stream st) override {
    return R(f_.Recv(b, n, t, peer, c, st));
  }
  NcclResult redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType t,
                                  NcclComm c) override {
    // ncclScalarHostImmediate = 1: NCCL reads the value before returning.
    return R(f_.RedOpCreatePreMulSum(op, const_cast<void*>(scalar), t, 1, c));
  }
  NcclResult redOpDestroy(NcclRedOp op, NcclComm c) override { return R(f_.RedOpDestroy(op, c)); }

 private:
  static NcclResult R(int r) { return static_cast<NcclResult>(r); }
  void* handle_;  // never closed: NCCL's threads and torch's copy outlive any owner
  const std::string how_;
  const Fns f_;
  const int version_;
};

template <typename F>
void resolve(void* h, const char* sym, F* out, const std::string& lib) {
  void* p = dlsym(h, sym);
  if (!p) {
    throw Error(strCat("braid nccl: ", lib, " has no ", sym,
                       " (braid needs NCCL 2.14 or newer for CUDA tensors)"));
  }
  *out = reinterpret_cast<F>(p);
}

std::string libraryPath(void* h, void* sym) {
  Dl_info info;
  if (sym && dladdr(sym, &info) && info.dli_fname) return info.dli_fname;
  return "?";
}

NcclApi* load() {
  const std::string env = kNcclLibrary.get();
  void* h = nullptr;
  std::string how;
  if (!env.empty()) {
    h = dlopen(env.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      throw Error(strCat("braid nccl: cannot load BRAID_NCCL_LIBRARY='", env,
                         "': ", e ? e : "dlopen failed"));
    }
    how = "BRAID_NCCL_LIBRARY";
  } else if ((h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD))) {
    how = "already loaded by the process";
  } else if ((h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL))) {
    how = "loaded by braid";
  } else {
    const char* e = dlerror();
    const std::string first = e ? e : "dlopen failed";
    // The toolkit's copy, which the loader does not search by default.
    const char* home = std::getenv("CUDA_HOME");
    for (std::string dir : {std::string(home ? home : ""), std::string("/usr/local/cuda")}) {
      if (dir.empty() || h) continue;
      h = dlopen((dir + "/lib64/libnccl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
      throw Error(strCat("braid nccl: cannot load libnccl.so.2 (", first,
                         "; nor from $CUDA_HOME/lib64 or /usr/local/cuda/lib64), and torch did "
                         "not load one. Install NCCL or set BRAID_NCCL_LIBRARY to the path of "
                         "libnccl.so.2"));
    }
    how = "loaded by braid from the CUDA toolkit";
  }
  Fns f{};
  std::string lib = "libnccl.so.2";
  resolve(h, "ncclGetVersion", &f.GetVersion, lib);
  lib = libraryPath(h, reinterpret_cast<void*>(f.GetVersion));
  int version = 0;
  if (f.GetVersion(&version) != kNcclSuccess) version = 0;
  lib = strCat(lib, " (version code ", version, ")");
  resolve(h, "ncclGetErrorString", &f.GetErrorString, lib);
  resolve(h, "ncclGetLastError", &f.GetLastError, lib);
  resolve(h, "ncclGetUniqueId", &f.GetUniqueId, lib);
  resolve(h, "ncclCommInitRankConfig", &f.CommInitRankConfig, lib);
  resolve(h, "ncclCommDestroy", &f.CommDestroy, lib);
  resolve(h, "ncclCommAbort", &f.CommAbort, lib);
  resolve(h, "ncclCommGetAsyncError", &f.CommGetAsyncError, lib);
  // Optional: without it a communicator is destroyed without finalizing.
  f.CommFinalize = reinterpret_cast<int (*)(NcclComm)>(dlsym(h, "ncclCommFinalize"));
  resolve(h, "ncclGroupStart", &f.GroupStart, lib);
  resolve(h, "ncclGroupEnd", &f.GroupEnd, lib);
  resolve(h, "ncclAllReduce", &f.AllReduce, lib);
  resolve(h, "ncclBroadcast", &f.Broadcast, lib);
  resolve(h, "ncclReduce", &f.Reduce, lib);
  resolve(h, "ncclAllGather", &f.AllGather, lib);
  resolve(h, "ncclReduceScatter", &f.ReduceScatter, lib);
  resolve(h, "ncclSend", &f.Send, lib);
  resolve(h, "ncclRecv", &f.Recv, lib);
  resolve(h, "ncclRedOpCreatePreMulSum", &f.RedOpCreatePreMulSum, lib);
  resolve(h, "ncclRedOpDestroy", &f.RedOpDestroy, lib);
  return new LoadedNccl(h, strCat(libraryPath(h, reinterpret_cast<void*>(f.GetVersion)), ", ", how),
                        f, version);
}

}  // namespace

NcclApi& ncclLibrary() {
  // Loaded once; a failure is remembered, so every caller gets the same text.
  static std::once_flag once;
  static NcclApi* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = load();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!api) throw Error(error);
  return *api;
}

}  // namespace cuda
}  // namespace braid
