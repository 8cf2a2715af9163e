// NcclExecutor: communicators, comm streams and enqueueing (Note [NCCL
// streams] in nccl_executor.h). Works, the watchdog and failures are in
// nccl_work.cc.
#include "cuda/nccl/nccl_executor.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "cuda/nccl/nccl_executor_state.h"
#include "cuda/on_device.h"

namespace braid {
namespace cuda {

const char* ncclOpName(NcclOpKind k) {
  switch (k) {
    case NcclOpKind::kAllreduce:
      return "allreduce";
    case NcclOpKind::kBroadcast:
      return "broadcast";
    case NcclOpKind::kReduce:
      return "reduce";
    case NcclOpKind::kAllgather:
      return "allgather";
    case NcclOpKind::kReduceScatter:
      return "reduce_scatter";
    case NcclOpKind::kSend:
      return "send";
    case NcclOpKind::kRecv:
      return "recv";
    case NcclOpKind::kGather:
      return "gather";
    case NcclOpKind::kScatter:
      return "scatter";
    case NcclOpKind::kAllToAll:
      return "alltoall";
  }
  return "?";
}

namespace {

bool isReduction(NcclOpKind k) {
  return k == NcclOpKind::kAllreduce || k == NcclOpKind::kReduce || k == NcclOpKind::kReduceScatter;
}

// The NcclApi's name for an op NCCL lacks; false for NCCL's own.
bool extraOf(NcclOpKind k, NcclApi::Extra* e) {
  switch (k) {
    case NcclOpKind::kGather:
      *e = NcclApi::Extra::kGather;
      return true;
    case NcclOpKind::kScatter:
      *e = NcclApi::Extra::kScatter;
      return true;
    case NcclOpKind::kAllToAll:
      *e = NcclApi::Extra::kAllToAll;
      return true;
    default:
      return false;
  }
}

bool apiSupports(const NcclApi& nccl, NcclOpKind k) {
  NcclApi::Extra e;
  if (extraOf(k, &e)) return nccl.supports(e);
  switch (k) {
    case NcclOpKind::kReduce:
      return nccl.hasCore(NcclApi::Core::kReduce);
    case NcclOpKind::kAllgather:
      return nccl.hasCore(NcclApi::Core::kAllGather);
    case NcclOpKind::kReduceScatter:
      return nccl.hasCore(NcclApi::Core::kReduceScatter);
    case NcclOpKind::kSend:
    case NcclOpKind::kRecv:
      return nccl.hasCore(NcclApi::Core::kSendRecv);
    default:
      return true;  // allreduce, broadcast: every NcclApi has them
  }
}

// NcclExecutor::bytesIssued's count for one op.
uint64_t opBytes(const NcclOp& op, int rank, int size) {
  uint64_t blocks = 1;
  switch (op.kind) {
    case NcclOpKind::kAllgather:
    case NcclOpKind::kReduceScatter:
    case NcclOpKind::kAllToAll:
      blocks = static_cast<uint64_t>(size);
      break;
    case NcclOpKind::kGather:
    case NcclOpKind::kScatter:
      blocks = rank == op.root ? static_cast<uint64_t>(size) : 1;
      break;
    default:
      break;
  }
  return op.count * elementSize(op.dtype) * blocks;
}

void checkOp(const NcclApi& nccl, const NcclOp& op, int rank, int size) {
  const char* name = ncclOpName(op.kind);
  // Refused before anything is enqueued: the backend asks supports() first,
  // so this is a caller's bug, not a rank out of step.
  BRAID_ENFORCE(apiSupports(nccl, op.kind), name, rank, nccl.name(), " has no ", name,
                " (Note [Collectives NCCL lacks]: such ops take the staged path)");
  BRAID_ENFORCE(op.device >= 0, name, rank, "device ", op.device, " is not a CUDA device");
  const bool rooted = op.kind == NcclOpKind::kBroadcast || op.kind == NcclOpKind::kReduce ||
                      op.kind == NcclOpKind::kGather || op.kind == NcclOpKind::kScatter;
  const bool p2p = op.kind == NcclOpKind::kSend || op.kind == NcclOpKind::kRecv;
  if (rooted || p2p) {
    BRAID_ENFORCE(op.root >= 0 && op.root < size, name, rank, rooted ? "root " : "peer ", op.root,
                  " is not a rank of a group of ", size);
  }
  // The root's lists: one buffer per rank.
  if (rooted && rank == op.root && op.kind == NcclOpKind::kGather) {
    BRAID_ENFORCE(op.outs.size() == static_cast<size_t>(size), name, rank, "the root has ",
                  op.outs.size(), " outputs for a group of ", size);
    for (size_t q = 0; q < op.outs.size(); ++q) {
      BRAID_ENFORCE(op.count == 0 || op.outs[q], name, rank, "null output ", q, " for ",
                    op.count, " elements");
    }
  }
  if (rooted && rank == op.root && op.kind == NcclOpKind::kScatter) {
    BRAID_ENFORCE(op.ins.size() == static_cast<size_t>(size), name, rank, "the root has ",
                  op.ins.size(), " inputs for a group of ", size);
    for (size_t q = 0; q < op.ins.size(); ++q) {
      BRAID_ENFORCE(op.count == 0 || op.ins[q], name, rank, "null input ", q, " for ", op.count,
                    " elements");
    }
  }
  if (op.count > 0) {
    const bool needIn = op.kind != NcclOpKind::kRecv && op.kind != NcclOpKind::kBroadcast &&
                        op.kind != NcclOpKind::kScatter;
    const bool needOut = op.kind != NcclOpKind::kSend && op.kind != NcclOpKind::kGather &&
                         !(op.kind == NcclOpKind::kReduce && rank != op.root);
    BRAID_ENFORCE(!needIn || op.in, name, rank, "null input for ", op.count, " elements");
    BRAID_ENFORCE(!needOut || op.out, name, rank, "null output for ", op.count, " elements");
    BRAID_ENFORCE(op.kind != NcclOpKind::kBroadcast || op.out || (rank == op.root && op.in), name,
                  rank, "null buffer for ", op.count, " elements");
  }
  if (isReduction(op.kind)) ncclReductionFor(op.dtype, op.redop, op.count, name, rank);
}

// Note [Tearing a communicator down]
// NCCL 2.14 split teardown in two: ncclCommFinalize flushes the
// communicator's work and ends it with its peers; ncclCommDestroy then only
// frees local resources. A destroy without a finalize does the finalize's
// part itself, blocking and unbounded: a peer that died or hangs leaves the
// caller (a destructor, at exit) waiting forever. So braid does as
// ProcessGroupNCCL's NCCLComm does: finalize; wait for it, polling
// ncclCommGetAsyncError (braid's communicators are non-blocking) until it
// stops answering kNcclInProgress, at most the group's timeout capped at
// kFinalizeBound; then destroy. An error, or the bound passed, aborts the
// communicator instead (ncclCommAbort ends whatever it waits for). A group
// that failed was aborted already, and aborts again here. An NcclApi without
// ncclCommFinalize (NCCL before 2.14; braid's same-GPU collectives, whose
// destroy is bounded itself) is destroyed directly. (With
// Options::blockingComm, a debugging mode, the finalize blocks inside NCCL.)
// The wait holds callMu, so an abort() from another thread meanwhile gives
// up on the lock after its second; the bound still ends the wait.
constexpr std::chrono::seconds kFinalizeBound{10};

// Releases `comm` (of `device`) as the note says; logs what went wrong,
// never throws.
void releaseComm(NcclExecutorState& s, int device, NcclComm comm, bool failed) {
  const int rank = s.opt.rank;
  auto warn = [&](const std::string& what) {
    BRAID_LOG(kWarn, "nccl", rank) << "releasing the NCCL communicator of device " << device
                                   << ": " << what;
  };
  auto abort = [&] {
    const NcclResult r = s.nccl.commAbort(comm);
    if (r != kNcclSuccess) warn(strCat("ncclCommAbort: ", ncclResultName(r)));
  };
  if (failed) return abort();
  if (s.nccl.hasCommFinalize()) {
    std::string problem;
    const NcclResult r = s.nccl.commFinalize(comm);
    if (r != kNcclSuccess && r != kNcclInProgress) {
      problem = strCat("ncclCommFinalize: ", ncclResultName(r), " (", s.nccl.getErrorString(r),
                       ")");
    }
    const auto bound = std::min<std::chrono::milliseconds>(s.opt.timeout, kFinalizeBound);
    const auto deadline = Clock::now() + bound;
    auto sleep = std::chrono::microseconds(20);
    while (problem.empty()) {
      NcclResult err = kNcclSuccess;
      const NcclResult q = s.nccl.commGetAsyncError(comm, &err);
      if (q != kNcclSuccess) err = q;
      if (err == kNcclSuccess) break;
      if (err != kNcclInProgress) {
        problem = strCat("ncclCommFinalize: NCCL reported ", ncclResultName(err), " (",
                         s.nccl.getErrorString(err), ")");
      } else if (Clock::now() >= deadline) {
        problem = strCat("ncclCommFinalize still in progress after ", bound.count(),
                         " ms (a peer died or hangs?)");
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
      }
    }
    if (!problem.empty()) {
      warn(problem + "; aborting it");
      return abort();
    }
  }
  const NcclResult r = s.nccl.commDestroy(comm);
  if (r != kNcclSuccess) warn(strCat("ncclCommDestroy: ", ncclResultName(r)));
}

}  // namespace

NcclExecutor::NcclExecutor(NcclApi& nccl, DeviceApi& device, transport::Store& store,
                           Options options) {
  BRAID_ENFORCE(options.size >= 1 && options.rank >= 0 && options.rank < options.size, "init",
                options.rank, "rank ", options.rank, " of a group of ", options.size);
  BRAID_ENFORCE(options.timeout.count() > 0, "init", options.rank, "timeout ",
                options.timeout.count(), " ms");
  // A deadline must not overflow the clock: a year is forever here.
  options.timeout = std::min<std::chrono::milliseconds>(options.timeout, std::chrono::hours(8760));
  state_ = std::make_shared<NcclExecutorState>(nccl, device, store, std::move(options));
}

NcclExecutor::~NcclExecutor() {
  try {
    shutdown(std::chrono::milliseconds(0));
  } catch (const std::exception& e) {
    BRAID_LOG(kWarn, "nccl", state_->opt.rank) << "NCCL executor shutdown: " << e.what();
  }
}

int NcclExecutor::rank() const { return state_->opt.rank; }

bool NcclExecutor::supports(NcclOpKind kind) const { return apiSupports(state_->nccl, kind); }

bool NcclExecutor::supportsReduction(NcclOpKind kind, DataType type, ReduceOp op) const {
  if (!supports(kind) || !ncclSupports(type, op)) return false;
  const NcclTypeOp t = ncclReductionFor(type, op, 0, ncclOpName(kind), state_->opt.rank);
  return state_->nccl.reduces(t.type, t.op);
}

uint64_t NcclExecutor::opsIssued() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->opSeq;
}

uint64_t NcclExecutor::bytesIssued() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bytes;
}
int NcclExecutor::size() const { return state_->opt.size; }

