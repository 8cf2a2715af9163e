// NcclExecutor: a group's CUDA ops on NCCL, torch-free. The backend turns
// tensors into NcclOps (raw device pointers), records an event on the
// caller's stream, calls run(), and makes the caller's stream wait on the
// returned work's endEvent() in Work::synchronize/wait.
//
// Note [NCCL streams]
// - One communicator and one comm stream per (executor, device), made
//   lazily by the first op on that device: rank 0 makes the unique id and
//   publishes it through the group's Store under
//   <storePrefix>nccl/<n>/uid (n counts this executor's communicators, so
//   ranks agree on keys whatever device each uses); the others wait for it
//   with the group's timeout. Init is non-blocking (ncclConfig.blocking = 0)
//   and polled, so a rank that never joins is a TimeoutError and abort()
//   can end a pending init.
// - run(op): the comm stream waits on op.ready (the caller's event, recorded
//   by the backend on the caller's current stream after it wrote the
//   inputs), the NCCL call is enqueued on the comm stream, and an end event
//   is recorded there after it. The caller's stream must wait on endEvent()
//   before it reads the outputs or writes the inputs again; the CPU blocks
//   only in NcclWork::wait(). Ops of one executor are enqueued one at a time
//   (NCCL requires one thread per communicator at a time), so they run on the
//   device in the order of their run() calls, which must be the same on every
//   rank.
// - On a non-blocking communicator NCCL may answer kNcclInProgress and
//   enqueue the kernel later (while it connects lazily); run() polls
//   commGetAsyncError until the call is done before it records the end
//   event, else the event would be ordered before the kernel.
// - Tensor lifetime is the caller's: the buffers must stay allocated until
//   endEvent() has completed (the backend stashes the tensors on its Work,
//   or records them on stream() with the caching allocator).
// - Failure (Note [NCCL failures] in nccl_work.cc): an async error from
//   NCCL, an op past its deadline, or abort() fails every pending op, aborts
//   every communicator (ncclCommAbort: the kernels return, so the end events
//   complete and nothing that waits on them hangs), and makes every later
//   run() throw the first error. Nothing here blocks on the device without
//   a deadline.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"
#include "cuda/device_api.h"
#include "cuda/nccl/nccl_api.h"
#include "transport/store.h"

namespace braid {
namespace cuda {

// kGather, kScatter and kAllToAll run only on an NcclApi that has them
// (Note [Collectives NCCL lacks] in nccl_api.h; NcclExecutor::supports).
enum class NcclOpKind {
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kSend,
  kRecv,
  kGather,
  kScatter,
  kAllToAll,
};
const char* ncclOpName(NcclOpKind k);

// One op's arguments. Pointers are device memory on `device`.
struct NcclOp {
  NcclOpKind kind = NcclOpKind::kAllreduce;
  // allreduce, reduce, reduceScatter, allgather, gather, alltoall, send: the
  // input; broadcast: the root's buffer (ignored elsewhere); scatter, recv:
  // unused.
  const void* in = nullptr;
  // The output (broadcast: every rank's buffer; reduce: the root's; send:
  // unused; scatter: this rank's block; gather: unused). in == out is
  // allowed for allreduce, broadcast, reduce and alltoall; for allgather and
  // reduceScatter, in-place means in is this rank's block of out.
  void* out = nullptr;
  // gather: the root's size() outputs, rank order (empty elsewhere).
  std::vector<void*> outs;
  // scatter: the root's size() inputs, rank order (empty elsewhere).
  std::vector<const void*> ins;
  // Elements in each rank's block, as OpDesc::count: the whole buffer for
  // allreduce/broadcast/reduce/send/recv, one rank's share for allgather
  // (out holds size() of them) and reduceScatter (in holds size()), one
  // block for gather/scatter (each of outs/ins, and in/out) and alltoall
  // (in and out hold size() blocks each: equal splits).
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  double premulFactor = 1.0;  // kPremulSum: this rank's factor
  int root = 0;               // broadcast/reduce/gather/scatter: the root; send/recv: the peer
  int device = 0;
  // Recorded on the caller's stream; the op starts after it (null: no wait).
  Event ready = nullptr;
  // 0: the executor's timeout. The deadline runs from run().
  std::chrono::milliseconds timeout{0};
};

class NcclExecutor;
struct NcclExecutorState;

// One run() (one op, or one group of ops). Thread-safe.
class NcclWork {
 public:
  ~NcclWork();
  // true once the op has run on the device (its end event completed);
  // throws the op's error. Also fails the op (and the group) when it is past
  // its deadline or NCCL reports an error. Never blocks on the device.
  bool done();
  // Blocks the CPU until done(): returns, or throws the op's error
  // (TimeoutError at the op's deadline, PeerLostError when a peer failed or
  // the group was aborted, Error otherwise).
  void wait();
  // Like wait(), but returns false at `deadline` if the op is still running
  // (and leaves it running).
  bool waitUntil(std::chrono::steady_clock::time_point deadline);
  // The op's error, or null (pending or succeeded). Does not poll.
  std::exception_ptr error();
  // Recorded on stream() after the op; the caller's stream waits on it.
  // Lives as long as this work.
  Event endEvent() const { return end_; }
  Stream stream() const { return stream_; }
  int device() const { return device_; }
  // "braid allreduce (rank 1): op 7, 1024 float32 elements on device 0".
  const std::string& what() const { return what_; }
  // Runs `cb` once the op completed (null) or failed (its error): at once
  // when it already has, else on the thread that notices (the executor's
  // watchdog, or a caller of done()/wait()). Must not block.
  void onDone(std::function<void(std::exception_ptr)> cb);

