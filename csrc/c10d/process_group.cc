// Construction, the launch machinery, and the reducing collectives.
#include "c10d/process_group.h"

#include "c10d/buffer_adoption.h"
#include "c10d/coalesced_work.h"
#include "c10d/cuda/cuda_op.h"
#include "cuda/nccl/nccl_api.h"
#include "cuda/nccl/nccl_executor.h"
#include "engine/engine.h"
#include "c10d/store_adapter.h"
#include "c10d/tensor_args.h"
#include "c10d/work.h"
#include "collectives/shm/collectives.h"
#include "common/error.h"
#include "common/logging.h"
#include "collectives/make_group.h"

namespace braid {

using collectives::OpDesc;
using collectives::OpKind;

namespace {

c10d::OpType opTypeOf(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return c10d::OpType::ALLREDUCE;
    case OpKind::kBroadcast: return c10d::OpType::BROADCAST;
    case OpKind::kReduce: return c10d::OpType::REDUCE;
    case OpKind::kAllgather: return c10d::OpType::ALLGATHER;
    case OpKind::kGather: return c10d::OpType::GATHER;
    case OpKind::kScatter: return c10d::OpType::SCATTER;
    case OpKind::kReduceScatter: return c10d::OpType::REDUCE_SCATTER;
    case OpKind::kAlltoall: return c10d::OpType::ALLTOALL;
    case OpKind::kBarrier: return c10d::OpType::BARRIER;
    case OpKind::kRegister: break;  // braid's own (Note [Registered buffers]): no c10d op
  }
  return c10d::OpType::UNKNOWN;
}

}  // namespace

ProcessGroupBraid::ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout,
                                     std::string groupName)
    : compat::BackendBase(rank, size), timeoutMs_(timeout.count()) {
  // A reused store (file://) may hold keys of an earlier group: number the
  // incarnations and keep each one's keys apart.
  const PinMode pinMode = pinModeFromSetting(rank);  // a bad value fails before the group
  int64_t ticket = store->add("braid/incarnation", 1);
  const std::string prefix = "braid/" + std::to_string((ticket - 1) / size) + "/";
  StoreAdapter adapted(store, prefix);
  collectives::GroupOptions opts;
  opts.timeout = timeout;
  opts.groupId = prefix + groupName;
  opts.storeHost = compat::storeHost(store);
  auto group = collectives::makeGroup(adapted, rank, size, opts);  // Note [Choosing a group's transport]
  const std::string how = group->describe();
  narrowsOnWire_ = group->narrowsOnWire();
  if (group->regionTable() && size > 1) {  // one host: the group's ranks are the host's
    adoption_ = BufferAdoption::makeIfEnabled();
    pin_ = pinRankIfFull(pinMode, rank, size, rank);  // Note [Pinning ranks on a full host]
  }
  engine_ = std::make_unique<Engine>(std::move(group), timeout);
  CudaGroupInfo cudaInfo;
  cudaInfo.rank = rank;
  cudaInfo.size = size;
  cudaInfo.store = std::make_shared<StoreAdapter>(store, prefix);
  cudaInfo.timeout = timeout;
  cuda_ = std::make_unique<CudaBinding>(std::move(cudaInfo));
  fr_ = std::make_unique<GroupRecorder>(store, prefix, rank, size);
  BRAID_LOG(kInfo, "backend", rank) << "group '" << groupName << "' of " << size
                                    << " ranks ready (" << how << ")";
}

ProcessGroupBraid::~ProcessGroupBraid() {
  // A group dropped with nothing pending destroys its NCCL communicators
  // rather than aborting them (abort() warns, and is for failures).
  if (auto ctx = cuda_ ? cuda_->existing() : nullptr) ctx->shutdownNccl(/*drain=*/false);
  abort();
}

void ProcessGroupBraid::shutdown() {
  if (!engine_) return;
  engine_->drain();
  if (auto ctx = cuda_ ? cuda_->existing() : nullptr) ctx->shutdownNccl(/*drain=*/true);
  if (fr_) fr_->dumpIfAsked();  // Note [Flight-recorder dumps]
  engine_->shutdown();
}

