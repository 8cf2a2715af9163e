// Note [Injected NCCL failures] in faulty_nccl.h.
#include "sim/nccl/faulty_nccl.h"

#include <thread>

namespace braid {
namespace cuda {

void FaultyNccl::inject(NcclFault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(Armed{std::move(fault), 0});
}

void FaultyNccl::asyncError(NcclResult result, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  async_ = result;
  asyncText_ = text;
}

void FaultyNccl::hangFinalize(std::chrono::milliseconds destroyHang) {
  std::lock_guard<std::mutex> lock(mu_);
  hangFinalize_ = true;
  destroyHang_ = destroyHang;
}

void FaultyNccl::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
  stuck_ = false;
  failedText_.clear();
  async_ = kNcclSuccess;
  hangFinalize_ = false;
  finalizing_.clear();
  finalized_.clear();
}

int FaultyNccl::failures() {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

std::vector<FaultyNccl::Teardown> FaultyNccl::teardown() {
  std::lock_guard<std::mutex> lock(mu_);
  return teardown_;
}

NcclResult FaultyNccl::check(const char* call, NcclComm comm) {
  std::lock_guard<std::mutex> lock(mu_);
  const NcclFault* hit = nullptr;
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
  if (hit == nullptr) return kNcclSuccess;
  ++failures_;
  failedText_[comm] = hit->text;
  return hit->result;
}

void FaultyNccl::logTeardown(const char* call, NcclComm comm) {
  std::lock_guard<std::mutex> lock(mu_);
  teardown_.push_back(Teardown{call, comm});
}

std::string FaultyNccl::lastError(NcclComm comm) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failedText_.find(comm);
    if (it != failedText_.end()) return it->second;
    if (async_ != kNcclSuccess) return asyncText_;
  }
  return inner_.lastError(comm);
}

