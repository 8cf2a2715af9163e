#include "reducer/reducer.h"

#include "c10d/compat.h"

#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>

#include "c10d/process_group.h"
#include "common/error.h"
#include "common/logging.h"
#include "reducer/buckets.h"

// Note [Reducer iteration]
// One synced iteration, as seen by the reducer:
//  1. prepareForForward: the previous backward must have finished (else the
//     error names the parameters that got no gradient); after the first
//     synced iteration the buckets are rebuilt once, in the order gradients
//     became ready on rank 0 (broadcast, so every rank agrees).
//  2. prepareForBackward arms the hooks. With find_unused_parameters the
//     autograd graph is walked from the outputs; unreachable parameters are
//     marked ready (as zeros, or their no_sync-accumulated gradient) at the
//     first hook, so their buckets do not wait forever.
//  3. Each grad accumulator's post hook copies the gradient into its bucket
//     view (divided by the world size unless a comm hook decides). When a
//     bucket is full, it and every full bucket after the last launched one are
//     launched in index order: collectives must be issued in the same order on
//     every rank, whatever the local ready order.
//  4. After the last bucket, the used-parameter bitmap is allreduced
//     (find_unused_parameters) and finalizeBackward is queued as an autograd
//     final callback: it waits for every bucket and writes the results to
//     param.grad, so gradients are final when backward() returns.
// With static_graph, the first synced backward only counts hooks per
// parameter; finalizeBackward marks everything ready and reduces then. Later
// iterations expect the same counts and skip the bitmap.
//
// Note [Averaging inside the allreduce]
// Without a comm hook the reducer averages: each gradient divided by the
// world size, then summed (torch's DDP does the same). In view mode that
// divide is a pass of its own over every bucket, read and written once:
// on a CPU host whose cores all compute, the step is bound by memory
// bandwidth, and that pass cost as much as a fifth of the whole allreduce's
// traffic (benchmarks/ddp.py, issue 31). A braid group averages inside the
// allreduce instead (ReduceOp::AVG): it divides each reduced share while
// the share is still in cache. The bits are the same as dividing first
// only where division by the world size is exact: a power of two, and a
// float32 or float64 bucket (x / 2^k is exact, so sum(x / 2^k) and
// sum(x) / 2^k round alike), except for results in the subnormal range,
// where dividing first would have dropped low bits. float16 and bfloat16
// buckets keep the divide pass: summed in float32 and rounded once, a sum
// that overflows the narrow type would be inf where the sum of the halved
// gradients is finite. Other world sizes, other groups (gloo has no AVG),
// and CUDA buckets (the divide runs on the device, off the host's memory)
// keep the divide pass too, so their bits are as before. The allreduce hook
// (hooks/allreduce_hooks.cc, for PyTorch's DDP too) averages the same way,
// under the same test (ProcessGroupBraid::averagesExactly).

