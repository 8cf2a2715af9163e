// SimulatedNccl's API side: cliques, communicators, groups and the testing
// hooks (Note [Simulated NCCL] in nccl_sim.h). The tasks are in nccl_sim_task.cc.
#include "sim/nccl/nccl_sim.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "common/error.h"
#include "sim/nccl/nccl_sim_internal.h"
#include "math/half.h"

namespace braid {
namespace cuda {

using simnccl::Call;
using simnccl::Clique;
using simnccl::Comm;
using simnccl::Kind;

namespace {

// NCCL's group state is per thread; so is this (ranks are threads).
struct GroupState {
  int depth = 0;
  std::deque<Call> calls;
};
thread_local GroupState tGroup;

bool knownType(NcclDataType t) {
  return t == kNcclInt8 || t == kNcclUint8 || t == kNcclInt32 || t == kNcclInt64 ||
         t == kNcclFloat16 || t == kNcclFloat32 || t == kNcclFloat64 || t == kNcclBfloat16;
}

}  // namespace

SimulatedNccl::SimulatedNccl(SimulatedDevice& device) : device_(device) {
  deferred_ = std::thread([this] { deferredLoop(); });
}

SimulatedNccl::~SimulatedNccl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  deferredCv_.notify_all();
  deferred_.join();
}

std::shared_ptr<Comm> SimulatedNccl::find(NcclComm comm) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(comm);
  return it == comms_.end() ? nullptr : it->second;
}

std::string SimulatedNccl::lastError(NcclComm comm) {
  auto c = find(comm);
  if (!c) return "";
  std::lock_guard<std::mutex> lock(c->clique->mu);
  return !c->errorText.empty() ? c->errorText : c->clique->brokenWhy;
}

NcclResult SimulatedNccl::getUniqueId(NcclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::random_device rd;
  uint64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = ++idCounter_;
  }
  std::string s = strCat("braid-sim-nccl-", n, "-", rd(), "-", rd());
  std::memcpy(id->internal, s.data(), std::min(s.size(), sizeof(id->internal)));
  return kNcclSuccess;
}

NcclResult SimulatedNccl::commInitRank(NcclComm* out, int nranks, const NcclUniqueId& id, int rank,
                                       bool blocking) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return kNcclInvalidArgument;
  const std::string key(id.internal, sizeof(id.internal));
  auto comm = std::make_shared<Comm>();
  comm->rank = rank;
  comm->blocking = blocking;
  comm->device = device_.getDevice();
  comm->handle = comm.get();
  std::shared_ptr<Clique> clique;
  std::chrono::milliseconds initDelay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    initDelay = initDelay_;
    clique = cliques_[key].lock();
    if (!clique) {
      clique = std::make_shared<Clique>();
      clique->id = key;
      clique->nranks = nranks;
      clique->joined.assign(nranks, false);
      cliques_[key] = clique;
    }
    for (auto it = cliques_.begin(); it != cliques_.end();) {
      it = it->second.expired() ? cliques_.erase(it) : std::next(it);
    }
  }
  comm->clique = clique;
  {
    std::unique_lock<std::mutex> lock(clique->mu);
    if (clique->nranks != nranks || clique->joined[rank]) return kNcclInvalidArgument;
    clique->joined[rank] = true;
    if (++clique->joinedCount == nranks) clique->readyAt = Clock::now() + initDelay;
    clique->cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms_[comm->handle] = comm;
    ++created_;
  }
  *out = comm->handle;
  std::unique_lock<std::mutex> lock(clique->mu);
  if (!blocking) return clique->ready(Clock::now()) ? kNcclSuccess : kNcclInProgress;
  while (!clique->ready(Clock::now())) {
    if (clique->joinedCount == nranks) {
      clique->cv.wait_until(lock, clique->readyAt);
    } else {
      clique->cv.wait(lock);
    }
  }
  return kNcclSuccess;
}

namespace {
// ncclCommDestroy and ncclCommAbort switch to the communicator's device and
// back to the thread's with a plain cudaSetDevice: on a thread that set no
// device, "back to 0" makes device 0's context (Note [Simulated contexts] in
// tests/sim/device/sim_device.h).
void visitCommDevice(SimulatedDevice& d, int device) {
  const int saved = d.getDevice();
  if (saved == device) return;
  d.setDevice(device);
  d.setDevice(saved);
}
}  // namespace

NcclResult SimulatedNccl::commDestroy(NcclComm handle) {
  std::shared_ptr<Comm> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(handle);
    if (it == comms_.end()) return kNcclInvalidArgument;
    c = it->second;
    comms_.erase(it);
  }
  visitCommDevice(device_, c->device);
  std::lock_guard<std::mutex> lock(c->clique->mu);
  c->destroyed = true;
  c->clique->cv.notify_all();
  return kNcclSuccess;
}