NcclResult FaultyNccl::getUniqueId(NcclUniqueId* id) {
  NcclResult r = check("getUniqueId", nullptr);
  return r != kNcclSuccess ? r : inner_.getUniqueId(id);
}
NcclResult FaultyNccl::commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                                    bool blocking) {
  NcclResult r = check("commInitRank", nullptr);
  return r != kNcclSuccess ? r : inner_.commInitRank(comm, nranks, id, rank, blocking);
}
NcclResult FaultyNccl::commDestroy(NcclComm comm) {
  logTeardown("commDestroy", comm);
  std::chrono::milliseconds hang{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (hangFinalize_ && !finalized_.count(comm)) hang = destroyHang_;
  }
  std::this_thread::sleep_for(hang);  // finalizing itself, with a dead peer
  NcclResult r = check("commDestroy", comm);
  return r != kNcclSuccess ? r : inner_.commDestroy(comm);
}
NcclResult FaultyNccl::commAbort(NcclComm comm) {
  logTeardown("commAbort", comm);
  {
    std::lock_guard<std::mutex> lock(mu_);
    finalizing_.erase(comm);
  }
  NcclResult r = check("commAbort", comm);
  return r != kNcclSuccess ? r : inner_.commAbort(comm);
}
NcclResult FaultyNccl::commGetAsyncError(NcclComm comm, NcclResult* asyncError) {
  NcclResult r = check("commGetAsyncError", comm);
  if (r != kNcclSuccess) return r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (async_ != kNcclSuccess) {
      *asyncError = async_;
      return kNcclSuccess;
    }
    if (finalizing_.count(comm)) {
      *asyncError = kNcclInProgress;
      return kNcclSuccess;
    }
  }
  return inner_.commGetAsyncError(comm, asyncError);
}
NcclResult FaultyNccl::commFinalize(NcclComm comm) {
  logTeardown("commFinalize", comm);
  {
    std::lock_guard<std::mutex> lock(mu_);
    finalized_.insert(comm);
  }
  NcclResult r = check("commFinalize", comm);
  if (r != kNcclSuccess) return r;
  r = inner_.commFinalize(comm);
  std::lock_guard<std::mutex> lock(mu_);
  if (hangFinalize_ && (r == kNcclSuccess || r == kNcclInProgress)) {
    finalizing_.insert(comm);
    return kNcclInProgress;
  }
  return r;
}
NcclResult FaultyNccl::groupStart() {
  NcclResult r = check("groupStart", nullptr);
  return r != kNcclSuccess ? r : inner_.groupStart();
}
NcclResult FaultyNccl::groupEnd() {
  NcclResult r = check("groupEnd", nullptr);
  return r != kNcclSuccess ? r : inner_.groupEnd();
}
NcclResult FaultyNccl::allReduce(const void* send, void* recv, size_t count, NcclDataType type,
                                 NcclRedOp op, NcclComm comm, Stream stream) {
  NcclResult r = check("allReduce", comm);
  return r != kNcclSuccess ? r : inner_.allReduce(send, recv, count, type, op, comm, stream);
}
NcclResult FaultyNccl::broadcast(const void* send, void* recv, size_t count, NcclDataType type,
                                 int root, NcclComm comm, Stream stream) {
  NcclResult r = check("broadcast", comm);
  return r != kNcclSuccess ? r : inner_.broadcast(send, recv, count, type, root, comm, stream);
}
NcclResult FaultyNccl::reduce(const void* send, void* recv, size_t count, NcclDataType type,
                              NcclRedOp op, int root, NcclComm comm, Stream stream) {
  NcclResult r = check("reduce", comm);
  return r != kNcclSuccess ? r : inner_.reduce(send, recv, count, type, op, root, comm, stream);
}
NcclResult FaultyNccl::allGather(const void* send, void* recv, size_t sendCount,
                                 NcclDataType type, NcclComm comm, Stream stream) {
  NcclResult r = check("allGather", comm);
  return r != kNcclSuccess ? r : inner_.allGather(send, recv, sendCount, type, comm, stream);
}
NcclResult FaultyNccl::reduceScatter(const void* send, void* recv, size_t recvCount,
                                     NcclDataType type, NcclRedOp op, NcclComm comm,
                                     Stream stream) {
  NcclResult r = check("reduceScatter", comm);
  return r != kNcclSuccess ? r
                           : inner_.reduceScatter(send, recv, recvCount, type, op, comm, stream);
}
NcclResult FaultyNccl::send(const void* buf, size_t count, NcclDataType type, int peer,
                            NcclComm comm, Stream stream) {
  NcclResult r = check("send", comm);
  return r != kNcclSuccess ? r : inner_.send(buf, count, type, peer, comm, stream);
}
NcclResult FaultyNccl::recv(void* buf, size_t count, NcclDataType type, int peer, NcclComm comm,
                            Stream stream) {
  NcclResult r = check("recv", comm);
  return r != kNcclSuccess ? r : inner_.recv(buf, count, type, peer, comm, stream);
}
NcclResult FaultyNccl::redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType type,
                                            NcclComm comm) {
  NcclResult r = check("redOpCreatePreMulSum", comm);
  return r != kNcclSuccess ? r : inner_.redOpCreatePreMulSum(op, scalar, type, comm);
}
NcclResult FaultyNccl::redOpDestroy(NcclRedOp op, NcclComm comm) {
  NcclResult r = check("redOpDestroy", comm);
  return r != kNcclSuccess ? r : inner_.redOpDestroy(op, comm);
}
NcclResult FaultyNccl::gather(const void* send, void* const* recvs, size_t count,
                              NcclDataType type, int root, NcclComm comm, Stream stream) {
  NcclResult r = check("gather", comm);
  return r != kNcclSuccess ? r : inner_.gather(send, recvs, count, type, root, comm, stream);
}
NcclResult FaultyNccl::scatter(const void* const* sends, void* recv, size_t count,
                               NcclDataType type, int root, NcclComm comm, Stream stream) {
  NcclResult r = check("scatter", comm);
  return r != kNcclSuccess ? r : inner_.scatter(sends, recv, count, type, root, comm, stream);
}
NcclResult FaultyNccl::allToAll(const void* send, void* recv, size_t count, NcclDataType type,
                                NcclComm comm, Stream stream) {
  NcclResult r = check("allToAll", comm);
  return r != kNcclSuccess ? r : inner_.allToAll(send, recv, count, type, comm, stream);
}

}  // namespace cuda
}  // namespace braid
