#include "reducer/ddp.h"

#include <unordered_set>

#include "common/error.h"
#include "reducer/param_sync.h"

namespace braid {
namespace {

int64_t mebibytes(double mb, const char* what, int rank) {
  BRAID_ENFORCE(mb > 0, "ddp", rank, what, " must be positive, got ", mb);
  return static_cast<int64_t>(mb * 1024 * 1024);
}

}  // namespace

NoSyncGuard::NoSyncGuard(Reducer& reducer) : reducer_(&reducer), previous_(reducer.sync()) {
  reducer_->setSync(false);
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : reducer_(other.reducer_), previous_(other.previous_) {
  other.reducer_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (reducer_) reducer_->setSync(previous_);
}

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
    DDPOptions options)
    : module_(std::move(module)), pg_(std::move(process_group)), options_(options) {
  const int rank = pg_ ? pg_->getRank() : -1;
  BRAID_ENFORCE(module_, "ddp", rank, "the module is null");
  BRAID_ENFORCE(pg_, "ddp", rank, "the process group is null");
  ReducerOptions ropts;
  ropts.first_bucket_bytes = mebibytes(options_.first_bucket_mb, "first_bucket_mb", rank);
  ropts.bucket_cap_bytes = mebibytes(options_.bucket_cap_mb, "bucket_cap_mb", rank);
  ropts.find_unused_parameters = options_.find_unused_parameters;
  ropts.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  ropts.static_graph = options_.static_graph;

  // A parameter shared by two submodules appears under both names: keep the first.
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<at::Tensor> states, params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    states.push_back(item.value());
    if (!item.value().requires_grad()) continue;
    params.push_back(item.value());
    names.push_back(item.key());
  }
  verifyParamsAcrossRanks(pg_, params, names);
  auto buffers = moduleBuffers();
  states.insert(states.end(), buffers.begin(), buffers.end());
  broadcastCoalesced(pg_, states, 0);
  reducer_ = std::make_unique<Reducer>(params, names, pg_, ropts);
}

DistributedDataParallel::~DistributedDataParallel() = default;

std::vector<at::Tensor> DistributedDataParallel::moduleBuffers() const {
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<at::Tensor> out;
  for (const auto& b : module_->buffers(/*recurse=*/true)) {
    if (b.defined() && seen.insert(b.unsafeGetTensorImpl()).second) out.push_back(b);
  }
  return out;
}

void DistributedDataParallel::prepare_forward() {
  const bool sync = reducer_->sync();
  if (at::GradMode::is_enabled() && sync) reducer_->prepareForForward();
  // Skipped under no_sync like the gradient collectives, so that a no_sync
  // step costs no communication at all.
  if (options_.broadcast_buffers && sync) {
    auto buffers = moduleBuffers();
    if (!buffers.empty()) broadcastCoalesced(pg_, buffers, 0);
  }
}

void DistributedDataParallel::prepare_backward(const std::vector<at::Tensor>& outputs) {
  if (!at::GradMode::is_enabled() || !reducer_->sync()) return;
  const bool walk = options_.find_unused_parameters && !options_.static_graph;
  BRAID_ENFORCE(!walk || !outputs.empty(), "ddp", pg_->getRank(),
                "find_unused_parameters needs the forward outputs to find unused parameters; "
                "prepare_backward got no tensors");
  reducer_->prepareForBackward(walk ? outputs : std::vector<at::Tensor>{});
}

NoSyncGuard DistributedDataParallel::no_sync() { return NoSyncGuard(*reducer_); }

void DistributedDataParallel::register_comm_hook(std::shared_ptr<c10d::CommHookInterface> hook) {
  reducer_->registerCommHook(std::move(hook));
}

}  // namespace braid