 private:
  friend class NcclExecutor;
  friend struct NcclExecutorState;
  NcclWork(std::shared_ptr<NcclExecutorState> state, std::string what, Event end, Stream stream,
           int device, std::chrono::milliseconds timeout);

  const std::shared_ptr<NcclExecutorState> state_;
  const std::string what_;
  const Event end_;
  const Stream stream_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::steady_clock::time_point deadline_;
  // Under state_->mu:
  bool resolved_ = false;
  std::exception_ptr error_;
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
};

class NcclExecutor {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    // Prefix of this group's keys in the store (e.g. "braid/3/"): distinct
    // per group on a shared store.
    std::string storePrefix;
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    // ncclConfig.blocking = 1: NCCL calls may block (debugging only; then
    // abort() cannot end a call stuck inside NCCL and gives up on that
    // communicator after a second, leaving it).
    bool blockingComm = false;
    // How often the watchdog checks pending ops (completion, NCCL errors,
    // deadlines).
    std::chrono::microseconds pollInterval{1000};
  };

  // `nccl` and `device` are a pair (ncclLibrary() with cudaRuntime(), or a
  // SimulatedNccl with simulatedDevice()); both and `store` must outlive
  // this executor.
  NcclExecutor(NcclApi& nccl, DeviceApi& device, transport::Store& store, Options options);
  // shutdown(0): finalizes and destroys what is idle, aborts what is still
  // running.
  ~NcclExecutor();
  NcclExecutor(const NcclExecutor&) = delete;
  NcclExecutor& operator=(const NcclExecutor&) = delete;

  // Enqueues `op` (Note [NCCL streams]). Throws braid::Error naming the op
  // and rank for invalid arguments or a (dtype, reduce op) NCCL cannot run
  // (nothing enqueued; the peers' ops then time out unless they failed the
  // same check, so callers check what the ranks could disagree on first),
  // and the group's first error once it failed. Blocks for the first op on
  // a device until its communicator is made (at most the timeout).
  std::shared_ptr<NcclWork> run(const NcclOp& op);
  // One NCCL group (ncclGroupStart/End) of ops on one device: a batch of
  // sends and receives, or coalesced collectives. One work for them all.
  std::shared_ptr<NcclWork> runGroup(const std::vector<NcclOp>& ops);

  // Fails every pending op with PeerLostError carrying `why`, aborts every
  // communicator, and fails every later run(). Any thread; returns promptly.
  void abort(const std::string& why);
  // No more run(); waits up to `drain` for pending ops, then finalizes and
  // destroys the communicators (aborts them if ops are still pending or
  // failed, or the finalize fails or outlasts its bound: Note [Tearing a
  // communicator down] in nccl_executor.cc) and the comm streams.
  // Idempotent; returns within about `drain` plus the finalize's bound (the
  // timeout, at most 10 s) plus a second.
  void shutdown(std::chrono::milliseconds drain);
  void shutdown();  // drain: the timeout

  // Whether run() takes ops of `kind`: the NcclApi's own collectives always;
  // gather, scatter and alltoall only where the NcclApi has them (Note
  // [Collectives NCCL lacks] in nccl_api.h). The same on every rank.
  bool supports(NcclOpKind kind) const;
  // supports(kind), and NCCL and this executor's NcclApi both run the
  // (dtype, reduce op): ncclSupports and NcclApi::reduces. The same on every
  // rank.
  bool supportsReduction(NcclOpKind kind, DataType type, ReduceOp op) const;
  // run() and runGroup() calls that passed the argument checks so far (the
  // op's number in errors): tests see which path an op took.
  uint64_t opsIssued();
  // The bytes of those ops' buffers (Note [Counting what an executor moved]
  // in cuda/staged.h): per op, its larger buffer on this rank, count
  // elements times the number of blocks it holds: 1 for allreduce,
  // broadcast, reduce, send and recv; size() for allgather, reduceScatter and
  // alltoall, and for gather and scatter at the root (1 at the other ranks).
  uint64_t bytesIssued();
  // The comm stream of `device` (null before its first op).
  Stream commStream(int device);
  // Communicators made so far (for tests: one per device).
  int communicatorsCreated();
  int rank() const;
  int size() const;

 private:
  std::shared_ptr<NcclExecutorState> state_;
};

}  // namespace cuda
}  // namespace braid