namespace braid {
namespace {

// Our own hook type rather than autograd::utils::LambdaPostHook, whose
// constructor changed across torch 2.x releases; this interface did not.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 c10::intrusive_ptr<c10d::ProcessGroup> pg, ReducerOptions options)
    : names_(std::move(names)),
      pg_(std::move(pg)),
      options_(options),
      rank_(pg_ ? pg_->getRank() : -1),
      braid_(dynamic_cast<ProcessGroupBraid*>(compat::backendFor(pg_, c10::DeviceType::CPU))) {
  BRAID_ENFORCE(pg_, "ddp", rank_, "the process group is null");
  BRAID_ENFORCE(names_.size() == params.size(), "ddp", rank_, "got ", names_.size(), " names for ",
                params.size(), " parameters");
  BRAID_ENFORCE(options_.first_bucket_bytes > 0 && options_.bucket_cap_bytes > 0, "ddp", rank_,
                "bucket sizes must be positive: first bucket ", options_.first_bucket_bytes,
                " bytes vs cap ", options_.bucket_cap_bytes, " bytes");
  divisor_ = at::native::wrapped_scalar_tensor(static_cast<double>(pg_->getSize()));
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  params_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    BRAID_ENFORCE(p.defined(), "ddp", rank_, "parameter '", names_[i], "' (index ", i,
                  ") is undefined");
    BRAID_ENFORCE(p.requires_grad() && p.is_leaf(), "ddp", rank_, "parameter '", names_[i],
                  "' (index ", i,
                  ") must be a leaf tensor that requires grad (requires_grad=", p.requires_grad(),
                  ", is_leaf=", p.is_leaf(), ")");
    BRAID_ENFORCE(p.layout() == at::kStrided, "ddp", rank_, "parameter '", names_[i], "' (index ",
                  i, ") is not a dense tensor");
    auto dup = seen.emplace(p.unsafeGetTensorImpl(), i);
    BRAID_ENFORCE(dup.second, "ddp", rank_, "parameter '", names_[i], "' (index ", i,
                  ") is the same tensor as '", names_[dup.first->second], "' (index ",
                  dup.first->second, "); pass shared parameters once");
    params_[i].tensor = p;
    // Keep the accumulator alive: the tensor only holds it weakly, and a new
    // one (without our hook) would be made if it died.
    params_[i].gradAcc = torch::autograd::impl::grad_accumulator(p);
    params_[i].hookKey = params_[i].gradAcc->add_post_hook(
        std::make_unique<GradReadyHook>([this, i] { autogradHook(i); }));
  }
  ready_.assign(params_.size(), 0);
  localUsed_.assign(params_.size(), 0);
  // Gradients are produced roughly in reverse order of definition.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  buildBuckets(order);
}

Reducer::~Reducer() {
  for (auto& p : params_) {
    if (p.gradAcc) p.gradAcc->del_post_hook(p.hookKey);
  }
}

void Reducer::buildBuckets(const std::vector<size_t>& order) {
  at::NoGradGuard noGrad;
  std::map<std::tuple<int, int, int>, int> keys;
  std::vector<BucketParam> infos;
  for (const auto& p : params_) {
    auto key = std::make_tuple(static_cast<int>(p.tensor.scalar_type()),
                               static_cast<int>(p.tensor.device().type()),
                               static_cast<int>(p.tensor.device().index()));
    int id = keys.emplace(key, static_cast<int>(keys.size())).first->second;
    infos.push_back({p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size()), id});
  }
  auto groups =
      assignBuckets(infos, order, {options_.first_bucket_bytes, options_.bucket_cap_bytes});
  std::vector<Bucket> buckets(groups.size());
  for (size_t b = 0; b < groups.size(); ++b) {
    Bucket& bucket = buckets[b];
    bucket.members = groups[b];
    size_t total = 0;
    for (size_t i : bucket.members) {
      bucket.offsets.push_back(total);
      bucket.lengths.push_back(static_cast<size_t>(params_[i].tensor.numel()));
      total += bucket.lengths.back();
    }
    const at::Tensor& first = params_[bucket.members.front()].tensor;
    bucket.buffer = allocateBucket(static_cast<int64_t>(total), first.options());
    bucket.averageInAllreduce = braid_ && braid_->averagesExactly(first);
    for (size_t s = 0; s < bucket.members.size(); ++s) {
      Param& p = params_[bucket.members[s]];
      p.bucket = b;
      p.slot = s;
      // An alias made with set_ rather than a view op: a view would make
      // grad.detach_() (zero_grad in the C++ optimizers) throw when the
      // gradient is the bucket view.
      std::vector<int64_t> strides = p.tensor.strides().vec();
      if (!p.tensor.is_non_overlapping_and_dense()) {
        int64_t stride = 1;
        for (int64_t d = p.tensor.dim() - 1; d >= 0; --d) {
          strides[d] = stride;
          stride *= std::max<int64_t>(p.tensor.size(d), 1);
        }
      }
      at::Tensor view = at::empty({0}, bucket.buffer.options());
      view.set_(bucket.buffer.storage(),
                bucket.buffer.storage_offset() + static_cast<int64_t>(bucket.offsets[s]),
                p.tensor.sizes(), strides);
      bucket.views.push_back(view);
      if (options_.gradient_as_bucket_view && p.tensor.grad().defined()) {
        view.copy_(p.tensor.grad());
        p.tensor.mutable_grad() = view;
      }
    }
    bucket.pending = bucket.members.size();
  }
  buckets_ = std::move(buckets);
  BRAID_LOG(kDebug, "ddp", rank_) << "built " << buckets_.size() << " buckets for "
                                  << params_.size() << " parameters";
}

