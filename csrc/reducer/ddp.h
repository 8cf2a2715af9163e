// braid::DistributedDataParallel: data-parallel training for LibTorch C++
// modules, which the C++ frontend lacks (pytorch #48959, #40581).
//
//   auto env = braid::init_from_env();                 // c10d/init_from_env.h
//   auto net = std::make_shared<Net>();                // any torch::nn::Module
//   braid::DistributedDataParallel ddp(net, env.process_group);
//   torch::optim::SGD opt(net->parameters(), 0.1);
//   for (auto& [x, y] : batches) {
//     opt.zero_grad();
//     auto out = ddp.forward([&] { return net->forward(x); });
//     torch::mse_loss(out, y).backward();  // grads are averaged over ranks on return
//     opt.step();
//   }
//   {
//     auto guard = ddp.no_sync();  // accumulate locally; the next synced step reduces
//     ddp.forward([&] { return net->forward(x); }).sum().backward();
//   }
//
// Construction is collective: parameter shapes are checked to match on every
// rank, then parameters and buffers are broadcast from rank 0.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "reducer/reducer.h"

namespace braid {

struct DDPOptions {
  double bucket_cap_mb = 25;  // later buckets
  double first_bucket_mb = 1;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool broadcast_buffers = true;  // rank 0's buffers before each forward
  bool static_graph = false;
};

namespace detail {
template <typename T>
struct AlwaysFalse : std::false_type {};

inline void collectTensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collectTensors(const std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
  out.insert(out.end(), v.begin(), v.end());
}
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out);
template <typename... Ts>
void collectTensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out);
template <typename T>
void collectTensors(const T&, std::vector<at::Tensor>&) {
  static_assert(AlwaysFalse<T>::value,
                "DistributedDataParallel::forward can find tensors in a Tensor, a "
                "std::vector<Tensor>, a std::pair or a std::tuple of those; for other output "
                "types call prepare_forward(), the module, then prepare_backward(tensors).");
}
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collectTensors(p.first, out);
  collectTensors(p.second, out);
}
template <typename... Ts>
void collectTensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collectTensors(e, out), ...); }, t);
}
}  // namespace detail

class DistributedDataParallel;

// Turns gradient synchronization off for its lifetime (see no_sync()).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer& reducer);
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard();

 private:
  Reducer* reducer_;
  bool previous_;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                          DDPOptions options = {});
  template <typename Impl>  // a TORCH_MODULE holder
  DistributedDataParallel(const torch::nn::ModuleHolder<Impl>& module,
                          c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                          DDPOptions options = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                                std::move(process_group), options) {}
  ~DistributedDataParallel();

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  // Runs fn (which calls the module's forward) between prepare_forward and
  // prepare_backward, handing the output's tensors to the reducer.
  template <typename Fn>
  auto forward(Fn&& fn) -> decltype(fn()) {
    prepare_forward();
    auto out = std::forward<Fn>(fn)();
    std::vector<at::Tensor> tensors;
    detail::collectTensors(out, tensors);
    prepare_backward(tensors);
    return out;
  }
  // The two halves of forward(), for outputs forward() cannot look into.
  // prepare_forward: checks the previous backward finished, rebuilds buckets
  // after the first iteration, broadcasts buffers. prepare_backward: arms the
  // gradient hooks (outputs are needed with find_unused_parameters only).
  void prepare_forward();
  void prepare_backward(const std::vector<at::Tensor>& outputs = {});

  // While the guard lives, backward accumulates gradients without
  // communication; the next synced backward reduces the accumulated sum.
  NoSyncGuard no_sync();

  // Replaces the default allreduce-and-average (e.g. a braid compression hook).
  // Call before the first backward.
  void register_comm_hook(std::shared_ptr<c10d::CommHookInterface> hook);
  void register_comm_hook(std::unique_ptr<c10d::CommHookInterface> hook) {
    register_comm_hook(std::shared_ptr<c10d::CommHookInterface>(std::move(hook)));
  }

  Reducer& reducer() { return *reducer_; }
  const DDPOptions& options() const { return options_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }

 private:
  std::vector<at::Tensor> moduleBuffers() const;

  std::shared_ptr<torch::nn::Module> module_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  DDPOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace braid