void ProcessGroupBraid::abort() {
  firstError_->record("braid: the group was aborted (abort() on rank " +
                      std::to_string(getRank()) + ")");
  if (fr_) fr_->dumpIfAsked();
  if (cuda_) {
    if (auto ctx = cuda_->existing()) ctx->abort();  // a job waiting on the device returns
  }
  if (engine_) engine_->shutdown();
}

std::shared_ptr<CudaContext> ProcessGroupBraid::cudaContext() const {
  return cuda_ ? cuda_->existing() : nullptr;
}

std::string ProcessGroupBraid::errored() const {
  std::lock_guard<std::mutex> lock(firstError_->mu);
  return firstError_->what;
}

uint64_t ProcessGroupBraid::frRecord(c10d::OpType type, c10::ArrayRef<at::Tensor> inputs,
                                     c10::ArrayRef<at::Tensor> outputs, int peer) {
  if (!fr_->on()) return 0;
  if (!frNamed_.load(std::memory_order_relaxed)) nameForRecorder();
  return fr_->record(type, inputs, outputs, timeout().count(), peer);
}

void ProcessGroupBraid::nameForRecorder() {
  auto nd = compat::groupNameAndDesc(*this);
  fr_->describe(nd.first, nd.second, {});
  frNamed_.store(true, std::memory_order_relaxed);
}

void ProcessGroupBraid::setTimeout(std::chrono::milliseconds timeout) {
  BRAID_ENFORCE(timeout.count() > 0, "set_timeout", getRank(),
                "the timeout must be positive, got ", timeout.count(), " ms");
  timeoutMs_.store(timeout.count(), std::memory_order_relaxed);
}

uint64_t ProcessGroupBraid::getSequenceNumberForGroup() { return launched_.load(); }

OpDesc ProcessGroupBraid::desc(OpKind kind, std::chrono::milliseconds optTimeout) const {
  OpDesc d;
  d.kind = kind;
  d.timeout = optTimeout.count() > 0 ? optTimeout : timeout();
  d.deadline = transport::Clock::now() + d.timeout;
  return d;
}

