// Test-only: an NcclApi that wraps another (SimulatedNccl, or any) and makes
// chosen calls fail, reports async errors, and records how communicators
// are torn down.
//
// Note [Injected NCCL failures]
// A fault names an NcclApi call ("allReduce", "commFinalize", ...; "*" is
// every call) and which of its calls fail, counted from when it was
// injected: the nth only, or the nth and every later one. A failing call
// answers the fault's NcclResult without reaching the wrapped NCCL, and
// lastError() of its communicator then gives the fault's text. A sticky fault makes every later
// call (every kind) answer the same, until clear().
// asyncError(r, text): from now on commGetAsyncError reports `r` on every
// communicator, as NCCL does after a failed kernel or a lost peer; the
// communicators still work underneath (the wrapped NCCL knows nothing).
// hangFinalize(): commFinalize is accepted, but the communicator's
// commGetAsyncError answers kNcclInProgress from then on (until aborted): a
// peer that died or hangs, so that the finalize never completes. A
// commDestroy of a communicator never finalized then blocks too (NCCL's
// destroy finalizes itself first, unbounded): here for `destroyHang`, so
// that a test of a teardown without a bound fails rather than hangs.
// teardown(): the commFinalize, commDestroy and commAbort calls made, in
// order, with their communicator, whatever they answered.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda/nccl/nccl_api.h"

namespace braid {
namespace cuda {

struct NcclFault {
  std::string call;  // an NcclApi method's name, or "*"
  int nth = 1;       // the nth matching call from now fails (1: the next)
  bool every = false;
  bool sticky = false;
  NcclResult result = kNcclSystemError;
  std::string text = "injected: a NIC went away";
};

class FaultyNccl final : public NcclApi {
 public:
  explicit FaultyNccl(NcclApi& inner) : inner_(inner) {}

  void inject(NcclFault fault);
  void asyncError(NcclResult result, const std::string& text);
  void hangFinalize(std::chrono::milliseconds destroyHang = std::chrono::seconds(20));
  void clear();  // faults, async errors, hung finalizes
  int failures();
  struct Teardown {
    std::string call;  // "commFinalize", "commDestroy", "commAbort"
    NcclComm comm;
  };
  std::vector<Teardown> teardown();

  std::string name() const override { return "faulty(" + inner_.name() + ")"; }
  bool simulated() const override { return inner_.simulated(); }
  int version() override { return inner_.version(); }
  const char* getErrorString(NcclResult r) override { return inner_.getErrorString(r); }
  std::string lastError(NcclComm comm) override;

  NcclResult getUniqueId(NcclUniqueId* id) override;
  NcclResult commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          bool blocking) override;
  NcclResult commDestroy(NcclComm comm) override;
  NcclResult commAbort(NcclComm comm) override;
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* asyncError) override;
  bool hasCommFinalize() override { return inner_.hasCommFinalize(); }
  NcclResult commFinalize(NcclComm comm) override;
  NcclResult groupStart() override;
  NcclResult groupEnd() override;
  NcclResult allReduce(const void* send, void* recv, size_t count, NcclDataType type,
                       NcclRedOp op, NcclComm comm, Stream stream) override;
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
  bool supports(Extra e) const override { return inner_.supports(e); }
  bool hasCore(Core c) const override { return inner_.hasCore(c); }
  bool reduces(NcclDataType t, NcclRedOp op) const override { return inner_.reduces(t, op); }
  NcclResult gather(const void* send, void* const* recvs, size_t count, NcclDataType type,
                    int root, NcclComm comm, Stream stream) override;
  NcclResult scatter(const void* const* sends, void* recv, size_t count, NcclDataType type,
                     int root, NcclComm comm, Stream stream) override;
  NcclResult allToAll(const void* send, void* recv, size_t count, NcclDataType type,
                      NcclComm comm, Stream stream) override;
  void setTimeout(NcclComm comm, std::chrono::milliseconds t) override {
    inner_.setTimeout(comm, t);
  }

 private:
  // The injected result if `call` (on `comm`; null: none) is to fail now,
  // else kNcclSuccess.
  NcclResult check(const char* call, NcclComm comm);
  void logTeardown(const char* call, NcclComm comm);

  NcclApi& inner_;
  std::mutex mu_;
  struct Armed {
    NcclFault fault;
    int seen = 0;
  };
  std::vector<Armed> faults_;
  bool stuck_ = false;
  NcclFault sticky_;
  std::map<NcclComm, std::string> failedText_;  // lastError of the comms whose call failed
  int failures_ = 0;
  NcclResult async_ = kNcclSuccess;
  std::string asyncText_;
  bool hangFinalize_ = false;
  std::chrono::milliseconds destroyHang_{0};
  std::set<NcclComm> finalizing_;  // hung finalizes
  std::set<NcclComm> finalized_;   // commFinalize called
  std::vector<Teardown> teardown_;
};

}  // namespace cuda
}  // namespace braid