Stream NcclExecutor::commStream(int device) {
  std::lock_guard<TimedLock> lock(state_->callMu);
  auto it = state_->comms.find(device);
  return it == state_->comms.end() ? nullptr : it->second.stream;
}

int NcclExecutor::communicatorsCreated() {
  std::lock_guard<TimedLock> lock(state_->callMu);
  return state_->created;
}

namespace {

// Fails the group with `text` and throws that error.
[[noreturn]] void failAndThrow(NcclExecutorState& s, FailKind kind, const std::string& text) {
  s.fail(kind, text);
  std::rethrow_exception(makeError(kind, text));
}

// Polls `device`'s communicator until NCCL is done with the last call
// (kNcclInProgress ends), failing the group on an error or at `deadline`.
void waitInProgress(NcclExecutorState& s, int device, Clock::time_point deadline,
                    const std::string& what) {
  auto sleep = std::chrono::microseconds(20);
  for (;;) {
    NcclResult err = kNcclSuccess;
    std::string text;
    {
      std::lock_guard<TimedLock> lock(s.callMu);
      NcclComm comm = s.comms[device].comm;
      if (!comm) {
        std::lock_guard<std::mutex> l(s.mu);
        s.throwFailedLocked("nccl", s.opt.rank);
      }
      NcclResult r = s.nccl.commGetAsyncError(comm, &err);
      if (r != kNcclSuccess) err = r;
      if (err != kNcclSuccess && err != kNcclInProgress) {
        text = strCat(ncclResultName(err), " (", s.nccl.getErrorString(err), ")");
        std::string last = s.nccl.lastError(comm);
        if (!last.empty()) text += ": " + last;
      }
    }
    if (err == kNcclSuccess) return;
    if (err != kNcclInProgress) {
      failAndThrow(s, failKindOf(err), strCat(what, ": NCCL reported ", text));
    }
    if (Clock::now() >= deadline) {
      failAndThrow(s, FailKind::kTimeout,
                   strCat(what, ": NCCL still in progress after ", s.opt.timeout.count(),
                          " ms (a rank did not join?)"));
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

// The communicator and comm stream of `device`, made on first use (Note
// [NCCL streams]). Under enqueueMu.
DeviceComm ensureComm(NcclExecutorState& s, int device, const char* name) {
  const int rank = s.opt.rank;
  int n;
  {
    std::lock_guard<TimedLock> lock(s.callMu);
    auto it = s.comms.find(device);
    if (it != s.comms.end()) return it->second;  // a null comm: failed, seen by the caller
    n = static_cast<int>(s.comms.size());
  }
  const std::string key = strCat(s.opt.storePrefix, "nccl/", n, "/uid");
  const std::string what = errorText(name, rank, "making the NCCL communicator for device ", device,
                                     " (", s.opt.size, " ranks, ", s.nccl.name(), ")");
  NcclUniqueId id;
  if (rank == 0) {
    NcclResult r = s.nccl.getUniqueId(&id);
    if (r != kNcclSuccess) {
      failAndThrow(s, FailKind::kError,
                   strCat(what, ": ncclGetUniqueId: ", s.nccl.getErrorString(r)));
    }
    s.store.set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<uint8_t> bytes;
    try {
      bytes = s.store.get(key, s.opt.timeout);
    } catch (const TimeoutError&) {
      failAndThrow(s, FailKind::kTimeout,
                   strCat(what, ": rank 0 did not publish the NCCL unique id (store key '", key,
                          "') within ", s.opt.timeout.count(), " ms"));
    }
    if (bytes.size() != sizeof(id.internal)) {
      failAndThrow(s, FailKind::kError,
                   strCat(what, ": store key '", key, "' holds ", bytes.size(),
                          " bytes, not an NCCL unique id (", sizeof(id.internal), ")"));
    }
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  // NCCL takes the communicator's device from the calling thread's current
  // one (Note [A current device per thread] in cuda/on_device.h).
  OnDevice guard(s.dev, device);
  Stream stream = s.dev.streamCreate(device);
  NcclComm comm = nullptr;
  // Not under callMu: nobody else can reach a communicator not yet listed.
  NcclResult r = s.nccl.commInitRank(&comm, s.opt.size, id, rank, s.opt.blockingComm);
  if (comm) s.nccl.setTimeout(comm, s.opt.timeout);
  bool late;  // the group failed while this one was being made
  {
    std::lock_guard<TimedLock> lock(s.callMu);
    s.comms[device] = DeviceComm{comm, stream};
    if (comm) ++s.created;
    std::lock_guard<std::mutex> l(s.mu);
    late = s.failed;
  }
  if (late) s.abortComms();
  if (r != kNcclSuccess && r != kNcclInProgress) {
    failAndThrow(s, failKindOf(r),
                 strCat(what, ": ncclCommInitRankConfig: ", ncclResultName(r), " (",
                        s.nccl.getErrorString(r), ")"));
  }
  if (r == kNcclInProgress) waitInProgress(s, device, Clock::now() + s.opt.timeout, what);
  BRAID_LOG(kInfo, "nccl", rank) << "NCCL communicator for device " << device << " ("
                                 << s.nccl.name() << ") is ready";
  return DeviceComm{comm, stream};
}

// One op's NCCL call on `comm` (under callMu). A PREMUL_SUM op made for it
// goes to *premul.
NcclResult issue(NcclExecutorState& s, const NcclOp& op, NcclComm comm, Stream st,
                 NcclRedOp* premul) {
  NcclApi& n = s.nccl;
  const int rank = s.opt.rank;
  if (!isReduction(op.kind)) {
    const NcclTypeOp b = ncclBytesTypeFor(op.dtype, op.count);
    switch (op.kind) {
      case NcclOpKind::kBroadcast:
        return n.broadcast(op.in ? op.in : op.out, op.out ? op.out : const_cast<void*>(op.in),
                           b.count, b.type, op.root, comm, st);
      case NcclOpKind::kAllgather:
        return n.allGather(op.in, op.out, b.count, b.type, comm, st);
      case NcclOpKind::kSend:
        return n.send(op.in, b.count, b.type, op.root, comm, st);
      case NcclOpKind::kGather:
        return n.gather(op.in, op.outs.data(), b.count, b.type, op.root, comm, st);
      case NcclOpKind::kScatter:
        return n.scatter(op.ins.data(), op.out, b.count, b.type, op.root, comm, st);
      case NcclOpKind::kAllToAll:
        return n.allToAll(op.in, op.out, b.count, b.type, comm, st);
      default:
        return n.recv(op.out, b.count, b.type, op.root, comm, st);
    }
  }
  const NcclTypeOp t = ncclReductionFor(op.dtype, op.redop, op.count, ncclOpName(op.kind), rank);
  NcclRedOp redop = t.op;
  if (t.premulSum) {
    alignas(8) unsigned char scalar[8];
    ncclScalarOf(op.dtype, op.premulFactor, scalar);
    NcclResult r = n.redOpCreatePreMulSum(&redop, scalar, t.type, comm);
    if (r != kNcclSuccess) return r;
    *premul = redop;
  }
  switch (op.kind) {
    case NcclOpKind::kAllreduce:
      return n.allReduce(op.in, op.out, t.count, t.type, redop, comm, st);
    case NcclOpKind::kReduce:
      return n.reduce(op.in, op.out, t.count, t.type, redop, op.root, comm, st);
    default:
      return n.reduceScatter(op.in, op.out, t.count, t.type, redop, comm, st);
  }
}

// Enqueues `ops` on dc.stream after the callers' events (under enqueueMu).
// Throws (having failed the group) when NCCL refuses a call.
void enqueueOps(NcclExecutorState& s, const std::vector<NcclOp>& ops, const DeviceComm& dc,
                const char* name, const std::string& what, std::chrono::milliseconds timeout) {
  const int device = ops[0].device;
  // The caller's inputs are written once its events complete.
  std::vector<Event> waited;
  for (const NcclOp& op : ops) {
    if (op.ready && std::find(waited.begin(), waited.end(), op.ready) == waited.end()) {
      s.dev.streamWaitEvent(dc.stream, op.ready);
      waited.push_back(op.ready);
    }
  }
  NcclResult result = kNcclSuccess;
  std::string failedCall, lastError;
  std::vector<NcclRedOp> premuls;
  {
    std::lock_guard<TimedLock> lock(s.callMu);
    NcclComm comm = s.comms[device].comm;
    if (!comm) {
      std::lock_guard<std::mutex> l(s.mu);
      s.throwFailedLocked(name, s.opt.rank);
    }
    const bool grouped = ops.size() > 1;
    if (grouped) result = s.nccl.groupStart();
    for (const NcclOp& op : ops) {
      if (result != kNcclSuccess && result != kNcclInProgress) break;
      NcclRedOp premul = -1;
      NcclResult r = issue(s, op, comm, dc.stream, &premul);
      if (premul >= 0) premuls.push_back(premul);
      if (r != kNcclSuccess) {
        failedCall = ncclOpName(op.kind);
        result = r;
      }
    }
    if (grouped) {
      NcclResult r = s.nccl.groupEnd();  // always: NCCL's group state is per thread
      if (result == kNcclSuccess || (result == kNcclInProgress && r != kNcclSuccess)) result = r;
    }
    // Read here, under callMu: the watchdog may abort the communicator (and
    // with it the text) as soon as callMu is released.
    if (result != kNcclSuccess && result != kNcclInProgress) lastError = s.nccl.lastError(comm);
  }
  // On a non-blocking communicator the kernel may not be enqueued yet.
  if (result == kNcclInProgress) waitInProgress(s, device, Clock::now() + timeout, what);
  if (!premuls.empty()) {
    std::lock_guard<TimedLock> lock(s.callMu);
    NcclComm comm = s.comms[device].comm;
    for (NcclRedOp op : premuls) {
      if (comm) s.nccl.redOpDestroy(op, comm);
    }
  }
  if (result != kNcclSuccess && result != kNcclInProgress) {
    failAndThrow(s, failKindOf(result),
                 strCat(what, ": NCCL ", failedCall.empty() ? "group" : failedCall, " returned ",
                        ncclResultName(result), " (", s.nccl.getErrorString(result), ")",
                        lastError.empty() ? "" : ": ", lastError));
  }
}

}  // namespace

std::shared_ptr<NcclWork> NcclExecutor::run(const NcclOp& op) { return runGroup({op}); }

std::shared_ptr<NcclWork> NcclExecutor::runGroup(const std::vector<NcclOp>& ops) {
  NcclExecutorState& s = *state_;
  const int rank = s.opt.rank;
  BRAID_ENFORCE(!ops.empty(), "nccl group", rank, "no ops");
  const char* name = ops.size() == 1 ? ncclOpName(ops[0].kind) : "nccl group";
  const int device = ops[0].device;
  auto timeout = s.opt.timeout;
  for (const NcclOp& op : ops) {
    checkOp(s.nccl, op, rank, s.opt.size);
    BRAID_ENFORCE(op.device == device, name, rank, "ops on devices ", device, " and ", op.device,
                  " in one group");
    if (op.timeout.count() > 0) timeout = std::min(timeout, op.timeout);
  }
  std::lock_guard<std::mutex> enqueue(s.enqueueMu);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.failed) s.throwFailedLocked(name, rank);
    BRAID_ENFORCE(!s.closed, name, rank, "the NCCL executor was shut down");
    seq = ++s.opSeq;
    for (const NcclOp& op : ops) s.bytes += opBytes(op, rank, s.opt.size);
  }
  DeviceComm dc = ensureComm(s, device, name);
  const NcclOp& first = ops[0];
  const std::string what = ops.size() == 1
                               ? errorText(name, rank, "op ", seq, ", ", first.count, " ",
                                           toString(first.dtype), " elements on device ", device)
                               : errorText(name, rank, "op ", seq, ", ", ops.size(), " ops from ",
                                           ncclOpName(first.kind), " on device ", device);
  // The op's device is current while it is enqueued, whichever thread this
  // is: NCCL switches back to the thread's device with a plain set (Note [A
  // current device per thread] in cuda/on_device.h).
  OnDevice on(s.dev, device);
  Event end = s.dev.eventCreate(device);
  // The work owns `end` from here. It joins the pending list only once `end`
  // is recorded: an event never recorded counts as complete.
  auto work =
      std::shared_ptr<NcclWork>(new NcclWork(state_, what, end, dc.stream, device, timeout));
  try {
    enqueueOps(s, ops, dc, name, what, timeout);
    s.dev.eventRecord(end, dc.stream);
  } catch (...) {
    s.finish(*work, std::current_exception());
    throw;
  }
  std::exception_ptr late;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.failed) {
      s.pending.push_back(work);
      s.startWatchdog();
      s.cv.notify_all();
      return work;
    }
    late = makeError(s.failKind, strCat(what, ": not completed: ", s.failText));
  }
  s.finish(*work, late);  // the group failed while this op was enqueued
  return work;
}

