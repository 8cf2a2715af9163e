// ProcessGroupBraid: the c10d backend. The only layer (with compat.h) that
// knows c10d; everything below it works on raw bytes.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "c10d/compat.h"
#include "c10d/flight_recorder.h"
#include "collectives/shm/communicator.h"
#include "common/rank_pinning.h"

namespace braid {

class Engine;       // engine/engine.h: worker thread, transport, collectives
class CudaBinding;  // c10d/cuda/cuda_context.h: the group's CUDA device and comm stream
class CudaContext;
class BufferAdoption;  // c10d/buffer_adoption.h: Note [Adopting a repeated buffer]
namespace cuda {
enum class NcclOpKind;  // cuda/nccl/nccl_executor.h
struct NcclOp;          // cuda/nccl/nccl_executor.h
}

class ProcessGroupBraid : public compat::BackendBase {
 public:
  ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, std::string groupName = "");
  ~ProcessGroupBraid() override;

  const std::string getBackendName() const override { return "braid"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts =
                                               c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts =
                                               c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts =
                                            c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts =
                                               c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts =
                                                     c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  // torch 2.x only; on 1.13 these are plain members that nothing calls.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) BRAID_TORCH2_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) BRAID_TORCH2_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts =
                                            c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts =
                                             c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts =
                                                    c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts =
                                                   c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts =
                                              c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts =
                                             c10d::BarrierOptions()) override;
  // process_group_monitored.cc: gloo's monitored barrier, on the caller's thread.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;

  // Note [Overrides that depend on the torch version]
  // c10d::Backend gained these virtuals over torch 2.x (abort and shutdown
  // by 2.8; destroy_process_group calls shutdown). They are declared without
  // `override` so that one source builds on every torch: where the base has
  // the virtual, these override it (same signature); where it has not (1.13,
  // 2.6), they are plain members that braid's own bindings call.
  //
  // shutdown(): lets the ops already issued finish (each within its timeout),
  // then stops the threads and releases the shared memory. Later ops fail.
  void shutdown();  // NOLINT(modernize-use-override): see the Note
  // abort(): fails every pending and queued op now, from any thread; ranks
  // blocked in an op return at once with an error.
  void abort();  // NOLINT(modernize-use-override): see the Note
  // torch 2.14's Backend::setTimeout (torchft's set_timeout): the timeout of
  // ops issued from now on. Same Note as above for the missing `override`.
  void setTimeout(std::chrono::milliseconds timeout);  // NOLINT(modernize-use-override)
  // torchft's errored(): why the group can no longer be used, or "" while it
  // can. The first error that broke it (a timeout or a lost peer, which leave
  // the ranks out of step), else abort(). From any thread; torchft then
  // aborts the group and builds a new one over a fresh store prefix
  // (tests/python/test_torchft.py follows that flow).
  std::string errored() const;
  // The group's CUDA state, once a CUDA op made it (else null): tests reach
  // its comm stream through it.
  std::shared_ptr<CudaContext> cudaContext() const;
  // Note [Registered buffers] (collectives/shm/registered.h): a zeroed CPU
  // tensor of `numel` elements in memory every rank of the group maps, so
  // that its allreduce works in place in the peers' memory. Collective: every
  // rank calls it alike. Where the group cannot register it (ranks on
  // several hosts, a rank that cannot map its peers' memory,
  // BRAID_SHARED_BUFFERS=0 on any rank), the tensor is ordinary memory.
  at::Tensor registeredEmpty(int64_t numel, at::ScalarType dtype);
  // Whether `t`'s memory lies in a region this group registered (and has not
  // released): its allreduce then takes the registered path.
  bool isRegistered(const at::Tensor& t) const;
  // How many buffers this rank has moved into registered memory (Note
  // [Adopting a repeated buffer] in c10d/buffer_adoption.h).
  uint64_t adoptedBuffers() const;
  // Note [Allreduce on a narrower wire] (collectives/shm/collectives.h):
  // whether allreduceNarrowed takes `t`: a contiguous float32 CPU tensor, in
  // a group whose ranks share one host (the same answer on every rank).
  bool canNarrow(const at::Tensor& t) const;
  // Note [Averaging inside the allreduce] (reducer/reducer.cc): whether an
  // AVG allreduce of `t` gives the bits of dividing t by the world size, then
  // summing (a power-of-two world, a float32 or float64 CPU tensor).
  bool averagesExactly(const at::Tensor& t) const;
  // In place, t = float(sum over ranks of round16(t / divisor)): the sum in
  // float32 in rank order, rounded once to `wire` (kHalf or kBFloat16), as
  // the fp16/bf16 compression hooks compute it, with only 16-bit values
  // crossing between ranks. Collective. Throws unless canNarrow(t).
  c10::intrusive_ptr<c10d::Work> allreduceNarrowed(at::Tensor& t, at::ScalarType wire,
                                                   double divisor);
  // Note [Coalescing] (c10d/coalesced_work.h); same Note as above for the
  // missing `override`.
  bool supportsCoalescing() const { return true; }  // NOLINT(modernize-use-override)
  void startCoalescing();                            // NOLINT(modernize-use-override)
  c10::intrusive_ptr<c10d::Work> endCoalescing();    // NOLINT(modernize-use-override)

