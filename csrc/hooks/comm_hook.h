// DDP communication hooks in C++: allreduce (average), fp16 and bf16
// compression, PowerSGD, and int8 quantization with error feedback.
//
// Contract (for braid's reducer, PyTorch's DDP and the Python bindings):
//
//  * Every hook is a braid::hooks::CommHook, which is a c10d::CommHookInterface.
//    A hook is created once per model with a process group and its options,
//    keeps per-bucket state (keyed by GradBucket::getIndex()), and is shared:
//    hold it as std::shared_ptr<CommHook>. A C++ caller that needs a
//    std::unique_ptr<c10d::CommHookInterface> (c10d::Reducer-style
//    register_comm_hook) wraps the shared hook with asUniqueHook(hook).
//  * runHook(bucket) reads bucket.getBufferRef() (a flat, contiguous, floating
//    tensor), getIndex(), isLast() and, for PowerSGD only, getGradients(). It
//    may modify the buffer in place and returns a future whose value is a
//    one-element tensor list holding the averaged bucket (usually the buffer
//    itself). parseHookResult() accepts that list or a bare tensor.
//  * Hooks average: the result is the mean over the group, as PyTorch's hooks.
//  * Arguments are checked on the caller's thread (braid::Error); failures of
//    the collectives reach the returned future as its error.
//  * Python: torch_braid._C._CommHook holds a std::shared_ptr<CommHook> and is
//    bound as a subclass of torch_braid._C.CommHook, the binding of
//    c10d::CommHookInterface (reducer/comm_hook_py.h). torch_braid.hooks.*_state()
//    objects return it from state._cpp_hook(), so a binding that takes a
//    std::shared_ptr<c10d::CommHookInterface> (braid's reducer) accepts it
//    as is. The same hook object serves PyTorch's DDP through the Python hook
//    functions of torch_braid.hooks (PythonCommHook -> CommHook::run).
//
// See Note [Collective order in hooks] for why every collective a hook issues
// is issued from the thread that calls runHook.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <vector>

namespace braid {
class ProcessGroupBraid;

namespace hooks {

// Note [Collective order in hooks]
// Ranks pair collectives by the order in which they are issued on a group
// (gloo by a per-call tag, braid by a sequence number). DDP runs the hooks of
// the buckets one after the other on its autograd thread, so collectives
// issued inside runHook come in the same order on every rank. A collective
// issued later from a future callback would instead run on whichever thread
// completed the previous one, and could overtake the next bucket's collective
// on one rank but not on another: mismatched collectives, i.e. a hang or
// silently mixed buckets. (PyTorch's Python PowerSGD hook issues its second
// and third allreduce from callbacks and blocks in them; on a group with a
// single worker thread that even deadlocks.) So hooks issue every collective
// from runHook, and wait there when a collective needs an earlier result
// (PowerSGD waits for the small P allreduce before computing Q); callbacks
// only decompress.

// What a hook reads from a bucket. Built from a c10d::GradBucket (DDP's
// reducer, braid's reducer) or from Python's GradBucket (buffer(), index(),
// is_last(), gradients()).
struct BucketView {
  size_t index = 0;
  bool isLast = false;
  at::Tensor buffer;  // flat, contiguous, floating; the hook may write into it
  // Per parameter, in bucket order: offset in buffer (elements) and shape.
  // Filled only when the hook's needsLayout() is true.
  std::vector<int64_t> offsets;
  std::vector<std::vector<int64_t>> shapes;

