// CUDA collectives on the group's NCCL executor: ranks that each have their
// own GPU (Note [Choosing a CUDA executor] in cuda/executor_choice.h).
//
// Note [The NCCL path in the backend]
// The front end checks the arguments as for any op; then, when the group's
// CUDA ops run on NCCL and NCCL has the (dtype, reduce op), the op goes
// straight to the NcclExecutor from the caller's thread, as ProcessGroupNCCL
// does: an event recorded on the caller's current stream orders the comm
// stream after the inputs' producers, the Work's wait() and synchronize()
// make the caller's stream wait on NCCL's end event, and the Future
// completes on a pool stream that waited on it. The CPU does not wait for
// the device. The tensors stay alive until the op has run (the completion
// callback holds them). Ops NCCL lacks (gather, scatter, the list forms,
// bitwise reductions) take the staged path (Note [The staged CUDA executor]),
// which orders itself on the same caller stream, so the two mix freely.
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backend/cuda_context.h"
#include "backend/cuda_op.h"
#include "backend/process_group.h"
#include "backend/work.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_executor.h"

namespace braid {

bool ProcessGroupBraid::onNccl(const at::Tensor& t, const char* op) {
  if (!t.is_cuda()) return false;
  return cuda_->get(t.device(), op)->nccl() != nullptr;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::ncclLaunch(
    c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
    const std::vector<at::Tensor>& inputs, cuda::NcclOpKind kind, const void* in, void* out, size_t count,
    DataType dtype, ReduceOp redop, double factor, int root, std::chrono::milliseconds timeout) {
  std::shared_ptr<CudaContext> ctx = cuda_->existing();
  const c10::Device device = ctx->device();
  PooledEvent ready = ctx->event();
  {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    void* ev = ready.get();
    impl.record(&ev, impl.getStream(device), device.index(), c10::EventFlag::PYTORCH_DEFAULT);
  }
  cuda::NcclOp op;
  op.kind = kind;
  op.in = in;
  op.out = out;
  op.count = count;
  op.dtype = dtype;
  op.redop = redop;
  op.premulFactor = factor;
  op.root = root;
  op.device = device.index();
  op.ready = ready.get();
  op.timeout = timeout.count() > 0 ? timeout : this->timeout();
  const uint64_t frId = frRecord(type, inputs, outputs);
  std::shared_ptr<cuda::NcclWork> nw = ctx->nccl()->run(op);
  fr_->started(frId);
  launched_.fetch_add(1);
  auto work = c10::make_intrusive<WorkBraid>(getRank(), type, title, outputs,
                                             std::vector<c10::Device>{device});
  // The Work's end event lives as long as the NcclWork that owns it.
  work->setCuda(std::shared_ptr<void>(nw, nw->endEvent()), ctx->futureStream());
  std::vector<at::Tensor> keep(inputs.begin(), inputs.end());
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  GroupRecorder* fr = fr_.get();  // the executor is shut down before it goes
  nw->onDone([work, fr, frId, keep = std::move(keep)](std::exception_ptr e) {
    fr->finished(frId, e);
    work->markDone(e);
  });
  return tracked(work);
}

}  // namespace braid
