// The DDP gradient reducer: gradients are copied into flat per-dtype/device
// buckets by autograd hooks, each bucket is allreduced the moment backward has
// filled it (overlapping the rest of backward), and the averages are written
// back to param.grad when backward ends. See Note [Reducer iteration].
//
// Works over any c10d::ProcessGroup (gloo, nccl, braid): it only calls
// allreduce/broadcast and Work::getFuture().
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c10d/compat.h"

namespace braid {

class ProcessGroupBraid;  // c10d/process_group.h

struct ReducerOptions {
  int64_t first_bucket_bytes = int64_t(1) << 20;
  int64_t bucket_cap_bytes = int64_t(25) << 20;
  // Detect parameters that get no gradient on this rank (traversing the
  // autograd graph from the forward outputs) and reduce them as zeros; a
  // parameter unused on every rank keeps its .grad untouched.
  bool find_unused_parameters = false;
  // param.grad becomes a view into its bucket: no copy in and out.
  bool gradient_as_bucket_view = false;
  // The set of used parameters and the number of gradient hooks per
  // parameter are learned in the first iteration and must not change.
  bool static_graph = false;
};

class Reducer {
 public:
  // params: distinct leaf tensors that require grad, with the same order and
  // shapes on every rank (see verifyParamsAcrossRanks). names: one per param,
  // used in error messages.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          c10::intrusive_ptr<c10d::ProcessGroup> pg, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before a forward whose backward must reduce (grad mode on, sync on):
  // throws if the previous backward did not finish reducing, and after the
  // first iteration rebuilds the buckets in gradient-ready order (collective).
  void prepareForForward();
  // Call after that forward, with its output tensors (only read when
  // find_unused_parameters is set): arms the hooks for one backward.
  void prepareForBackward(const std::vector<at::Tensor>& outputs);

  // The wrappers skip prepareFor* while sync is off (no_sync): gradients then
  // accumulate locally and are reduced by the next synced backward.
  void setSync(bool sync);
  bool sync() const;

  // Replaces the default allreduce + divide-by-world-size. The hook sees
  // undivided gradients and decides the averaging itself.
  void registerCommHook(std::shared_ptr<c10d::CommHookInterface> hook);

  std::vector<std::vector<size_t>> bucketIndices() const;  // param indices per bucket
  // Per bucket: whether its allreduce averages (Note [Averaging inside the
  // allreduce]), given the hook registered now.
  std::vector<bool> bucketsAveragedInAllreduce() const;
  // Per bucket: whether its memory is registered with the group (Note
  // [Registered buffers]), so that its allreduce works in the peers' buckets.
  std::vector<bool> bucketsRegistered() const;
  bool bucketsRebuilt() const;
  int64_t syncedIterations() const;
  const std::vector<std::string>& names() const { return names_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& processGroup() const { return pg_; }

 private:
  struct Param {
    at::Tensor tensor;
    compat::NodePtr gradAcc;  // keeps the accumulator (and our hook) alive
    uintptr_t hookKey = 0;
    size_t bucket = 0;
    size_t slot = 0;
  };
  struct Bucket {
    at::Tensor buffer;  // flat, one dtype and device
    std::vector<size_t> members;
    std::vector<size_t> offsets, lengths;
    std::vector<at::Tensor> views;  // aliases of buffer shaped like each param
    size_t pending = 0;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    // Note [Averaging inside the allreduce]: no divide pass over the bucket;
    // the allreduce averages (when no comm hook is registered).
    bool averageInAllreduce = false;
  };

  void buildBuckets(const std::vector<size_t>& order);
  at::Tensor allocateBucket(int64_t numel, const at::TensorOptions& options);
  void autogradHook(size_t index);
  void markReady(size_t index, bool locallyUnused = false);
  void copyGradToBucket(size_t index, bool locallyUnused);
  bool averagesInAllreduce(const Bucket& bucket) const { return bucket.averageInAllreduce && !hook_; }
  void launchReadyBuckets();
  void launchBucket(size_t b);
  void queueFinalize();
  void finalizeBackward();
  void copyBucketToGrad(size_t index, const at::Tensor& result);
  void rebuildBucketsIfReady();
  std::vector<size_t> findUnusedParams(const std::vector<at::Tensor>& outputs) const;
  bool tracksUse() const;
  bool staticFirstIteration() const;
  [[noreturn]] void throwUnfinished() const;
  std::string describeParam(size_t index) const;

  const std::vector<std::string> names_;
  const c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  const ReducerOptions options_;
  const int rank_;
  at::Tensor divisor_;  // world size, as a wrapped scalar so it keeps the bucket's dtype
  // The group's CPU backend when it is braid's (pg_ keeps it alive), else null:
  // registered buckets and averaging inside the allreduce need it.
  ProcessGroupBraid* const braid_;

  mutable std::mutex mutex_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::shared_ptr<c10d::CommHookInterface> hook_;
  bool sync_ = true;

  // Per synced iteration.
  bool expectHooks_ = false;      // prepareForBackward armed the hooks
  bool requireFinalize_ = false;  // armed, and finalizeBackward has not run
  bool finalizeQueued_ = false;
  bool markedUnused_ = false;
  size_t nextBucket_ = 0;
  std::vector<char> ready_;
  std::vector<size_t> unusedLocal_;
  // Gradients of locally unused parameters that alias their bucket (view
  // mode), restored if no rank used the parameter: its .grad stays untouched.
  std::map<size_t, at::Tensor> unusedSnapshots_;
  std::vector<int32_t> localUsed_;  // since the last synced backward (no_sync steps count)
  at::Tensor usedBuffer_;
  c10::intrusive_ptr<c10::ivalue::Future> usedFuture_;
  int64_t syncedIterations_ = 0;

  // Bucket rebuild, once, in the order gradients became ready.
  bool rebuilt_ = false;
  std::vector<size_t> readyOrder_;

  // static_graph: learned in the first synced iteration.
  std::vector<int> hookCount_;
  std::vector<int> hooksLeft_;
  std::vector<size_t> firstHookOrder_;
  std::vector<char> staticGloballyUnused_;
};

}  // namespace braid
