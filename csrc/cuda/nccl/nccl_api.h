// The NCCL seam: every NCCL call braid makes goes through NcclApi, as every
// CUDA runtime call goes through DeviceApi (Note [The device seam]).
// Torch-free, and free of nccl.h: NCCL's ABI values are declared here.
//
// Note [Loading NCCL]
// braid never links NCCL. ncclLibrary() dlopens libnccl.so.2 at first use:
//   1. BRAID_NCCL_LIBRARY, a path, when set (a wheel's nvidia/nccl/lib copy
//      when no torch loaded one, or a build to test);
//   2. the copy already in the process (RTLD_NOLOAD by soname): the one torch
//      loaded, so that braid and torch share one NCCL (one set of globals,
//      one NCCL_* environment parse, one version);
//   3. libnccl.so.2 on the loader's search path, then in $CUDA_HOME/lib64 and
//      /usr/local/cuda/lib64 (a C++ program without torch, on a machine
//      whose toolkit is not in ld.so.conf).
// Then it resolves every function below by name; a missing one (an NCCL
// older than 2.14, which has no ncclCommInitRankConfig) is an Error naming
// the library, its path, its version and the symbol. Loading torch_braid on a
// machine without NCCL touches none of this.
//
// The values below were checked against NCCL 2.28.9's nccl.h
// (/usr/local/cuda-13.0/include/nccl.h); they are ABI and do not change
// between releases (new types and ops are only appended).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"
#include "cuda/device_api.h"

namespace braid {
namespace cuda {

// ncclResult_t
enum NcclResult : int {
  kNcclSuccess = 0,
  kNcclUnhandledCudaError = 1,
  kNcclSystemError = 2,
  kNcclInternalError = 3,
  kNcclInvalidArgument = 4,
  kNcclInvalidUsage = 5,
  kNcclRemoteError = 6,
  kNcclInProgress = 7,
};

// ncclDataType_t (those braid uses)
enum NcclDataType : int {
  kNcclInt8 = 0,
  kNcclUint8 = 1,
  kNcclInt32 = 2,
  kNcclUint32 = 3,
  kNcclInt64 = 4,
  kNcclUint64 = 5,
  kNcclFloat16 = 6,
  kNcclFloat32 = 7,
  kNcclFloat64 = 8,
  kNcclBfloat16 = 9,
};

// ncclRedOp_t: the built-in ones; ncclRedOpCreatePreMulSum returns others
// (ncclNumOps and up), valid on the communicator that made them.
using NcclRedOp = int;
constexpr NcclRedOp kNcclSum = 0;
constexpr NcclRedOp kNcclProd = 1;
constexpr NcclRedOp kNcclMax = 2;
constexpr NcclRedOp kNcclMin = 3;
constexpr NcclRedOp kNcclAvg = 4;

constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};
using NcclComm = void*;  // ncclComm_t

// "ncclRemoteError", for messages; "ncclResult 42" for unknown values.
const char* ncclResultName(NcclResult r);

// A thin mirror of NCCL's C API, one virtual per function braid uses. The
// calls return NCCL's result code and never throw (except where noted);
// nccl_executor.cc turns codes into braid errors. A Stream is the stream
// handle of the DeviceApi the caller pairs this NcclApi with: a cudaStream_t
// for ncclLibrary() with cudaRuntime(), a simulated stream for
// SimulatedNccl with simulatedDevice().
class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // "NCCL 2.28.9 (libnccl.so.2, loaded by the process)" or "simulated NCCL".
  virtual std::string name() const = 0;
  virtual bool simulated() const = 0;
  // NCCL_VERSION_CODE of the library (22809 for 2.28.9).
  virtual int version() = 0;
  virtual const char* getErrorString(NcclResult r) = 0;
  // ncclGetLastError: the last error's text for `comm` (may be ""; never null).
  virtual std::string lastError(NcclComm comm) = 0;

