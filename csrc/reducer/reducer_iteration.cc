// Reducer: the per-iteration entry points and the end of backward.
// See Note [Reducer iteration] in reducer.cc.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

#include "common/error.h"
#include "common/logging.h"
#include "reducer/reducer.h"

namespace braid {

void Reducer::prepareForForward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (requireFinalize_) throwUnfinished();
  rebuildBucketsIfReady();
}

void Reducer::prepareForBackward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  expectHooks_ = true;
  requireFinalize_ = true;
  finalizeQueued_ = false;
  markedUnused_ = false;
  nextBucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = b.members.size();
    b.future.reset();
  }
  usedFuture_.reset();
  if (!rebuilt_) readyOrder_.clear();
  unusedLocal_.clear();
  unusedSnapshots_.clear();
  if (options_.static_graph) {
    if (syncedIterations_ == 0) {
      hookCount_.assign(params_.size(), 0);
      firstHookOrder_.clear();
    } else {
      hooksLeft_ = hookCount_;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (hookCount_[i] == 0) unusedLocal_.push_back(i);
      }
    }
  } else if (options_.find_unused_parameters) {
    unusedLocal_ = findUnusedParams(outputs);
  }
}

std::vector<size_t> Reducer::findUnusedParams(const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  auto visit = [&](torch::autograd::Node* n) {
    if (n && seen.insert(n).second) stack.push_back(n);
  };
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (out.grad_fn()) {
      visit(out.grad_fn().get());
    } else {
      visit(torch::autograd::impl::try_get_grad_accumulator(out).get());  // a leaf output
    }
  }
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    for (const auto& edge : n->next_edges()) visit(edge.function.get());
  }
  std::vector<size_t> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!seen.count(params_[i].gradAcc.get())) unused.push_back(i);
  }
  return unused;
}

void Reducer::finalizeBackward() {
  at::NoGradGuard noGrad;
  std::lock_guard<std::mutex> lock(mutex_);
  expectHooks_ = false;
  requireFinalize_ = false;
  if (staticFirstIteration()) {
    // Gradients are complete now, however many hooks each parameter needed.
    for (size_t i : firstHookOrder_) markReady(i);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (hookCount_[i] == 0) markReady(i, /*locallyUnused=*/true);
    }
  }
  BRAID_ENFORCE(nextBucket_ == buckets_.size(), "ddp", rank_, "backward ended with ", nextBucket_,
                " of ", buckets_.size(), " buckets launched");
  std::vector<char> globallyUnused(params_.size(), 0);
  if (usedFuture_) {
    usedFuture_->waitAndThrow();
    at::Tensor used = usedBuffer_.cpu();
    for (size_t i = 0; i < params_.size(); ++i) {
      globallyUnused[i] = used.data_ptr<int32_t>()[i] == 0;
    }
    usedFuture_.reset();
    if (options_.static_graph) staticGloballyUnused_ = globallyUnused;
  } else if (options_.static_graph) {
    globallyUnused = staticGloballyUnused_;
  }
  for (auto& bucket : buckets_) {
    bucket.future->waitAndThrow();
    at::Tensor result = bucket.buffer;
    if (hook_) {
      result = hook_->parseHookResult(bucket.future->value());
      BRAID_ENFORCE(result.numel() == bucket.buffer.numel(), "ddp", rank_,
                    "the comm hook returned ", result.numel(), " elements for a bucket of ",
                    bucket.buffer.numel());
      // Grads alias the buffer in view mode, so the result must land there.
      if (options_.gradient_as_bucket_view && !result.is_alias_of(bucket.buffer)) {
        bucket.buffer.copy_(result.view({-1}));
        result = bucket.buffer;
      }
    }
    for (size_t s = 0; s < bucket.members.size(); ++s) {
      size_t i = bucket.members[s];
      if (globallyUnused[i]) {  // nobody used it: keep .grad as it was
        auto snap = unusedSnapshots_.find(i);
        if (snap != unusedSnapshots_.end()) bucket.views[s].copy_(snap->second);
        continue;
      }
      at::Tensor out = result.is_alias_of(bucket.buffer)
                           ? bucket.views[s]
                           : result.view({-1})
                                 .narrow(0, static_cast<int64_t>(bucket.offsets[s]),
                                         static_cast<int64_t>(bucket.lengths[s]))
                                 .view(params_[i].tensor.sizes());
      copyBucketToGrad(i, out);
    }
    bucket.future.reset();
  }
  if (options_.static_graph && syncedIterations_ == 0) hooksLeft_ = hookCount_;
  unusedSnapshots_.clear();
  std::fill(localUsed_.begin(), localUsed_.end(), 0);
  ++syncedIterations_;
}

void Reducer::copyBucketToGrad(size_t index, const at::Tensor& result) {
  Param& p = params_[index];
  at::Tensor& grad = p.tensor.mutable_grad();
  if (options_.gradient_as_bucket_view) {
    const at::Tensor& view = buckets_[p.bucket].views[p.slot];
    if (!grad.defined() || !grad.is_alias_of(view)) grad = view;  // unused here, or reset to None
    return;
  }
  if (grad.defined()) {
    grad.copy_(result);
  } else {
    grad = result.clone();  // keeps the view's strides, which are the parameter's
  }
}

void Reducer::rebuildBucketsIfReady() {
  // Every rank has a complete order after its first finished synced backward,
  // so all ranks take this branch in the same forward.
  if (rebuilt_ || readyOrder_.size() != params_.size() || params_.empty()) return;
  std::vector<int64_t> order(readyOrder_.begin(), readyOrder_.end());
  std::vector<at::Tensor> ts{at::tensor(order, at::kLong)};
  c10d::BroadcastOptions opts;
  opts.rootRank = 0;
  pg_->broadcast(ts, opts)->wait();
  const int64_t* agreed = ts[0].data_ptr<int64_t>();
  std::vector<size_t> rootOrder(agreed, agreed + order.size());
  buildBuckets(rootOrder);
  rebuilt_ = true;
  readyOrder_.clear();
}

void Reducer::throwUnfinished() const {
  std::string missing;
  size_t count = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (++count <= 20) missing += strCat(count > 1 ? ", " : "", names_[i], " (index ", i, ")");
  }
  if (count > 20) missing += strCat(" and ", count - 20, " more");
  if (options_.static_graph && syncedIterations_ > 0) {
    BRAID_THROW(::braid::Error, "ddp", rank_,
                "expected to have finished reducing gradients in the prior iteration before "
                "starting a new one. Under static_graph=true these parameters got fewer "
                "gradient hooks than in the first iteration (the graph changed): ",
                missing, ".");
  }
  BRAID_THROW(::braid::Error, "ddp", rank_,
              "expected to have finished reducing gradients in the prior iteration before "
              "starting a new one. Parameters that did not get a gradient on rank ",
              rank_, ": ", missing,
              count == params_.size() ? " (none did: was backward() skipped after a forward "
                                        "run with grad enabled and sync on?)"
                                      : "",
              ". If your model has parameters that are not used to produce the loss, pass "
              "find_unused_parameters=true to DistributedDataParallel, and make sure every "
              "output of forward() takes part in the loss.");
}

}  // namespace braid