OpDesc ProcessGroupBraid::describe(OpKind kind, const at::Tensor& t, const char* op,
                                   std::chrono::milliseconds optTimeout) const {
  OpDesc d = desc(kind, optTimeout);
  d.dtype = args::dtypeOf(t, op, getRank());
  d.count = t.numel();
  d.shape = args::shapeOf(t);
  return d;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::launch(const OpDesc& d, c10d::OpType type,
                                                         const char* title,
                                                         std::vector<at::Tensor> outputs,
                                                         Body body,
                                                         c10::ArrayRef<at::Tensor> inputs) {
  uint64_t frId = frRecord(type, inputs, outputs);
  OpScope* scope = OpScope::current();
  std::shared_ptr<CudaOp> cuda = scope ? scope->take() : nullptr;
  std::vector<c10::Device> devices;
  if (cuda) devices.push_back(cuda->device());
  auto work = c10::make_intrusive<WorkBraid>(getRank(), type, title, std::move(outputs), devices);
  if (cuda) {
    // Note [The staged CUDA executor] (c10d/cuda/cuda_op.h).
    cuda->launchFor(*work);
    body = [cuda, d, body = std::move(body)] { cuda->run(body, d.deadline, d.timeout); };
  }
  launched_.fetch_add(1);
  Engine* engine = engine_.get();
  GroupRecorder* fr = fr_.get();  // outlives every job: see abort()
  auto expiry = std::make_shared<std::string>();
  Engine::Job job;
  job.run = [engine, fr, frId, expiry, errors = firstError_,
             body = std::move(body)]() -> std::exception_ptr {
    fr->started(frId);
    if (!expiry->empty()) {  // Note [A job that cannot start]: its caller gave it up
      engine->group().markBroken(*expiry);
      fr->finished(frId, nullptr);
      return nullptr;
    }
    std::exception_ptr error;
    try {
      body();
    } catch (const TimeoutError& e) {
      engine->group().markBroken(e.what());  // ranks are out of step now
      errors->record(e.what());
      error = std::current_exception();
    } catch (const PeerLostError& e) {
      engine->group().markBroken(e.what());
      errors->record(e.what());
      error = std::current_exception();
    } catch (...) {
      error = std::current_exception();
    }
    fr->finished(frId, error);
    return error;
  };
  job.finish = [work](std::exception_ptr e) { work->markDone(e); };
  uint64_t id = engine_->submit(std::move(job));
  if (id) work->setJob(engine_->queue(), id, d.deadline, d.timeout, collectives::opName(d.kind),
                       std::move(expiry));
  return tracked(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::tracked(c10::intrusive_ptr<c10d::Work> work) {
  if (!coalescing_.load(std::memory_order_acquire)) return work;  // the common case: no lock
  std::lock_guard<std::mutex> lock(coalesceMu_);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

void ProcessGroupBraid::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMu_);
  BRAID_ENFORCE(!coalescing_, "coalescing", getRank(),
                "startCoalescing() called twice without endCoalescing()");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::endCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMu_);
  BRAID_ENFORCE(coalescing_, "coalescing", getRank(),
                "endCoalescing() called without startCoalescing()");
  coalescing_ = false;
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(coalesced_));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::guarded(
    OpKind kind, const std::function<c10::intrusive_ptr<c10d::Work>()>& check) {
  try {
    OpScope scope(*cuda_, getRank(), collectives::opName(kind));
    return check();
  } catch (const Error& e) {
    OpDesc d = desc(kind, std::chrono::milliseconds(0));
    d.localError = e.what();
    Engine* engine = engine_.get();
    // The poison op takes a sequence number as the peers' op does, so that
    // the ranks' flight records stay aligned (Note [Flight recorder]).
    const uint64_t frId = frRecord(opTypeOf(kind), {}, {});
    GroupRecorder* fr = fr_.get();
    Engine::Job job;
    job.run = [engine, d, fr, frId]() -> std::exception_ptr {
      fr->started(frId);
      try {
        engine->group().failOp(d);
      } catch (...) {
        // Our own error already reached the caller.
      }
      fr->finished(frId, nullptr);
      return nullptr;
    };
    engine_->submit(std::move(job));
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  if (!tensors.empty() && tensors[0].defined() && tensors[0].is_sparse()) {
    return allreduceSparse(tensors, opts);
  }
  return guarded(OpKind::kAllreduce, [&] {
    const int rank = getRank();
    const at::Tensor& t = args::single(tensors, "allreduce", rank);
    OpDesc d = describe(OpKind::kAllreduce, t, "allreduce", opts.timeout);
    double factor = 1.0;
    d.redop = args::reduceOpOf(opts.reduceOp, d.dtype, "allreduce", rank, &factor);
    if (onNccl(t, "allreduce", cuda::NcclOpKind::kAllreduce, d.dtype, d.redop)) {
      return ncclLaunch(d, c10d::OpType::ALLREDUCE, "braid:allreduce", tensors, tensors,
                        cuda::NcclOpKind::kAllreduce, t.data_ptr(), t.data_ptr(), factor);
    }
    auto st = args::Staged::in(t);
    // Note [Adopting a repeated buffer]
    d.offersBuffer = adoption_ && adoption_->offer(t, d.redop);
    const bool premul = d.redop == ReduceOp::kPremulSum;
    if (premul) d.redop = ReduceOp::kSum;  // the sum of pre-scaled copies
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::ALLREDUCE, "braid:allreduce", tensors,
                  [e, d, st, premul, factor, adoption = adoption_] {
                    // On the worker: a CUDA tensor's values reach st.buf only there.
                    at::Tensor src = premul ? st.buf * factor : st.buf;
                    e->group().allreduce(d, src.data_ptr(), st.data());
                    st.copyBack();
                    if (d.offersBuffer && e->group().everyRankOffered()) {
                      adoption->adopt(e, d, st.user);
                    }
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return guarded(OpKind::kAllreduce, [&] {
    const int rank = getRank();
    BRAID_ENFORCE(!tensors.empty(), "allreduce_coalesced", rank, "got no tensors");
    for (auto& t : tensors) args::checkTensor(t, "allreduce_coalesced", rank);
    DataType dt = args::dtypeOf(tensors[0], "allreduce_coalesced", rank);
    for (size_t i = 0; i < tensors.size(); ++i) {
      BRAID_ENFORCE(args::dtypeOf(tensors[i], "allreduce_coalesced", rank) == dt,
                    "allreduce_coalesced", rank, "tensor ", i, " is ",
                    toString(args::dtypeOf(tensors[i], "allreduce_coalesced", rank)),
                    ", tensor 0 is ", toString(dt), "; all must share a dtype");
    }
    OpDesc d = desc(OpKind::kAllreduce, opts.timeout);
    d.dtype = dt;
    double factor = 1.0;
    d.redop = args::reduceOpOf(opts.reduceOp, dt, "allreduce_coalesced", rank, &factor);
    const bool premul = d.redop == ReduceOp::kPremulSum;
    if (premul) d.redop = ReduceOp::kSum;
    std::vector<args::Staged> sts;
    int64_t total = 0;
    for (auto& t : tensors) {
      sts.push_back(args::Staged::in(t));
      total += t.numel();
    }
    d.count = total;
    d.shape.ndim = 1;
    d.shape.dims[0] = total;
    Engine* e = engine_.get();
    // The packing runs on the worker, where a CUDA tensor's values have
    // reached its staging buffer.
    return launch(d, c10d::OpType::ALLREDUCE_COALESCED, "braid:allreduce_coalesced", tensors,
                  [e, d, sts, premul, factor] {
                    std::vector<at::Tensor> flat;
                    for (auto& st : sts) flat.push_back(st.buf.reshape({-1}));
                    at::Tensor buf = at::cat(flat);
                    if (premul) buf.mul_(factor);
                    e->group().allreduce(d, buf.data_ptr(), buf.data_ptr());
                    int64_t off = 0;
                    for (auto& st : sts) {
                      st.buf.copy_(buf.narrow(0, off, st.buf.numel()).view(st.buf.sizes()));
                      st.copyBack();
                      off += st.buf.numel();
                    }
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  return guarded(OpKind::kBroadcast, [&] {
    const int rank = getRank();
    const at::Tensor& t = args::single(tensors, "broadcast", rank);
    args::checkRank(static_cast<int>(opts.rootRank), getSize(), "root", "broadcast", rank);
    OpDesc d = describe(OpKind::kBroadcast, t, "broadcast", opts.timeout);
    d.root = static_cast<int>(opts.rootRank);
    if (onNccl(t, "broadcast")) {
      return ncclLaunch(d, c10d::OpType::BROADCAST, "braid:broadcast", tensors, tensors,
                        cuda::NcclOpKind::kBroadcast, t.data_ptr(), t.data_ptr(), 1.0);
    }
    auto st = args::Staged::in(t);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::BROADCAST, "braid:broadcast", tensors, [e, d, st] {
      e->group().broadcast(d, st.data());
      st.copyBack();
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  return guarded(OpKind::kReduce, [&] {
    const int rank = getRank();
    const at::Tensor& t = args::single(tensors, "reduce", rank);
    args::checkRank(static_cast<int>(opts.rootRank), getSize(), "root", "reduce", rank);
    OpDesc d = describe(OpKind::kReduce, t, "reduce", opts.timeout);
    double factor = 1.0;
    d.redop = args::reduceOpOf(opts.reduceOp, d.dtype, "reduce", rank, &factor);
    d.root = static_cast<int>(opts.rootRank);
    if (onNccl(t, "reduce", cuda::NcclOpKind::kReduce, d.dtype, d.redop)) {
      return ncclLaunch(d, c10d::OpType::REDUCE, "braid:reduce", tensors, tensors,
                        cuda::NcclOpKind::kReduce, t.data_ptr(), t.data_ptr(), factor);
    }
    auto st = args::Staged::in(t);
    const bool premul = d.redop == ReduceOp::kPremulSum;
    if (premul) d.redop = ReduceOp::kSum;
    Engine* e = engine_.get();
    const bool root = d.root == rank;
    return launch(d, c10d::OpType::REDUCE, "braid:reduce", tensors,
                  [e, d, st, premul, factor, root] {
                    at::Tensor src = premul ? st.buf * factor : st.buf;
                    e->group().reduce(d, src.data_ptr(), st.data());
                    if (root) st.copyBack();
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::barrier(const c10d::BarrierOptions& opts) {
  return guarded(OpKind::kBarrier, [&] {
    OpDesc d = desc(OpKind::kBarrier, opts.timeout);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::BARRIER, "braid:barrier", {},
                  [e, d] { e->group().barrier(d); });
  });
}

c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto backend = c10::make_intrusive<ProcessGroupBraid>(store, rank, size, timeout, "cpp");
  return compat::wrapAsProcessGroup(backend, store);
}

}  // namespace braid
