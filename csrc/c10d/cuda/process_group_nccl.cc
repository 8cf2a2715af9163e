// CUDA collectives on the group's NCCL executor: ranks that each have their
// own GPU (Note [Choosing a CUDA executor] in cuda/nccl/executor_choice.h).
//
// Note [The NCCL path in the backend]
// The front end checks the arguments as for any op; then, when the group's
// CUDA ops run on NCCL and NCCL has the (dtype, reduce op), the op goes
// straight to the NcclExecutor from the caller's thread, as ProcessGroupNCCL
// does: an event recorded on the caller's current stream orders the comm
// stream after the inputs' producers, the Work's wait() and synchronize()
// make the caller's stream wait on NCCL's end event and return (the host
// does not wait for the device, as with ProcessGroupNCCL; wait(timeout)
// also waits on the host, Note [wait(timeout) on the NCCL path] in
// c10d/work.cc), and the Future completes at launch on a pool stream that
// waits on NCCL's end event (Note [The NCCL path's Future] in c10d/work.cc):
// its callbacks never run on the watchdog, and an error (a failed device, a
// mismatch found by the header check below) reaches the Work, not the
// Future. The tensors stay alive until the op has run (the completion
// callback holds them). Ops NCCL lacks (gather, scatter, the list forms,
// bitwise reductions) take the staged path (Note [The staged CUDA executor]),
// which orders itself on the same caller stream, so the two mix freely.
// reduce, allgather and reduce_scatter come here only where the executor's
// NcclApi has them (NCCL, the same-GPU and the hierarchical ones all do;
// Note [Hierarchical reduce, allgather and reduce_scatter] in cuda/shared_gpu/multi_gpu.h).
// gather, scatter and alltoall (equal splits) come here too where the
// executor's NcclApi has them (braid's same-GPU collectives, Note
// [Collectives NCCL lacks] in cuda/nccl/nccl_api.h): the executor answers, the
// same on every rank.
// Arguments the ranks disagree on (a count, a dtype, a root) would hang NCCL
// or mix buffers of different sizes, so each NCCL op also runs its header
// step through braid's CPU group (Group::checkOp), on the worker, without
// holding up the caller or the device; the Work completes when both the
// device and the check are done, and a mismatch aborts the NCCL op with the
// same message a CPU op gives. Ranks whose arguments send one of them down
// the NCCL path and another down the staged one meet in that same step.

#include <mutex>
#include <optional>
#include <string>

#include "c10d/cuda/cuda_context.h"
#include "c10d/cuda/cuda_op.h"
#include "c10d/process_group.h"
#include "engine/engine.h"
#include "c10d/work.h"
#include "cuda/nccl/nccl_api.h"
#include "cuda/nccl/nccl_executor.h"
#include "cuda/on_device.h"