  // Fills offsets/shapes from per-parameter views of buffer; checks that each
  // view lies inside buffer.
  void setLayout(const std::vector<at::Tensor>& gradients, const char* op, int rank);
};

// Note [Which branch a hook ran]
// Each arithmetic step of a hook on a bucket (a cast, a quantization, a
// dequantization, a Gram-Schmidt pass) takes one of two branches: ATen ops
// on the bucket's device (Note [Hooks on CUDA buckets]) or the CPU loops
// over host memory. Each step counts itself under the memory it ran on, so
// that a test of a CUDA bucket sees the device branch ran, as often as the
// hook's arithmetic implies, and the host one never: the values alone
// cannot tell, since both branches give the same bits. Per bucket: the
// fp16/bf16 hooks on a float32 bucket 2 (the cast down, the cast back;
// on the host inside braid's narrowed allreduce where that runs), the int8
// hook 2 (quantize, dequantize), PowerSGD 2 per compressed matrix on a
// compressing step (Q's and P's Gram-Schmidt). Steps that are ATen ops on
// either device (a plain division, allreduce's mean, a float64 bucket's
// cast) are not counted. Callbacks hold the counts by value: the hook may be
// gone by then.
struct BranchCounts {
  std::atomic<int64_t> device{0};
  std::atomic<int64_t> host{0};
  void count(const at::Tensor& on) { (on.is_cpu() ? host : device).fetch_add(1); }
};

class CommHook : public c10d::CommHookInterface {
 public:
  explicit CommHook(c10::intrusive_ptr<c10d::ProcessGroup> pg);
  ~CommHook() override;

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) final;
  at::Tensor parseHookResult(const c10::IValue& result) final;

  // The hook proper. The future's value is a one-element tensor list.
  virtual c10::intrusive_ptr<c10::ivalue::Future> run(BucketView& bucket) = 0;
  virtual const char* name() const = 0;
  // Whether run() needs BucketView::offsets/shapes.
  virtual bool needsLayout() const { return false; }
  // The residual this rank carries to the next step for a bucket, if the hook
  // uses error feedback and has one (undefined tensor otherwise).
  virtual at::Tensor residual(size_t bucketIndex) const { return at::Tensor(); }
  // Completed iterations, counted at each last bucket (PowerSGD).
  virtual int64_t iteration() const { return 0; }

  // Bytes this rank has handed to collectives (payload), and the bytes each
  // rank moves on the wire for them under the nccl-tests convention:
  // allreduce S * 2(n-1)/n, allgather S_in * (n-1). Counted when issued.
  int64_t payloadBytes() const { return payloadBytes_.load(); }
  int64_t wireBytes() const { return wireBytes_.load(); }
  // The hook's arithmetic steps so far, by the memory they ran on (Note
  // [Which branch a hook ran]).
  int64_t deviceSteps() const { return branches_->device.load(); }
  int64_t hostSteps() const { return branches_->host.load(); }
  void resetCounters();

  const c10::intrusive_ptr<c10d::ProcessGroup>& processGroup() const { return pg_; }
  int rank() const { return rank_; }
  int worldSize() const { return size_; }

 protected:
  // Sum-allreduce of one tensor; the future's value is a one-element list.
  c10::intrusive_ptr<c10::ivalue::Future> allreduceSum(at::Tensor& tensor);
  c10::intrusive_ptr<c10::ivalue::Future> allreduceWith(at::Tensor& tensor,
                                                        c10d::ReduceOp op);
  // buffer / world size, then sum; the future's value is [buffer]. On a
  // braid group where that is exact, one AVG allreduce that divides each
  // share while it is in cache (Note [Averaging inside the allreduce] in
  // reducer/reducer.cc), instead of a pass of its own over the buffer.
  c10::intrusive_ptr<c10::ivalue::Future> allreduceMean(at::Tensor buffer);
  // Counts an allreduce of `bytes` per rank (payloadBytes, wireBytes).
  void countAllreduce(int64_t bytes);
  // Note [Which branch a hook ran]
  const std::shared_ptr<BranchCounts> branches_ = std::make_shared<BranchCounts>();
  // outputs[r] receives rank r's input (same shape and dtype on every rank).
  c10::intrusive_ptr<c10::ivalue::Future> allgather(at::Tensor& input,
                                                    std::vector<at::Tensor>& outputs);
  // Checks the buffer a bucket hands us (1-D, contiguous, floating, on the
  // CPU or a CUDA device). See Note [Hooks on CUDA buckets].
  void checkBuffer(const at::Tensor& buffer, const char* op) const;
  // A flat tensor for (bucket, slot) on `device`. On the CPU it is reused from
  // an earlier step when nothing else holds it any more (else a fresh one,
  // which is kept instead): a bucket of 100 MB would otherwise cost fresh
  // pages, i.e. page faults, every step. On a GPU it is always fresh: see
  // Note [Hooks on CUDA buckets].
  at::Tensor scratch(size_t bucket, int slot, int64_t numel, at::ScalarType dtype,
                     c10::Device device);

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  const int rank_;
  const int size_;
  ProcessGroupBraid* const braid_;  // null unless pg_'s CPU backend is braid's

