#include "c10d/cuda/cuda_op.h"


#include "c10d/work.h"
#include "common/error.h"

namespace braid {

namespace {
thread_local OpScope* tCurrent = nullptr;
}  // namespace

CudaOp::CudaOp(std::shared_ptr<CudaContext> ctx, int rank, const char* op)
    : ctx_(std::move(ctx)), rank_(rank), op_(op), steps_(ctx_->stagedEnv()) {}

at::Tensor CudaOp::stageIn(const at::Tensor& user) {
  at::Tensor shadow = ctx_->pinnedLike(user);
  steps_.stageIn(shadow.data_ptr(), user.data_ptr(), user.nbytes());
  keep_.push_back(user);
  keep_.push_back(shadow);
  return shadow;
}

at::Tensor CudaOp::stageOut(const at::Tensor& user) {
  at::Tensor shadow = ctx_->pinnedLike(user);
  keep_.push_back(user);
  keep_.push_back(shadow);
  return shadow;
}

void CudaOp::copyBack(const at::Tensor& user, const at::Tensor& shadow) {
  steps_.copyBack(user.data_ptr(), shadow.data_ptr(), user.nbytes());
}

void CudaOp::launchFor(WorkBraid& work) {
  steps_.setCallerEvent(ctx_->recordOnCurrentStream(op_));
  work.setCuda(steps_.endEvent(), ctx_->futureStream());
}

void CudaOp::run(const std::function<void()>& body, std::chrono::steady_clock::time_point deadline,
                 std::chrono::milliseconds timeout) {
  ctx_->reap();
  try {
    steps_.run(body, [&](cuda::Event ev) { ctx_->hostWait(ev, deadline, timeout, op_); });
  } catch (...) {
    // The copies may still run: their memory stays until they have.
    if (!steps_.ended()) ctx_->retire(steps_.endEvent(), std::move(keep_));
    keep_.clear();
    throw;
  }
  keep_.clear();
}

OpScope::OpScope(CudaBinding& binding, int rank, const char* op)
    : binding_(binding), rank_(rank), op_(op), prev_(tCurrent) {
  tCurrent = this;
}

OpScope::~OpScope() { tCurrent = prev_; }

OpScope* OpScope::current() { return tCurrent; }

void OpScope::noteDevice(const at::Tensor& t, const char* op) {
  const c10::Device dev = t.device();
  BRAID_ENFORCE(dev.is_cpu() || dev.is_cuda(), op, rank_,
                "tensors must be on the CPU or a CUDA device, got ", dev.str());
  if (dev.is_cuda()) {
    BRAID_ENFORCE(t.is_contiguous(), op, rank_, "CUDA tensors must be contiguous (got sizes ",
                  t.sizes(), ", strides ", t.strides(), ")");
  }
  if (!device_) {
    // Before the op makes anything (Note [Graph capture in the front end] in
    // cuda_context.cc).
    if (dev.is_cuda()) refuseIfCapturing(dev, op, rank_);
    device_ = dev;
    return;
  }
  BRAID_ENFORCE(*device_ == dev, op, rank_,
                "the tensors of one call must be on one device, got ", device_->str(), " and ",
                dev.str());
}

std::shared_ptr<CudaOp> OpScope::cuda(const at::Tensor& t) {
  if (!cuda_) cuda_ = std::make_shared<CudaOp>(binding_.get(t.device(), op_), rank_, op_);
  BRAID_ENFORCE(cuda_->device() == t.device(), op_, rank_,
                "the tensors of one call must be on one device, got ", cuda_->device().str(),
                " and ", t.device().str());
  return cuda_;
}

}  // namespace braid
