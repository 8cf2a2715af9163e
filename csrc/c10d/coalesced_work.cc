#include "c10d/coalesced_work.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include "common/error.h"

namespace braid {

namespace {
// Completes `all` once every future in `parts` has: with the first error in
// issue order, else with their values in order (Note [Coalescing]).
void completeWhenAll(const std::vector<c10::intrusive_ptr<c10::ivalue::Future>>& parts,
                     const c10::intrusive_ptr<c10::ivalue::Future>& all) {
  if (parts.empty()) {
    all->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return;
  }
  auto left = std::make_shared<std::atomic<size_t>>(parts.size());
  for (const auto& f : parts) {
    f->addCallback([left, parts, all](c10::ivalue::Future&) {
      if (left->fetch_sub(1) != 1) return;  // the last one to end completes `all`
      for (const auto& p : parts) {
        if (p->hasError()) {
          all->setError(p->exception_ptr());
          return;
        }
      }
      std::vector<at::Tensor> outputs;
      for (const auto& p : parts) {
        const auto& v = p->value();
        if (!v.isTensorList()) continue;  // an op without outputs
        for (const auto& t : v.toTensorVector()) outputs.push_back(t);
      }
      all->markCompleted(c10::IValue(outputs));
    });
  }
}
}  // namespace

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works,
                             c10d::OpType type, const char* title)
    : c10d::Work(rank, type, title),
      works_(std::move(works)) {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> parts;
  std::vector<c10::Device> devices;
  for (const auto& w : works_) {
    parts.push_back(w->getFuture());
    for (const auto& d : parts.back()->devices()) {
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    }
  }
  // The parts' CUDA devices (Note [The staged CUDA executor]): the combined
  // future then orders its waiters' streams after the ops, as each part's does.
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devices);
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
  // Every op is waited for, even after one failed (Note [Coalescing]).
  std::exception_ptr first;
  for (const auto& w : works_) {
    try {
      w->wait(timeout);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  // A part's Work is marked done just before its future is, so the combined
  // future may still be completing here: a caller that reads it after wait()
  // must find it complete (a test saw it pending on a loaded machine).
  future_->wait();
  if (first) std::rethrow_exception(first);
  return true;
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> out;
  for (const auto& w : works_) {
    for (const auto& t : w->result()) out.push_back(t);
  }
  return out;
}

c10::intrusive_ptr<c10d::Work> issueCoalesced(
    int rank, size_t n, const std::function<c10::intrusive_ptr<c10d::Work>(size_t)>& issue,
    const std::function<void(size_t, const std::string&)>& fail, c10d::OpType type,
    const char* title) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < n; ++i) {
    try {
      works.push_back(issue(i));
    } catch (const Error& e) {
      // Op i told the peers already (guarded()); the rest of the call too.
      const std::string why = strCat("op ", i, " of the same ", title, " call failed on its rank: ",
                                     e.what());
      for (size_t j = i + 1; j < n; ++j) fail(j, why);
      throw;
    }
  }
  return c10::make_intrusive<CoalescedWork>(rank, std::move(works), type, title);
}

}  // namespace braid