 private:
  std::atomic<int64_t> payloadBytes_{0};
  std::atomic<int64_t> wireBytes_{0};
  std::mutex scratchMu_;
  std::map<std::pair<size_t, int>, at::Tensor> scratch_;
};

// Note [Hooks on CUDA buckets]
// On a CUDA bucket the hooks do their arithmetic with ATen ops
// (aten_kernels.h), which run as kernels on the current stream: in runHook the
// caller's, after the gradients; in a Future callback, a stream c10's Future
// took from the pool and made wait for the collective. CPU buckets keep the
// fused CPU loops (math/cast.h, int8_kernels.h). Two consequences:
//  * no data_ptr() loop may touch a CUDA bucket, and no value is read back to
//    the host (it would wait for the GPU);
//  * memory a callback's kernels use is still in use after the callback
//    returns. The caching allocator knows that only for the streams a tensor
//    was recorded on (the Future records its own values), so a callback
//    records what else it touches (recordOnCurrentStream), and scratch
//    tensors are not reused by hand on a GPU: "nothing holds it any more"
//    says nothing about kernels still queued on another stream.

// Tells the caching allocator that t's memory is used by the kernels queued
// on the current stream of t's device, so that it is not handed out again
// before they ran. Nothing for CPU tensors.
void recordOnCurrentStream(const at::Tensor& t);

// The value type of every hook future: a list of tensors.
c10::TypePtr tensorListType();
c10::IValue tensorListValue(const at::Tensor& t);

// ---- Hooks ------------------------------------------------------------------

// buffer / world size, then sum: the mean, as c10d's AllReduceCommHook.
std::shared_ptr<CommHook> makeAllreduceHook(c10::intrusive_ptr<c10d::ProcessGroup> pg);
// Divide by the world size, round to float16 / bfloat16, sum, widen back:
// half the bytes of allreduce (see CastCompressHook in allreduce_hooks.cc).
std::shared_ptr<CommHook> makeFp16CompressHook(c10::intrusive_ptr<c10d::ProcessGroup> pg);
std::shared_ptr<CommHook> makeBf16CompressHook(c10::intrusive_ptr<c10d::ProcessGroup> pg);

// Same fields and defaults as torch's PowerSGDState.
struct PowerSGDOptions {
  int64_t matrixApproximationRank = 1;
  // Plain allreduce before this iteration. Must be > 1 with error feedback or
  // warm start: DDP rebuilds its buckets after the first iteration.
  int64_t startPowerSGDIter = 1000;
  // A matrix is compressed only if (n + m) * r * minCompressionRate < n * m.
  double minCompressionRate = 2.0;
  bool useErrorFeedback = true;
  bool warmStart = true;
  double orthogonalizationEpsilon = 0.0;
  uint64_t randomSeed = 0;
};
std::shared_ptr<CommHook> makePowerSGDHook(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                           const PowerSGDOptions& options);

// See Note [int8 hook] in int8_hook.cc.
struct Int8Options {
  int64_t chunkSize = 512;  // elements sharing one fp32 scale
  bool useErrorFeedback = true;
};
std::shared_ptr<CommHook> makeInt8Hook(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                       const Int8Options& options);

// A unique_ptr that forwards to a shared hook, for APIs that take ownership.
std::unique_ptr<c10d::CommHookInterface> asUniqueHook(std::shared_ptr<CommHook> hook);

}  // namespace hooks
}  // namespace braid
