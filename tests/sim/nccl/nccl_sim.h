// A simulated NCCL for tests without a GPU: ranks are threads of one process.
//
// Note [Simulated NCCL]
// - Communicators made from the same unique id form a clique (an
//   in-process rendezvous). commInitRank joins it; a non-blocking init
//   answers kNcclInProgress until every rank has joined (and setInitDelay
//   has passed), so a missing rank leaves an init in progress forever, as on
//   NCCL; a blocking init waits for them all.
// - Each call enqueues a task on the given stream through
//   SimulatedDevice::launchHostFunc, so that it runs in stream order on that
//   stream's thread, after whatever the stream waits for (the caller's
//   events included). An ungrouped call is one task; calls between
//   groupStart and groupEnd (per thread, as NCCL's) become one task per
//   communicator, in which sends are posted first, so a ring of sends and
//   receives does not deadlock.
// - A collective's task waits for the other ranks' tasks of the same
//   collective (the n-th collective of each communicator), checks that they
//   agree (kind, count, type, op, root: a mismatch is kNcclInvalidUsage on
//   every rank instead of NCCL's hang or garbage), computes this rank's
//   result from the peers' buffers (host memory) with braid's CPU kernels,
//   waits until every rank has read its inputs, and only then writes its
//   output, so in-place ops are safe. A receive copies the matching send's
//   buffer (FIFO per sender and receiver) and releases the sender.
// - Failure: injectAsyncError makes commGetAsyncError report an error on a
//   rank's communicators, whose tasks then end without touching memory.
//   commAbort ends the aborted communicator's tasks and breaks the clique:
//   every other member then reports kNcclRemoteError and its waiting tasks
//   end (a model of NCCL's remote-error propagation; a rank that merely
//   stops calling, or a destroyed communicator, leaves peers waiting, as on
//   NCCL). injectHang makes a rank's next task block its stream until the
//   communicator is aborted (a kernel that never finishes).
// - On a non-blocking communicator with setEnqueueDelay, each call answers
//   kNcclInProgress and enqueues its task only after the delay, from a helper
//   thread: what NCCL does while it connects lazily. A caller that records
//   an event before the call is done orders it before the task, and tests see
//   the event complete too early. Calling again while a call is in progress
//   is kNcclInvalidUsage, as NCCL requires.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cuda/nccl/nccl_api.h"
#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {

namespace simnccl {
struct Clique;
struct Comm;
struct Call;
}  // namespace simnccl

class SimulatedNccl : public NcclApi {
 public:
  // `device` runs the tasks (its launchHostFunc runs them in stream order).
  explicit SimulatedNccl(SimulatedDevice& device);
  ~SimulatedNccl() override;

  std::string name() const override { return "simulated NCCL"; }
  bool simulated() const override { return true; }
  int version() override { return 22809; }
  const char* getErrorString(NcclResult r) override { return ncclResultName(r); }
  std::string lastError(NcclComm comm) override;

  NcclResult getUniqueId(NcclUniqueId* id) override;
  NcclResult commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          bool blocking) override;
  NcclResult commDestroy(NcclComm comm) override;
  NcclResult commAbort(NcclComm comm) override;
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* asyncError) override;
  // ncclCommFinalize: a simulated communicator's tasks hold their own
  // references and run in their streams' order, so there is nothing to
  // flush: done at once. (FaultyNccl, faulty_nccl.h, makes one never finish.)
  bool hasCommFinalize() override { return true; }
  NcclResult commFinalize(NcclComm comm) override {
    return find(comm) ? kNcclSuccess : kNcclInvalidArgument;
  }
  NcclResult groupStart() override;
  NcclResult groupEnd() override;

  NcclResult allReduce(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                       NcclComm comm, Stream stream) override;
  NcclResult broadcast(const void* send, void* recv, size_t count, NcclDataType type, int root,
                       NcclComm comm, Stream stream) override;
  NcclResult reduce(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                    int root, NcclComm comm, Stream stream) override;
  NcclResult allGather(const void* send, void* recv, size_t sendCount, NcclDataType type,
                       NcclComm comm, Stream stream) override;
  NcclResult reduceScatter(const void* send, void* recv, size_t recvCount, NcclDataType type,
                           NcclRedOp op, NcclComm comm, Stream stream) override;
  NcclResult send(const void* buf, size_t count, NcclDataType type, int peer, NcclComm comm,
                  Stream stream) override;
  NcclResult recv(void* buf, size_t count, NcclDataType type, int peer, NcclComm comm,
                  Stream stream) override;
  NcclResult redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType type,
                                  NcclComm comm) override;
  NcclResult redOpDestroy(NcclRedOp op, NcclComm comm) override;

  // ---- testing hooks (Note [Simulated NCCL]) ----
  // Every live communicator of `rank` reports `error` (with `text` as its
  // last error) from now on; its tasks end without touching memory.
  void injectAsyncError(int rank, NcclResult error, const std::string& text);
  // The next task of each live communicator of `rank` blocks until aborted.
  void injectHang(int rank);
  // Non-blocking inits complete `delay` after the last rank joined.
  void setInitDelay(std::chrono::milliseconds delay);
  // Calls on non-blocking communicators answer kNcclInProgress and enqueue
  // their task after `delay` (0: at once, answering kNcclSuccess).
  void setEnqueueDelay(std::chrono::milliseconds delay);
  // Communicators created so far (commInitRank calls that did not fail).
  int commsCreated();
  // Live communicators (created, not yet destroyed or aborted).
  int commsLive();

 private:
  friend struct simnccl::Comm;
  using Clock = std::chrono::steady_clock;
  std::shared_ptr<simnccl::Comm> find(NcclComm comm);
  NcclResult submit(NcclComm comm, simnccl::Call call);
  NcclResult launch(std::deque<simnccl::Call> calls);
  void enqueueTask(const std::shared_ptr<simnccl::Comm>& comm, Stream stream,
                   std::deque<simnccl::Call> calls);
  void deferredLoop();

  SimulatedDevice& device_;
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<simnccl::Clique>> cliques_;
  std::map<NcclComm, std::shared_ptr<simnccl::Comm>> comms_;
  uint64_t idCounter_ = 0;
  int created_ = 0;
  std::chrono::milliseconds initDelay_{0};
  std::chrono::milliseconds enqueueDelay_{0};

  // Deferred enqueues (setEnqueueDelay), run by deferred_ in due order.
  std::condition_variable deferredCv_;
  std::multimap<Clock::time_point, std::function<void()>> deferredQueue_;
  bool stopping_ = false;
  std::thread deferred_;
};

}  // namespace cuda
}  // namespace braid