  virtual NcclResult getUniqueId(NcclUniqueId* id) = 0;
  // ncclCommInitRankConfig with config.blocking = blocking ? 1 : 0; the
  // calling thread's current device is the communicator's. A non-blocking
  // init returns kNcclInProgress (or success) with *comm set at once; it is
  // done when commGetAsyncError stops answering kNcclInProgress, and every
  // later call on the communicator may answer kNcclInProgress the same way.
  virtual NcclResult commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                                  bool blocking) = 0;
  virtual NcclResult commDestroy(NcclComm comm) = 0;
  // Ends every operation of `comm` (kernels return, whatever their peers do)
  // and frees it.
  virtual NcclResult commAbort(NcclComm comm) = 0;
  virtual NcclResult commGetAsyncError(NcclComm comm, NcclResult* asyncError) = 0;
  // ncclCommFinalize (NCCL 2.14 and later; hasCommFinalize says whether this
  // NCCL has it): flushes the communicator's work and ends it with its peers,
  // so that commDestroy then frees only local resources. A non-blocking
  // communicator answers kNcclInProgress until commGetAsyncError stops
  // answering it (Note [Tearing a communicator down] in nccl_executor.cc).
  virtual bool hasCommFinalize() { return false; }
  virtual NcclResult commFinalize(NcclComm comm) {
    (void)comm;
    return kNcclInvalidUsage;
  }

  // The calling thread's group (NCCL's group state is per thread).
  virtual NcclResult groupStart() = 0;
  virtual NcclResult groupEnd() = 0;

  virtual NcclResult allReduce(const void* send, void* recv, size_t count, NcclDataType type,
                               NcclRedOp op, NcclComm comm, Stream stream) = 0;
  virtual NcclResult broadcast(const void* send, void* recv, size_t count, NcclDataType type,
                               int root, NcclComm comm, Stream stream) = 0;
  virtual NcclResult reduce(const void* send, void* recv, size_t count, NcclDataType type,
                            NcclRedOp op, int root, NcclComm comm, Stream stream) = 0;
  // recv holds nranks blocks of sendCount elements, rank order.
  virtual NcclResult allGather(const void* send, void* recv, size_t sendCount, NcclDataType type,
                               NcclComm comm, Stream stream) = 0;
  // send holds nranks blocks of recvCount elements; rank r gets block r reduced.
  virtual NcclResult reduceScatter(const void* send, void* recv, size_t recvCount,
                                   NcclDataType type, NcclRedOp op, NcclComm comm,
                                   Stream stream) = 0;
  virtual NcclResult send(const void* buf, size_t count, NcclDataType type, int peer, NcclComm comm,
                          Stream stream) = 0;
  virtual NcclResult recv(void* buf, size_t count, NcclDataType type, int peer, NcclComm comm,
                          Stream stream) = 0;

  // ncclRedOpCreatePreMulSum with ncclScalarHostImmediate: `scalar` points
  // to one value of `type`, read before the call returns.
  virtual NcclResult redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType type,
                                          NcclComm comm) = 0;
  virtual NcclResult redOpDestroy(NcclRedOp op, NcclComm comm) = 0;

  // Note [Collectives NCCL lacks]
  // NCCL has no gather, scatter or alltoall (torch builds them from grouped
  // send/recv); braid runs them on the staged path (through host memory),
  // except where an NcclApi has them itself: braid's same-GPU collectives
  // (Note [Same-GPU collectives] in same_gpu.h) move them at device speed.
  // So they are optional here: supports() says which an implementation has
  // (the defaults: none, and the calls answer kNcclInvalidUsage), the
  // executor refuses an op its NcclApi lacks before it enqueues anything,
  // and the backend asks first (NcclExecutor::supports) and otherwise takes
  // the staged path. The answer depends only on the NcclApi, which the
  // executor choice makes the same kind on every rank (Note [Choosing a CUDA
  // executor]), so the ranks all take the same path.
  // NCCL's own collectives may be missing too: braid's hierarchical
  // collectives (Note [Hierarchical CUDA collectives] in multi_gpu.h) run only
  // allreduce and broadcast, and hasCore() says so (the default: all); the
  // executor and the backend treat a missing one as above (staged).
  enum class Extra { kGather, kScatter, kAllToAll };
  virtual bool supports(Extra) const { return false; }
  enum class Core { kReduce, kAllGather, kReduceScatter, kSendRecv };
  virtual bool hasCore(Core) const { return true; }
  // Likewise a reduction NCCL has but an implementation lacks for a type
  // (braid's same-GPU and hierarchical collectives: AVG of integers): the
  // backend asks NcclExecutor::supportsReduction and stages such ops.
  virtual bool reduces(NcclDataType, NcclRedOp) const { return true; }
  // `recvs`: the root's nranks outputs of `count` elements, rank order
  // (ignored elsewhere).
  virtual NcclResult gather(const void* /*send*/, void* const* /*recvs*/, size_t /*count*/,
                            NcclDataType, int /*root*/, NcclComm, Stream) {
    return kNcclInvalidUsage;
  }
  // `sends`: the root's nranks inputs of `count` elements, rank order
  // (ignored elsewhere); rank r receives sends[r].
  virtual NcclResult scatter(const void* const* /*sends*/, void* /*recv*/, size_t /*count*/,
                             NcclDataType, int /*root*/, NcclComm, Stream) {
    return kNcclInvalidUsage;
  }
  // Equal splits: send and recv hold nranks blocks of `count` elements;
  // block q of send goes to rank q, block q of recv comes from rank q.
  virtual NcclResult allToAll(const void* /*send*/, void* /*recv*/, size_t /*count*/,
                              NcclDataType, NcclComm, Stream) {
    return kNcclInvalidUsage;
  }

  // braid's own collectives (Note [Same-GPU collectives] in same_gpu.h) wait
  // on the host for their peers while they enqueue; this bounds that wait.
  // NCCL never waits there: the default ignores it.
  virtual void setTimeout(NcclComm, std::chrono::milliseconds) {}
};

// The real NCCL (Note [Loading NCCL]); throws braid::Error saying what could
// not be loaded. Loaded once per process; later calls return the same one
// (or throw the same error).
NcclApi& ncclLibrary();

// How braid's (DataType, ReduceOp) run on NCCL (Note [NCCL types and ops] in
// nccl_api.cc). `bytes` ops (broadcast, allgather, send/recv) move data only
// and accept every DataType.
struct NcclTypeOp {
  NcclDataType type;
  size_t count;    // elements of `type`: the caller's count, or its bytes
  NcclRedOp op;    // for reductions
  bool premulSum;  // op must be made with redOpCreatePreMulSum(factor)
};
// For an op that moves data only.
NcclTypeOp ncclBytesTypeFor(DataType type, size_t count);
// For a reduction. Throws braid::Error naming `opName`, `rank`, the dtype and
// the reduce op when NCCL cannot run the pair.
NcclTypeOp ncclReductionFor(DataType type, ReduceOp op, size_t count, const char* opName, int rank);
// Whether ncclReductionFor accepts the pair.
bool ncclSupports(DataType type, ReduceOp op);
// `factor` as one value of `type` (a float type) into `out` (8 bytes at
// least), for redOpCreatePreMulSum.
void ncclScalarOf(DataType type, double factor, void* out);

}  // namespace cuda
}  // namespace braid
