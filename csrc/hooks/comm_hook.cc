#include <c10/core/impl/VirtualGuardImpl.h>

#include <utility>

#include "common/error.h"
#include "c10d/compat.h"
#include "c10d/process_group.h"
#include "hooks/comm_hook.h"

namespace braid {
namespace hooks {

void BucketView::setLayout(const std::vector<at::Tensor>& gradients, const char* op, int rank) {
  offsets.clear();
  shapes.clear();
  offsets.reserve(gradients.size());
  shapes.reserve(gradients.size());
  const int64_t base = buffer.storage_offset();
  for (size_t i = 0; i < gradients.size(); ++i) {
    const at::Tensor& g = gradients[i];
    BRAID_ENFORCE(g.defined() && g.is_alias_of(buffer) && g.is_contiguous(), op, rank, "gradient ",
                  i, " of bucket ", index, " is not a contiguous view of the bucket's buffer");
    const int64_t offset = g.storage_offset() - base;
    BRAID_ENFORCE(offset >= 0 && offset + g.numel() <= buffer.numel(), op, rank, "gradient ", i,
                  " of bucket ", index, " spans elements [", offset, ", ", offset + g.numel(),
                  ") outside the buffer's ", buffer.numel());
    offsets.push_back(offset);
    shapes.push_back(g.sizes().vec());
  }
}

namespace {
ProcessGroupBraid* braidBackend(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  return pg ? dynamic_cast<ProcessGroupBraid*>(compat::backendFor(pg, c10::DeviceType::CPU))
            : nullptr;
}
}  // namespace

CommHook::CommHook(c10::intrusive_ptr<c10d::ProcessGroup> pg)
    : pg_(std::move(pg)),
      rank_(pg_ ? pg_->getRank() : -1),
      size_(pg_ ? pg_->getSize() : 0),
      braid_(braidBackend(pg_)) {
  BRAID_ENFORCE(pg_, "comm_hook", -1, "the process group is null");
}

CommHook::~CommHook() = default;

c10::intrusive_ptr<c10::ivalue::Future> CommHook::runHook(c10d::GradBucket& bucket) {
  BucketView view;
  view.index = bucket.getIndex();
  view.isLast = bucket.isLast();
  view.buffer = bucket.getBufferRef();
  if (needsLayout()) view.setLayout(bucket.getGradients(), name(), rank_);
  return run(view);
}

at::Tensor CommHook::parseHookResult(const c10::IValue& result) {
  if (result.isTensor()) return result.toTensor();
  if (result.isTensorList()) {
    auto list = result.toTensorList();
    BRAID_ENFORCE(list.size() == 1, name(), rank_, "expected a one-tensor result, got ",
                  list.size(), " tensors");
    return list.get(0);
  }
  if (result.isList()) {
    auto list = result.toList();
    BRAID_ENFORCE(list.size() == 1 && list.get(0).isTensor(), name(), rank_,
                  "expected a one-tensor result list, got ", list.size(), " elements");
    return list.get(0).toTensor();
  }
  BRAID_THROW(Error, name(), rank_, "expected a tensor result, got ", result.tagKind());
}

void CommHook::resetCounters() {
  payloadBytes_ = 0;
  wireBytes_ = 0;
  branches_->device = 0;
  branches_->host = 0;
}

void CommHook::checkBuffer(const at::Tensor& buffer, const char* op) const {
  BRAID_ENFORCE(buffer.defined(), op, rank_, "the bucket has no buffer");
  BRAID_ENFORCE(buffer.dim() == 1 && buffer.is_contiguous(), op, rank_,
                "expected a flat contiguous bucket buffer, got ", buffer.dim(),
                " dimensions, contiguous=", buffer.is_contiguous());
  BRAID_ENFORCE(at::isFloatingType(buffer.scalar_type()), op, rank_,
                "expected a floating-point bucket, got ", buffer.scalar_type());
  BRAID_ENFORCE(buffer.device().is_cpu() || buffer.device().is_cuda(), op, rank_,
                "expected a CPU or CUDA bucket, got ", buffer.device());
}

at::Tensor CommHook::scratch(size_t bucket, int slot, int64_t numel, at::ScalarType dtype,
                             c10::Device device) {
  // See Note [Hooks on CUDA buckets]: the caching allocator reuses GPU memory
  // without page faults, and knows which streams still use it.
  if (!device.is_cpu()) return at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
  std::lock_guard<std::mutex> lock(scratchMu_);
  at::Tensor& t = scratch_[{bucket, slot}];
  // Only the cache holds it (no view, no work, no future, no callback): free to reuse.
  const bool reusable = t.defined() && t.use_count() == 1 && t.storage().use_count() == 1 &&
                        t.numel() == numel && t.scalar_type() == dtype;
  if (!reusable) t = at::empty({numel}, at::TensorOptions().dtype(dtype));
  return t;
}

void CommHook::countAllreduce(int64_t bytes) {
  payloadBytes_ += bytes;
  wireBytes_ += bytes * 2 * (size_ - 1) / size_;
}

c10::intrusive_ptr<c10::ivalue::Future> CommHook::allreduceSum(at::Tensor& tensor) {
  return allreduceWith(tensor, c10d::ReduceOp::SUM);
}

c10::intrusive_ptr<c10::ivalue::Future> CommHook::allreduceWith(at::Tensor& tensor,
                                                                c10d::ReduceOp op) {
  countAllreduce(static_cast<int64_t>(tensor.numel()) * tensor.element_size());
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  return pg_->allreduce(tensors, opts)->getFuture();
}

c10::intrusive_ptr<c10::ivalue::Future> CommHook::allreduceMean(at::Tensor buffer) {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  if (braid_ && braid_->averagesExactly(buffer)) {
    fut = allreduceWith(buffer, c10d::ReduceOp::AVG);
  } else {
    buffer.div_(size_);
    fut = allreduceSum(buffer);
  }
  return fut->then(
      [buffer](c10::ivalue::Future& f) {
        if (f.hasError()) std::rethrow_exception(f.exception_ptr());
        return tensorListValue(buffer);
      },
      tensorListType());
}

c10::intrusive_ptr<c10::ivalue::Future> CommHook::allgather(at::Tensor& input,
                                                            std::vector<at::Tensor>& outputs) {
  const int64_t bytes = static_cast<int64_t>(input.numel()) * input.element_size();
  payloadBytes_ += bytes;
  wireBytes_ += bytes * (size_ - 1);
  std::vector<std::vector<at::Tensor>> outputLists{outputs};
  std::vector<at::Tensor> inputs{input};
  return pg_->allgather(outputLists, inputs)->getFuture();
}

void recordOnCurrentStream(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return;
  c10::impl::VirtualGuardImpl impl(t.device().type());
  impl.recordDataPtrOnStream(t.storage().data_ptr(), impl.getStream(t.device()));
}

c10::TypePtr tensorListType() { return c10::ListType::ofTensors(); }

c10::IValue tensorListValue(const at::Tensor& t) { return c10::IValue(std::vector<at::Tensor>{t}); }

namespace {

// Shares one hook between owners that each insist on a unique_ptr.
class ForwardingHook : public c10d::CommHookInterface {
 public:
  explicit ForwardingHook(std::shared_ptr<CommHook> hook) : hook_(std::move(hook)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return hook_->runHook(bucket);
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return hook_->parseHookResult(result);
  }

 private:
  std::shared_ptr<CommHook> hook_;
};

}  // namespace

std::unique_ptr<c10d::CommHookInterface> asUniqueHook(std::shared_ptr<CommHook> hook) {
  BRAID_ENFORCE(hook, "comm_hook", -1, "asUniqueHook got a null hook");
  return std::make_unique<ForwardingHook>(std::move(hook));
}

}  // namespace hooks
}  // namespace braid