void NcclExecutor::abort(const std::string& why) {
  state_->fail(FailKind::kPeerLost, errorText("abort", state_->opt.rank, why));
}

void NcclExecutor::shutdown() { shutdown(state_->opt.timeout); }

void NcclExecutor::shutdown(std::chrono::milliseconds drain) {
  NcclExecutorState& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.closed) return;
    s.closed = true;
  }
  const auto deadline = Clock::now() + std::min(drain, std::chrono::milliseconds(s.opt.timeout));
  for (;;) {
    std::vector<std::shared_ptr<NcclWork>> works;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      works = s.pending;
    }
    if (works.empty()) break;
    for (auto& w : works) s.poll(*w);
    if (Clock::now() >= deadline) {
      s.fail(FailKind::kPeerLost,
             errorText("shutdown", s.opt.rank, works.size(), " NCCL ops still running after ",
                       drain.count(), " ms"));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool failed;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    failed = s.failed;
    s.stopWatchdog = true;
  }
  s.cv.notify_all();
  if (s.watchdog.joinable()) s.watchdog.join();
  std::vector<std::pair<int, Stream>> streams;  // device, comm stream
  {
    std::unique_lock<TimedLock> lock(s.callMu, std::defer_lock);
    if (lock.try_lock_for(std::chrono::seconds(1))) {
      for (auto& kv : s.comms) {
        OnDevice on(s.dev, kv.first, std::nothrow);  // Note [A current device per thread]
        if (kv.second.comm) {
          // Idle: finalize and destroy, bounded (Note [Tearing a communicator
          // down]). Failed groups were aborted already.
          releaseComm(s, kv.first, kv.second.comm, failed);
          kv.second.comm = nullptr;
        }
        if (kv.second.stream) streams.emplace_back(kv.first, kv.second.stream);
        kv.second.stream = nullptr;
      }
    }
  }
  for (const auto& ds : streams) {
    try {
      OnDevice on(s.dev, ds.first, std::nothrow);
      s.dev.streamDestroy(ds.second);
    } catch (const std::exception& e) {
      BRAID_LOG(kWarn, "nccl", s.opt.rank) << "destroying a comm stream: " << e.what();
    }
  }
}

}  // namespace cuda
}  // namespace braid
