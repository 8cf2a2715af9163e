// Data-parallel training in C++ with braid: a small MLP on synthetic
// regression data, one process per rank, launched by torchrun:
//
//   torchrun --nproc_per_node=2 --no_python ./train [--epochs N] [--checkpoint PATH]
//
// Each rank draws its own shard; braid::DistributedDataParallel averages the
// gradients over ranks during backward, so every rank's model stays the same.
// At the end rank 0 saves a checkpoint and every rank loads it back.
#include <braid/c10d/init_from_env.h>
#include <braid/reducer/ddp.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr int64_t kFeatures = 32, kHidden = 128, kBatch = 64, kStepsPerEpoch = 40;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        out(register_module("out", torch::nn::Linear(kHidden, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, out;
};
TORCH_MODULE(Net);

double meanOverRanks(double value, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  std::vector<torch::Tensor> t{torch::tensor({value}, torch::kDouble)};
  pg->allreduce(t)->wait();
  return t[0].item<double>() / pg->getSize();
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 5;
  std::string checkpoint = "braid_example_checkpoint.pt";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--epochs") && i + 1 < argc) {
      epochs = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
      checkpoint = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--epochs N] [--checkpoint PATH]\n", argv[0]);
      return 2;
    }
  }
  try {
    torch::set_num_threads(1);  // one core per rank
    auto env = braid::init_from_env();
    auto& pg = env.process_group;

    // Different initial weights on purpose: DDP broadcasts rank 0's.
    torch::manual_seed(env.rank);
    Net net;
    braid::DistributedDataParallel ddp(net, pg);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    // The same target function on every rank; each rank draws its own inputs.
    torch::manual_seed(1234);
    auto wTrue = torch::randn({kFeatures, 1});
    torch::manual_seed(1000 + env.rank);

    for (int epoch = 0; epoch < epochs; ++epoch) {
      double lossSum = 0;
      auto t0 = std::chrono::steady_clock::now();
      for (int step = 0; step < kStepsPerEpoch; ++step) {
        auto x = torch::randn({kBatch, kFeatures});
        auto y = torch::sin(x.matmul(wTrue) / std::sqrt(double(kFeatures))) +
                 0.01 * torch::randn({kBatch, 1});
        opt.zero_grad();
        auto pred = ddp.forward([&] { return net->forward(x); });
        auto loss = torch::mse_loss(pred, y);
        loss.backward();  // gradients are averaged over ranks when this returns
        opt.step();
        lossSum += loss.item<double>();
      }
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double loss = meanOverRanks(lossSum / kStepsPerEpoch, pg);
      if (env.rank == 0) {
        std::printf("epoch %d  loss %.5f  %.1f steps/s  (%d ranks)\n", epoch, loss,
                    kStepsPerEpoch / seconds, env.world_size);
        std::fflush(stdout);
      }
    }

    if (env.rank == 0) torch::save(net, checkpoint);
    pg->barrier()->wait();  // the file is complete before anyone reads it
    Net restored;
    torch::load(restored, checkpoint);
    auto a = net->parameters(), b = restored->parameters();
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) same = torch::equal(a[i], b[i]);
    // Every rank must also hold rank 0's weights: DDP keeps them in step.
    double mismatch = same ? 0.0 : 1.0;
    mismatch = meanOverRanks(mismatch, pg);
    if (env.rank == 0) {
      std::printf("checkpoint %s: %zu tensors reloaded, %s on every rank\n", checkpoint.c_str(),
                  b.size(), mismatch == 0.0 ? "identical" : "DIFFERENT");
    }
    pg->barrier()->wait();
    return mismatch == 0.0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