// Note [Registered buffers] (collectives/shm/registered.h): on a braid group,
// CPU buckets live in memory every rank maps, and their allreduce reads and
// writes the peers' buckets in place. Buckets are built alike on every rank
// (at construction, and at the rebuild, in the order rank 0 broadcast), as
// the collective allocation needs; the old buckets, freed alike, release
// their regions on every rank.
at::Tensor Reducer::allocateBucket(int64_t numel, const at::TensorOptions& options) {
  if (braid_ && options.device().is_cpu()) {
    return braid_->registeredEmpty(numel, c10::typeMetaToScalarType(options.dtype()));
  }
  return at::zeros({numel}, options);
}

bool Reducer::tracksUse() const { return options_.find_unused_parameters || options_.static_graph; }

bool Reducer::staticFirstIteration() const {
  return options_.static_graph && syncedIterations_ == 0;
}

void Reducer::autogradHook(size_t index) {
  at::NoGradGuard noGrad;
  std::lock_guard<std::mutex> lock(mutex_);
  if (tracksUse() && params_[index].tensor.grad().defined()) localUsed_[index] = 1;
  // Unarmed: a no_sync step, or a second backward through the same forward.
  if (!expectHooks_) return;
  if (staticFirstIteration()) {
    if (hookCount_[index]++ == 0) firstHookOrder_.push_back(index);
    queueFinalize();
    return;
  }
  if (!markedUnused_) {
    markedUnused_ = true;
    for (size_t u : unusedLocal_) markReady(u, /*locallyUnused=*/true);
  }
  if (options_.static_graph) {
    BRAID_ENFORCE(hooksLeft_[index] > 0, "ddp", rank_, "the autograd graph changed under ",
                  "static_graph=true: ", describeParam(index), " got ",
                  hookCount_[index] + 1 - hooksLeft_[index], " gradient hooks in this backward vs ",
                  hookCount_[index],
                  " in the first iteration. With static_graph the set of used parameters and "
                  "the number of times each is used must stay the same; use "
                  "find_unused_parameters=true instead for graphs that change.");
    if (--hooksLeft_[index] > 0) return;
  }
  markReady(index);
}

void Reducer::markReady(size_t index, bool locallyUnused) {
  if (ready_[index]) {
    BRAID_THROW(::braid::Error, "ddp", rank_, describeParam(index),
                " was marked ready twice in one backward pass: its gradient hook fired again "
                "after its gradient was already taken for reduction. Causes: 1) the parameter "
                "is used outside forward(), e.g. a second backward through it before the next "
                "forward; 2) it is reused across reentrant backward passes (activation "
                "checkpointing), which static_graph=true supports when the graph is fixed; "
                "3) with find_unused_parameters=true, the loss depends on tensors that are not "
                "among forward()'s outputs, so the parameter looked unused.");
  }
  ready_[index] = 1;
  if (!rebuilt_) readyOrder_.push_back(index);
  copyGradToBucket(index, locallyUnused);
  Bucket& bucket = buckets_[params_[index].bucket];
  if (--bucket.pending == 0) launchReadyBuckets();
}