NcclResult SimulatedNccl::commAbort(NcclComm handle) {
  std::shared_ptr<Comm> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(handle);
    if (it == comms_.end()) return kNcclInvalidArgument;
    c = it->second;
    comms_.erase(it);
  }
  visitCommDevice(device_, c->device);
  Clique& q = *c->clique;
  std::lock_guard<std::mutex> lock(q.mu);
  c->aborted = true;
  if (!q.broken) {
    q.broken = true;
    q.brokenCode = kNcclRemoteError;
    q.brokenWhy = strCat("simulated NCCL: rank ", c->rank, " aborted its communicator");
  }
  q.cv.notify_all();
  return kNcclSuccess;
}

NcclResult SimulatedNccl::commGetAsyncError(NcclComm handle, NcclResult* err) {
  auto c = find(handle);
  if (!c) return kNcclInvalidArgument;
  std::lock_guard<std::mutex> lock(c->clique->mu);
  if (c->error != kNcclSuccess) {
    *err = c->error;
  } else if (c->clique->broken) {
    *err = c->clique->brokenCode;
  } else if (!c->clique->ready(Clock::now()) || c->inProgress > 0) {
    *err = kNcclInProgress;
  } else {
    *err = kNcclSuccess;
  }
  return kNcclSuccess;
}

NcclResult SimulatedNccl::groupStart() {
  ++tGroup.depth;
  return kNcclSuccess;
}

NcclResult SimulatedNccl::groupEnd() {
  if (tGroup.depth == 0) return kNcclInvalidUsage;
  if (--tGroup.depth > 0) return kNcclSuccess;
  std::deque<Call> calls;
  calls.swap(tGroup.calls);
  return launch(std::move(calls));
}

// Checks a call and queues it in the thread's group, or runs it alone.
NcclResult SimulatedNccl::submit(NcclComm handle, Call call) {
  call.comm = find(handle);
  if (!call.comm || !knownType(call.type)) return kNcclInvalidArgument;
  Comm& c = *call.comm;
  {
    std::lock_guard<std::mutex> lock(c.clique->mu);
    const int n = c.clique->nranks;
    if (!c.clique->ready(Clock::now()) || c.inProgress > 0) return kNcclInvalidUsage;
    if (call.root < 0 || call.root >= n) return kNcclInvalidArgument;
    if (call.op >= 5) {
      auto it = c.premulOps.find(call.op);
      if (it == c.premulOps.end()) return kNcclInvalidArgument;
      call.premul = true;
      call.scalar = it->second;
    } else if (call.op < 0) {
      return kNcclInvalidArgument;
    }
  }
  const bool hasSend = call.kind != Kind::kRecv;
  const bool hasRecv = call.kind != Kind::kSend;
  if (call.count > 0 && ((hasSend && !call.send) || (hasRecv && !call.recv))) {
    return kNcclInvalidArgument;
  }
  if (tGroup.depth > 0) {
    tGroup.calls.push_back(std::move(call));
    return kNcclSuccess;
  }
  std::deque<Call> one;
  one.push_back(std::move(call));
  return launch(std::move(one));
}

// One task per communicator, on the stream of its first call; collectives
// are numbered now, in call order, which is the order every rank must keep.
NcclResult SimulatedNccl::launch(std::deque<Call> calls) {
  std::map<Comm*, std::deque<Call>> byComm;
  std::vector<Comm*> order;
  for (auto& call : calls) {
    Comm* c = call.comm.get();
    if (!byComm.count(c)) order.push_back(c);
    byComm[c].push_back(std::move(call));
  }
  std::chrono::milliseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    delay = enqueueDelay_;
  }
  NcclResult result = kNcclSuccess;
  for (Comm* c : order) {
    auto& mine = byComm[c];
    std::shared_ptr<Comm> comm = mine.front().comm;
    Stream stream = mine.front().stream;
    bool defer;
    {
      std::lock_guard<std::mutex> lock(c->clique->mu);
      for (auto& call : mine) {
        if (call.kind != Kind::kSend && call.kind != Kind::kRecv) call.seq = c->nextSeq++;
      }
      defer = !c->blocking && delay.count() > 0;
      if (defer) ++c->inProgress;
    }
    if (!defer) {
      try {
        enqueueTask(comm, stream, std::move(mine));
      } catch (const std::exception&) {
        result = kNcclUnhandledCudaError;
      }
      continue;
    }
    auto task = std::make_shared<std::deque<Call>>(std::move(mine));
    std::lock_guard<std::mutex> lock(mu_);
    deferredQueue_.emplace(Clock::now() + delay, [this, comm, stream, task] {
      try {
        enqueueTask(comm, stream, std::move(*task));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(comm->clique->mu);
        comm->error = kNcclUnhandledCudaError;
        comm->errorText = strCat("simulated NCCL: could not enqueue: ", e.what());
      }
      std::lock_guard<std::mutex> l(comm->clique->mu);
      --comm->inProgress;
    });
    deferredCv_.notify_all();
    result = kNcclInProgress;
  }
  return result;
}

