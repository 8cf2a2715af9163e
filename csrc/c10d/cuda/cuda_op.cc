#include "c10d/cuda/cuda_op.h"


#include "c10d/work.h"
#include "common/error.h"

namespace braid {

namespace {
thread_local OpScope* tCurrent = nullptr;

// The worker (or a caller running the job itself, Note [Running a job on the
// waiting thread]) issues device calls on the context's device, and gives the
// thread its own device back after.
class DeviceSwitch {
 public:
  DeviceSwitch(cuda::DeviceApi& api, int device) : api_(api), prev_(api.getDevice()) {
    if (prev_ != device) api_.setDevice(device);
    switched_ = prev_ != device;
  }
  ~DeviceSwitch() {
    if (!switched_) return;
    try {
      api_.setDevice(prev_);
    } catch (...) {
    }
  }

 private:
  cuda::DeviceApi& api_;
  int prev_;
  bool switched_ = false;
};
}  // namespace

CudaOp::CudaOp(std::shared_ptr<CudaContext> ctx, int rank, const char* op)
    : ctx_(std::move(ctx)), rank_(rank), op_(op), end_(ctx_->event()) {}

at::Tensor CudaOp::stageIn(const at::Tensor& user) {
  at::Tensor shadow = ctx_->pinnedLike(user);
  if (user.nbytes() > 0) ins_.push_back(Copy{shadow.data_ptr(), user.data_ptr(), user.nbytes()});
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
  if (user.nbytes() == 0) return;
  ctx_->api().memcpyAsync(user.data_ptr(), shadow.data_ptr(), user.nbytes(), ctx_->comm());
}

void CudaOp::launchFor(WorkBraid& work) {
  caller_ = ctx_->recordOnCurrentStream(op_);
  work.setCuda(end_, ctx_->futureStream());
}

void CudaOp::before(std::chrono::steady_clock::time_point deadline,
                    std::chrono::milliseconds timeout) {
  cuda::DeviceApi& api = ctx_->api();
  ctx_->reap();
  if (caller_) api.streamWaitEvent(ctx_->comm(), caller_.get());
  caller_.reset();  // the wait took the event's state: it may be reused
  if (ins_.empty()) return;
  for (const Copy& c : ins_) api.memcpyAsync(c.dst, c.src, c.bytes, ctx_->comm());
  staged_ = ctx_->event();
  api.eventRecord(staged_.get(), ctx_->comm());
  ctx_->hostWait(staged_.get(), deadline, timeout, op_);
}

void CudaOp::after(std::chrono::steady_clock::time_point deadline,
                   std::chrono::milliseconds timeout) {
  ctx_->api().eventRecord(end_.get(), ctx_->comm());
  try {
    ctx_->hostWait(end_.get(), deadline, timeout, op_);
  } catch (...) {
    // The copies may still run: their memory stays until they have.
    ctx_->retire(end_, std::move(keep_));
    throw;
  }
  keep_.clear();
}

void CudaOp::run(const std::function<void()>& body, std::chrono::steady_clock::time_point deadline,
                 std::chrono::milliseconds timeout) {
  DeviceSwitch on(ctx_->api(), device().index());
  std::exception_ptr error;
  try {
    before(deadline, timeout);
    body();
  } catch (...) {
    error = std::current_exception();
  }
  // Whatever failed, the copies already enqueued are fenced by the end event
  // before the memory they touch can go.
  try {
    after(deadline, timeout);
  } catch (...) {
    if (!error) throw;  // else the first error is the one to report
  }
  if (error) std::rethrow_exception(error);
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