void Reducer::copyGradToBucket(size_t index, bool locallyUnused) {
  Param& p = params_[index];
  at::Tensor& view = buckets_[p.bucket].views[p.slot];
  const at::Tensor& grad = p.tensor.grad();
  if (!grad.defined()) {
    view.zero_();  // unused here: contributes zero
    return;
  }
  BRAID_ENFORCE(grad.layout() == at::kStrided, "ddp", rank_, describeParam(index),
                " has a sparse gradient; the reducer only handles dense gradients");
  BRAID_ENFORCE(grad.sizes() == p.tensor.sizes(), "ddp", rank_, describeParam(index),
                " has a gradient of shape ", grad.sizes(), " vs parameter shape ",
                p.tensor.sizes());
  const bool divide = !hook_ && !averagesInAllreduce(buckets_[p.bucket]);
  if (grad.is_alias_of(view)) {
    if (locallyUnused) unusedSnapshots_[index] = grad.clone();
    if (divide) view.div_(divisor_);
    return;
  }
  if (!divide) {
    view.copy_(grad);
  } else {
    at::div_out(view, grad, divisor_);  // one pass: copy and average
  }
  // A locally unused parameter is re-pointed in finalizeBackward, once we know
  // whether any rank used it.
  if (options_.gradient_as_bucket_view && !locallyUnused) p.tensor.mutable_grad() = view;
}

void Reducer::launchReadyBuckets() {
  while (nextBucket_ < buckets_.size() && buckets_[nextBucket_].pending == 0) {
    launchBucket(nextBucket_++);
  }
  if (nextBucket_ < buckets_.size()) return;
  if (options_.find_unused_parameters || staticFirstIteration()) {
    // Last in every rank's sequence of collectives, after the buckets.
    usedBuffer_ = at::tensor(localUsed_, at::kInt).to(params_.front().tensor.device());
    std::vector<at::Tensor> ts{usedBuffer_};
    usedFuture_ = pg_->allreduce(ts)->getFuture();
  }
  queueFinalize();
}

void Reducer::launchBucket(size_t b) {
  Bucket& bucket = buckets_[b];
  if (!hook_) {
    std::vector<at::Tensor> ts{bucket.buffer};
    c10d::AllreduceOptions opts;
    if (bucket.averageInAllreduce) opts.reduceOp = c10d::ReduceOp::AVG;
    bucket.future = pg_->allreduce(ts, opts)->getFuture();
    return;
  }
  std::vector<c10::IntArrayRef> sizes;
  std::vector<at::Tensor> params;
  for (size_t i : bucket.members) {
    sizes.push_back(params_[i].tensor.sizes());
    params.push_back(params_[i].tensor);
  }
  c10d::GradBucket gradBucket = compat::makeGradBucket(
      b, buckets_.size(), bucket.buffer, bucket.offsets, bucket.lengths, sizes, params);
  bucket.future = hook_->runHook(gradBucket);
  BRAID_ENFORCE(bucket.future, "ddp", rank_, "the comm hook returned no future for bucket ", b);
}

void Reducer::queueFinalize() {
  if (finalizeQueued_) return;
  finalizeQueued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalizeBackward(); });
}

std::string Reducer::describeParam(size_t index) const {
  return strCat("parameter '", names_[index], "' (index ", index, ")");
}

void Reducer::setSync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = sync;
}

bool Reducer::sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

void Reducer::registerCommHook(std::shared_ptr<c10d::CommHookInterface> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  BRAID_ENFORCE(hook, "ddp", rank_, "register_comm_hook got a null hook");
  BRAID_ENFORCE(!hook_, "ddp", rank_, "a comm hook is already registered; it can be set once");
  BRAID_ENFORCE(syncedIterations_ == 0 && !expectHooks_, "ddp", rank_,
                "register the comm hook before the first backward (", syncedIterations_,
                " synced iterations have run)");
  hook_ = std::move(hook);
}

std::vector<std::vector<size_t>> Reducer::bucketIndices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.members);
  return out;
}

std::vector<bool> Reducer::bucketsAveragedInAllreduce() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<bool> out;
  for (const auto& b : buckets_) out.push_back(averagesInAllreduce(b));
  return out;
}

std::vector<bool> Reducer::bucketsRegistered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<bool> out;
  for (const auto& b : buckets_) out.push_back(braid_ && braid_->isRegistered(b.buffer));
  return out;
}

bool Reducer::bucketsRebuilt() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rebuilt_;
}

int64_t Reducer::syncedIterations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return syncedIterations_;
}

}  // namespace braid