void SimulatedNccl::enqueueTask(const std::shared_ptr<Comm>& comm, Stream stream,
                                std::deque<Call> calls) {
  auto shared = std::make_shared<std::deque<Call>>(std::move(calls));
  device_.launchHostFunc(stream, [comm, shared] { simnccl::runTask(comm, *shared); });
}

void SimulatedNccl::deferredLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (deferredQueue_.empty()) {
      if (stopping_) return;
      deferredCv_.wait(lock);
      continue;
    }
    auto due = deferredQueue_.begin()->first;
    if (!stopping_ && Clock::now() < due) {
      deferredCv_.wait_until(lock, due);
      continue;
    }
    auto fn = std::move(deferredQueue_.begin()->second);
    deferredQueue_.erase(deferredQueue_.begin());
    lock.unlock();
    fn();  // when stopping, at once: nothing stays in progress
    lock.lock();
  }
}

NcclResult SimulatedNccl::allReduce(const void* send, void* recv, size_t count, NcclDataType type,
                                    NcclRedOp op, NcclComm comm, Stream stream) {
  Call c;
  c.kind = Kind::kAllReduce;
  c.send = send, c.recv = recv, c.count = count, c.type = type, c.op = op, c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::broadcast(const void* send, void* recv, size_t count, NcclDataType type,
                                    int root, NcclComm comm, Stream stream) {
  Call c;
  c.kind = Kind::kBroadcast;
  c.send = send, c.recv = recv, c.count = count, c.type = type, c.root = root, c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::reduce(const void* send, void* recv, size_t count, NcclDataType type,
                                 NcclRedOp op, int root, NcclComm comm, Stream stream) {
  Call c;
  c.kind = Kind::kReduce;
  c.send = send, c.recv = recv, c.count = count, c.type = type, c.op = op, c.root = root;
  c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::allGather(const void* send, void* recv, size_t sendCount,
                                    NcclDataType type, NcclComm comm, Stream stream) {
  Call c;
  c.kind = Kind::kAllGather;
  c.send = send, c.recv = recv, c.count = sendCount, c.type = type, c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::reduceScatter(const void* send, void* recv, size_t recvCount,
                                        NcclDataType type, NcclRedOp op, NcclComm comm,
                                        Stream stream) {
  Call c;
  c.kind = Kind::kReduceScatter;
  c.send = send, c.recv = recv, c.count = recvCount, c.type = type, c.op = op, c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::send(const void* buf, size_t count, NcclDataType type, int peer,
                               NcclComm comm, Stream stream) {
  Call c;
  c.kind = Kind::kSend;
  c.send = buf, c.count = count, c.type = type, c.root = peer, c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::recv(void* buf, size_t count, NcclDataType type, int peer, NcclComm comm,
                               Stream stream) {
  Call c;
  c.kind = Kind::kRecv;
  c.recv = buf, c.count = count, c.type = type, c.root = peer, c.stream = stream;
  return submit(comm, std::move(c));
}

NcclResult SimulatedNccl::redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType type,
                                               NcclComm handle) {
  auto c = find(handle);
  if (!c) return kNcclInvalidArgument;
  double v;
  switch (type) {
    case kNcclFloat64:
      std::memcpy(&v, scalar, 8);
      break;
    case kNcclFloat32: {
      float f;
      std::memcpy(&f, scalar, 4);
      v = f;
      break;
    }
    case kNcclFloat16:
    case kNcclBfloat16: {
      uint16_t h;
      std::memcpy(&h, scalar, 2);
      v = type == kNcclFloat16 ? reduce::halfToFloat(h) : reduce::bf16ToFloat(h);
      break;
    }
    default:
      return kNcclInvalidArgument;  // braid makes PREMUL_SUM for float types only
  }
  std::lock_guard<std::mutex> lock(c->clique->mu);
  *op = c->nextOp++;
  c->premulOps[*op] = v;
  return kNcclSuccess;
}

NcclResult SimulatedNccl::redOpDestroy(NcclRedOp op, NcclComm handle) {
  auto c = find(handle);
  if (!c) return kNcclInvalidArgument;
  std::lock_guard<std::mutex> lock(c->clique->mu);
  return c->premulOps.erase(op) ? kNcclSuccess : kNcclInvalidArgument;
}

void SimulatedNccl::injectAsyncError(int rank, NcclResult error, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : comms_) {
    Comm& c = *kv.second;
    if (c.rank != rank) continue;
    std::lock_guard<std::mutex> l(c.clique->mu);
    c.error = error;
    c.errorText = text;
    c.clique->cv.notify_all();
  }
}

void SimulatedNccl::injectHang(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : comms_) {
    Comm& c = *kv.second;
    if (c.rank != rank) continue;
    std::lock_guard<std::mutex> l(c.clique->mu);
    c.hang = true;
  }
}

void SimulatedNccl::setInitDelay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  initDelay_ = delay;
}

void SimulatedNccl::setEnqueueDelay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  enqueueDelay_ = delay;
}

int SimulatedNccl::commsCreated() {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}

int SimulatedNccl::commsLive() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(comms_.size());
}

}  // namespace cuda
}  // namespace braid
