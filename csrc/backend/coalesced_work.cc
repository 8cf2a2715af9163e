#include "backend/coalesced_work.h"

#include <atomic>
#include <memory>

namespace braid {

namespace {
// Completes `all` once every future in `parts` has, with their values in
// order, or with the first error.
void completeWhenAll(const std::vector<c10::intrusive_ptr<c10::ivalue::Future>>& parts,
                     const c10::intrusive_ptr<c10::ivalue::Future>& all) {
  if (parts.empty()) {
    all->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return;
  }
  struct State {
    std::atomic<size_t> left;
    std::atomic<bool> failed{false};
    explicit State(size_t n) : left(n) {}
  };
  auto state = std::make_shared<State>(parts.size());
  for (const auto& f : parts) {
    f->addCallback([state, parts, all](c10::ivalue::Future& done) {
      if (done.hasError()) {
        if (!state->failed.exchange(true)) all->setError(done.exception_ptr());
      }
      if (state->left.fetch_sub(1) != 1 || state->failed.load()) return;
      std::vector<at::Tensor> outputs;
      for (const auto& p : parts) {
        for (const auto& t : p->value().toTensorVector()) outputs.push_back(t);
      }
      all->markCompleted(c10::IValue(outputs));
    });
  }
}
}  // namespace

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, compat::kCoalescedOpType, "braid:coalesced"),
      works_(std::move(works)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> parts;
  for (const auto& w : works_) parts.push_back(w->getFuture());
  completeWhenAll(parts, future_);
}

bool CoalescedWork::isCompleted() {
  for (const auto& w : works_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (const auto& w : works_) {
    if (!w->isSuccess()) return false;
  }
  return true;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  // Each op ends by its own deadline; a timeout given here bounds each wait.
  for (const auto& w : works_) w->wait(timeout);
  return true;
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> out;
  for (const auto& w : works_) {
    for (const auto& t : w->result()) out.push_back(t);
  }
  return out;
}

}  // namespace braid