namespace braid {

bool ProcessGroupBraid::onNccl(const at::Tensor& t, const char* op) {
  if (!t.is_cuda()) return false;
  cuda::NcclExecutor* n = cuda_->get(t.device(), op)->nccl();
  if (n == nullptr) return false;
  // NCCL's own collectives, which an executor's NcclApi may lack (its
  // supports() says so, the same on every rank): those take the staged path.
  const std::string name = op;
  if (name == "reduce") return n->supports(cuda::NcclOpKind::kReduce);
  if (name == "allgather") return n->supports(cuda::NcclOpKind::kAllgather);
  if (name == "reduce_scatter") return n->supports(cuda::NcclOpKind::kReduceScatter);
  return true;
}

bool ProcessGroupBraid::onNccl(const at::Tensor& t, const char* op, cuda::NcclOpKind kind) {
  if (!t.is_cuda()) return false;
  cuda::NcclExecutor* n = cuda_->get(t.device(), op)->nccl();
  return n != nullptr && n->supports(kind);
}

bool ProcessGroupBraid::onNccl(const at::Tensor& t, const char* op, cuda::NcclOpKind kind,
                               DataType dtype, ReduceOp redop) {
  if (!t.is_cuda()) return false;
  cuda::NcclExecutor* n = cuda_->get(t.device(), op)->nccl();
  return n != nullptr && n->supportsReduction(kind, dtype, redop);
}

namespace {
// A Work that completes when both of its halves have: the NCCL op on the
// device, and the header check on the host. The check's error wins: it names
// the mismatch in braid's words, where NCCL's says only that it was aborted.
struct Halves {
  std::mutex mu;
  int left = 2;
  std::exception_ptr check, device;
  // Returns the outcome once both halves are in, else false.
  bool done(std::exception_ptr e, bool fromCheck, std::exception_ptr* outcome) {
    std::lock_guard<std::mutex> lock(mu);
    (fromCheck ? check : device) = e;
    if (--left > 0) return false;
    *outcome = check ? check : device;
    return true;
  }
};
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::ncclLaunch(
    const collectives::OpDesc& d, c10d::OpType type, const char* title,
    std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs, cuda::NcclOpKind kind,
    const void* in, void* out, double factor) {
  cuda::NcclOp op;
  op.kind = kind;
  op.in = in;
  op.out = out;
  op.premulFactor = factor;
  return ncclLaunch(d, type, title, std::move(outputs), inputs, std::move(op));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::ncclLaunch(
    const collectives::OpDesc& d, c10d::OpType type, const char* title,
    std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs, cuda::NcclOp op) {
  std::shared_ptr<CudaContext> ctx = cuda_->existing();
  const c10::Device device = ctx->device();
  PooledEvent ready = ctx->recordOnCurrentStream(title);
  op.count = d.count;
  op.dtype = d.dtype;
  op.redop = d.redop;
  op.root = d.root;
  op.device = device.index();
  op.ready = ready.get();
  op.timeout = d.timeout;
  const uint64_t frId = frRecord(type, inputs, outputs);
  std::shared_ptr<cuda::NcclWork> nw = ctx->nccl()->run(op);
  fr_->started(frId);
  launched_.fetch_add(1);
  auto work = c10::make_intrusive<WorkBraid>(getRank(), type, title, outputs,
                                             std::vector<c10::Device>{device});
  // The Work's end event lives as long as the NcclWork that owns it.
  work->setCuda(std::shared_ptr<void>(nw, nw->endEvent()), ctx->futureStream(),
                /*recorded=*/true);
  std::vector<at::Tensor> keep(inputs.begin(), inputs.end());
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  GroupRecorder* fr = fr_.get();  // the executor is shut down before it goes
  auto halves = std::make_shared<Halves>();
  auto finish = [halves, work, fr, frId](std::exception_ptr e, bool fromCheck) {
    std::exception_ptr outcome;
    if (!halves->done(e, fromCheck, &outcome)) return;
    fr->finished(frId, outcome);
    work->markDone(outcome);
  };
  // The header check (Note [The NCCL path in the backend]): the same step a
  // CPU op starts with, on the worker, so the caller and the device never
  // wait for it. At a mismatch the NCCL op (which may hang, or mix buffers
  // of different sizes) is aborted with the check's message, and the group
  // fails as a CPU op's group would.
  Engine* engine = engine_.get();
  Engine::Job check;
  check.run = [engine, d, ctx]() -> std::exception_ptr {
    try {
      engine->group().checkOp(d);
      return nullptr;
    } catch (const std::exception& e) {
      if (auto* n = ctx->nccl()) n->abort(e.what());
      return std::current_exception();
    }
  };
  // The Work (its Future's events, the NcclWork's end event) may go with
  // this half's reference, on the worker, which never set a device: it goes
  // here, on the op's device (Note [A current device per thread] in
  // cuda/on_device.h), not with the Job later.
  auto checkHalf = std::make_shared<std::optional<decltype(finish)>>(finish);
  check.finish = [checkHalf, device](std::exception_ptr e) {
    cuda::OnDevice on(cudaApi(), device.index(), std::nothrow);
    (**checkHalf)(e, true);
    checkHalf->reset();
  };
  engine_->submit(std::move(check));
  nw->onDone([finish, keep = std::move(keep)](std::exception_ptr e) { finish(e, false); });
  return tracked(work);
}

}  // namespace braid