 private:
  using Body = std::function<void()>;
  // Runs body on the worker; its Work completes with `outputs` or the error.
  // `inputs` (for the flight recorder) empty: the op works in place.
  c10::intrusive_ptr<c10d::Work> launch(const collectives::OpDesc& d, c10d::OpType type,
                                        const char* title, std::vector<at::Tensor> outputs,
                                        Body body, c10::ArrayRef<at::Tensor> inputs = {});
  // Runs `check` (argument checks and launch) on the caller's thread; when it
  // throws, tells the peers through a poison header (Note [Op headers]).
  c10::intrusive_ptr<c10d::Work> guarded(collectives::OpKind kind,
                                         const std::function<c10::intrusive_ptr<c10d::Work>()>& check);
  collectives::OpDesc desc(collectives::OpKind kind, std::chrono::milliseconds optTimeout) const;
  // desc(), with the dtype (checked: the error names `op` and this rank),
  // count and shape of `t`: the description of an op over one tensor.
  collectives::OpDesc describe(collectives::OpKind kind, const at::Tensor& t, const char* op,
                               std::chrono::milliseconds optTimeout) const;
  c10::intrusive_ptr<c10d::Work> sendRecv(bool isSend, std::vector<at::Tensor>& tensors, int peer,
                                          int tag);
  // process_group_nccl.cc: whether a collective on `t` runs on the group's
  // NCCL executor (Note [Choosing a CUDA executor]), and running it there.
  bool onNccl(const at::Tensor& t, const char* op);
  // The same, for an op NCCL lacks (gather, scatter, alltoall): only where
  // the executor's NcclApi has it (Note [Collectives NCCL lacks] in
  // cuda/nccl/nccl_api.h), else the staged path.
  bool onNccl(const at::Tensor& t, const char* op, cuda::NcclOpKind kind);
  // A reduction: onNccl(t, op, kind), and the executor runs (dtype, redop)
  // (NcclExecutor::supportsReduction).
  bool onNccl(const at::Tensor& t, const char* op, cuda::NcclOpKind kind, DataType dtype,
              ReduceOp redop);
  c10::intrusive_ptr<c10d::Work> ncclLaunch(const collectives::OpDesc& d, c10d::OpType type,
                                            const char* title, std::vector<at::Tensor> outputs,
                                            const std::vector<at::Tensor>& inputs,
                                            cuda::NcclOpKind kind, const void* in, void* out,
                                            double factor);
  // `op` with its kind and buffers set; the rest comes from `d`.
  c10::intrusive_ptr<c10d::Work> ncclLaunch(const collectives::OpDesc& d, c10d::OpType type,
                                            const char* title, std::vector<at::Tensor> outputs,
                                            const std::vector<at::Tensor>& inputs,
                                            cuda::NcclOp op);
  // process_group_sparse.cc: allreduce of one sparse COO tensor (SUM), as gloo's.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts);

  // Records a Work issued inside a coalescing window; returns it.
  c10::intrusive_ptr<c10d::Work> tracked(c10::intrusive_ptr<c10d::Work> work);

  // The group's timeout for ops that set none; setTimeout() may change it
  // from any thread (ops already issued keep theirs).
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs_.load(std::memory_order_relaxed));
  }

  // The first error that broke the group, for errored(); the worker records
  // it, any thread reads it.
  struct FirstError {
    std::mutex mu;
    std::string what;
    void record(const std::string& why) {
      std::lock_guard<std::mutex> lock(mu);
      if (what.empty()) what = why;
    }
  };

  std::atomic<int64_t> timeoutMs_;
  // Shared with the jobs, which may finish on a caller's thread.
  std::shared_ptr<FirstError> firstError_ = std::make_shared<FirstError>();
  std::atomic<uint64_t> launched_{0};
  std::mutex coalesceMu_;
  // Read without the lock on every op (tracked()); changed under it.
  std::atomic<bool> coalescing_{false};
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  std::atomic<uint64_t> monitoredBarriers_{0};  // numbers each call's messages
  std::unique_ptr<Engine> engine_;
  bool narrowsOnWire_ = false;  // the group's Group::narrowsOnWire(), read once
  // Note [Adopting a repeated buffer]; null where the group has no registered
  // memory. Shared with the jobs that move buffers.
  std::shared_ptr<BufferAdoption> adoption_;
  std::shared_ptr<RankPin> pin_;  // Note [Pinning ranks on a full host]; may be null
  std::unique_ptr<CudaBinding> cuda_;  // Note [One device per group]
  std::unique_ptr<GroupRecorder> fr_;  // Note [Flight recorder]
  std::atomic<bool> frNamed_{false};   // torch's name for the group was read
  void nameForRecorder();
  // Records a scheduled op (0: the recorder is off); p2p ops give the peer.
  uint64_t frRecord(c10d::OpType type, c10::ArrayRef<at::Tensor> inputs,
                    c10::ArrayRef<at::Tensor> outputs, int peer = -2);

 public:
  // torch 2.x tells (through torch_braid's creator) the group's name and its
  // members' global ranks; 1.13 does not, and dumps show 0..size-1.
  void describeForRecorder(const std::string& name, const std::vector<int>& globalRanks) {
    fr_->describe(name, "", globalRanks);
  }
};

// A c10d::ProcessGroup that runs on braid, for C++ programs (on torch 2.x the
// backend is wrapped in a ProcessGroup for the CPU device).
c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout = std::chrono::minutes(30));

}  // namespace braid
