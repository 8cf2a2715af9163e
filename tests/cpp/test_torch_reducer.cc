// braid::Reducer / braid::DistributedDataParallel, ranks as threads over one
// c10d::HashStore. Every case checks, after each step, that each rank's
// gradients equal those of one process training on the concatenated batch.
// Runs over gloo when its headers are installed (libgloo-dev) and over braid.
#if __has_include(<gloo/config.h>)
#define USE_C10D_GLOO 1
#define BRAID_TEST_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "c10d/compat.h"
#include "c10d/init_from_env.h"
#include "common/error.h"
#include "reducer/buckets.h"
#include "reducer/ddp.h"
#include "reducer/param_sync.h"

#ifndef BRAID_TEST_NO_BRAID_PG
#include "c10d/process_group.h"
#endif

namespace braid {
namespace {

using Tensor = at::Tensor;
constexpr auto kCollectiveTimeout = std::chrono::seconds(20);
constexpr auto kCaseTimeout = std::chrono::seconds(50);

// ---- process groups and ranks as threads ------------------------------------

c10::intrusive_ptr<c10d::ProcessGroup> makeGroup(const std::string& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world) {
#ifdef BRAID_TEST_HAVE_GLOO
  if (backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(kCollectiveTimeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 1;
    return compat::wrapAsProcessGroup(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts), store);
  }
#endif
#ifndef BRAID_TEST_NO_BRAID_PG
  if (backend == "braid") return createProcessGroup(store, rank, world, kCollectiveTimeout);
#endif
  throw std::runtime_error("no process group backend " + backend);
}

std::vector<std::string> backends() {
  std::vector<std::string> out;
#ifdef BRAID_TEST_HAVE_GLOO
  out.push_back("gloo");
#endif
#ifndef BRAID_TEST_NO_BRAID_PG
  out.push_back("braid");
#endif
  return out;
}

// Runs fn(rank, pg) on `world` threads and returns each rank's exception
// message ("" when it returned). A case that overruns kCaseTimeout aborts the
// process: a hung collective must never hang the suite.
std::vector<std::string> runRanks(
    const std::string& backend, int world,
    const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  std::mutex m;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = makeGroup(backend, store, r, world);
        fn(r, pg);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty exception message)";
      }
      std::lock_guard<std::mutex> lock(m);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, kCaseTimeout, [&] { return done == world; })) {
      std::fprintf(stderr, "test_torch_reducer: ranks did not finish within %lld s, aborting\n",
                   static_cast<long long>(kCaseTimeout.count()));
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expectNoErrors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// ---- models -------------------------------------------------------------------

// y = x W^T + b, on plain parameters so the test needs no nn::Linear.
struct Affine : torch::nn::Module {
  Affine(int64_t in, int64_t out) {
    weight = register_parameter("weight", at::randn({out, in}) / std::sqrt(double(in)));
    bias = register_parameter("bias", at::randn({out}) * 0.1);
  }
  Tensor forward(const Tensor& x) { return at::addmm(bias, x, weight.t()); }
  Tensor weight, bias;
};

constexpr int64_t kIn = 6, kHidden = 10, kOut = 3;

struct Mlp : torch::nn::Module {
  explicit Mlp(int64_t hidden = kHidden)
      : fc1(register_module("fc1", std::make_shared<Affine>(kIn, hidden))),
        fc2(register_module("fc2", std::make_shared<Affine>(hidden, kOut))) {}
  Tensor forward(const Tensor& x) { return fc2->forward(at::tanh(fc1->forward(x))); }
  std::shared_ptr<Affine> fc1, fc2;
};

// The same submodule registered twice (deduplicated by DDP) and applied twice
// (its gradient accumulates from two uses before its one hook fires).
struct Shared : torch::nn::Module {
  Shared()
      : inp(register_module("inp", std::make_shared<Affine>(kIn, kHidden))),
        mid(register_module("mid", std::make_shared<Affine>(kHidden, kHidden))),
        out(register_module("out", std::make_shared<Affine>(kHidden, kOut))) {
    register_module("mid_again", mid);
  }
  Tensor forward(const Tensor& x) {
    auto h = at::tanh(inp->forward(x));
    h = at::tanh(mid->forward(h));
    h = at::tanh(mid->forward(h));
    return out->forward(h);
  }
  std::shared_ptr<Affine> inp, mid, out;
};

// `side` is used on rank 0 only (locally unused elsewhere, globally used);
// `never` is used nowhere; `odd` only on odd steps.
struct Branchy : torch::nn::Module {
  Branchy()
      : main(register_module("main", std::make_shared<Affine>(kIn, kOut))),
        side(register_module("side", std::make_shared<Affine>(kIn, kOut))),
        never(register_module("never", std::make_shared<Affine>(kIn, kOut))),
        odd(register_module("odd", std::make_shared<Affine>(kIn, kOut))) {}
  Tensor forward(const Tensor& x, int rank, int step) {
    auto y = main->forward(x);
    if (rank == 0) y = y + side->forward(x);
    if (step % 2 == 1) y = y + odd->forward(x);
    return y;
  }
  std::shared_ptr<Affine> main, side, never, odd;
};

// A buffer that scales the output and that every rank drifts differently after
// each step: with broadcast_buffers, forward must see rank 0's value.
struct Buffered : torch::nn::Module {
  Buffered() : fc(register_module("fc", std::make_shared<Affine>(kIn, kOut))) {
    scale = register_buffer("scale", at::full({kOut}, 1.5));
  }
  Tensor forward(const Tensor& x) { return fc->forward(x) * scale; }
  std::shared_ptr<Affine> fc;
  Tensor scale;
};

// ---- the equivalence harness ----------------------------------------------------

using Forward = std::function<Tensor(torch::nn::Module&, const Tensor&, int rank, int step)>;

template <typename M>
Forward plainForward() {
  return [](torch::nn::Module& m, const Tensor& x, int, int) {
    return dynamic_cast<M&>(m).forward(x);
  };
}

struct Case {
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  Forward forward;
  bool rankDependent = false;  // forward depends on the rank: reference runs shard by shard
  DDPOptions options;
  int world = 2;
  int steps = 4;
  int accumulate = 1;        // micro-steps per synced step, the first ones under no_sync
                             // (forward's `step` counts micro-steps)
  bool gradsToNone = false;  // zero_grad by dropping .grad instead of zero_()
  std::function<void(torch::nn::Module&, int rank)> afterStep;  // e.g. drift buffers
  // Parameters whose .grad the harness neither resets nor compares (`init`
  // gives them a rank-specific gradient that must survive).
  std::set<std::string> untouched;
  std::function<void(torch::nn::Module&, int rank)> init;
  std::function<std::shared_ptr<c10d::CommHookInterface>(c10::intrusive_ptr<c10d::ProcessGroup>)>
      hook;
  std::function<void(DistributedDataParallel&, int rank, int step)> check;
};

constexpr int64_t kBatch = 5;
constexpr double kLr = 0.1;

// Gradients after each synced step, by parameter name (undefined: no grad).
using GradLog = std::vector<std::map<std::string, Tensor>>;

std::vector<std::pair<std::string, Tensor>> uniqueParams(torch::nn::Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& it : m.named_parameters()) {
    if (seen.insert(it.value().unsafeGetTensorImpl()).second)
      out.emplace_back(it.key(), it.value());
  }
  return out;
}

void zeroGrads(torch::nn::Module& m, bool toNone, const std::set<std::string>& keep) {
  for (auto& p : uniqueParams(m)) {
    if (keep.count(p.first)) continue;
    Tensor& g = p.second.mutable_grad();
    if (!g.defined()) continue;
    if (toNone) {
      g = Tensor();
    } else {
      g.detach_();  // as torch::optim::Optimizer::zero_grad does on torch 1.13
      g.zero_();
    }
  }
}

void sgdStep(torch::nn::Module& m, std::map<std::string, Tensor>* log) {
  at::NoGradGuard noGrad;
  for (auto& p : uniqueParams(m)) {
    const Tensor& g = p.second.grad();
    if (log) (*log)[p.first] = g.defined() ? g.clone() : Tensor();
    if (g.defined()) p.second.sub_(g * kLr);
  }
}

struct Data {
  // [step][micro][rank]
  std::vector<std::vector<std::vector<Tensor>>> x, y;
};

Data makeData(const Case& c) {
  Data d;
  d.x.resize(c.steps);
  d.y.resize(c.steps);
  for (int s = 0; s < c.steps; ++s) {
    d.x[s].resize(c.accumulate);
    d.y[s].resize(c.accumulate);
    for (int a = 0; a < c.accumulate; ++a) {
      for (int r = 0; r < c.world; ++r) {
        d.x[s][a].push_back(at::randn({kBatch, kIn}));
        d.y[s][a].push_back(at::randn({kBatch, kOut}));
      }
    }
  }
  return d;
}

GradLog trainReference(const Case& c, torch::nn::Module& m, const Data& d) {
  GradLog log(c.steps);
  for (int s = 0; s < c.steps; ++s) {
    zeroGrads(m, c.gradsToNone, c.untouched);
    for (int a = 0; a < c.accumulate; ++a) {
      Tensor loss;
      if (c.rankDependent) {
        // Mean over the concatenated batch == mean of the equal-sized shard means.
        for (int r = 0; r < c.world; ++r) {
          auto l = at::mse_loss(c.forward(m, d.x[s][a][r], r, s * c.accumulate + a), d.y[s][a][r]) /
                   c.world;
          loss = loss.defined() ? loss + l : l;
        }
      } else {
        loss = at::mse_loss(c.forward(m, at::cat(d.x[s][a]), 0, s * c.accumulate + a),
                            at::cat(d.y[s][a]));
      }
      loss.backward();
    }
    sgdStep(m, &log[s]);
    if (c.afterStep) c.afterStep(m, 0);
  }
  return log;
}

GradLog trainRank(const Case& c, torch::nn::Module& m, DistributedDataParallel& ddp, int rank,
                  const Data& d) {
  GradLog log(c.steps);
  for (int s = 0; s < c.steps; ++s) {
    zeroGrads(m, c.gradsToNone, c.untouched);
    for (int a = 0; a < c.accumulate; ++a) {
      auto step = [&] {
        auto out =
            ddp.forward([&] { return c.forward(m, d.x[s][a][rank], rank, s * c.accumulate + a); });
        at::mse_loss(out, d.y[s][a][rank]).backward();
      };
      if (a + 1 < c.accumulate) {
        auto guard = ddp.no_sync();
        step();
      } else {
        step();
      }
    }
    sgdStep(m, &log[s]);
    if (c.check) c.check(ddp, rank, s);
    if (c.afterStep) c.afterStep(m, rank);
  }
  return log;
}

void expectSameGrads(const GradLog& want, const GradLog& got, int rank,
                     const std::set<std::string>& skip) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t s = 0; s < want.size(); ++s) {
    for (const auto& kv : want[s]) {
      if (skip.count(kv.first)) continue;
      SCOPED_TRACE("rank " + std::to_string(rank) + " step " + std::to_string(s) + " param " +
                   kv.first);
      auto it = got[s].find(kv.first);
      ASSERT_NE(it, got[s].end());
      ASSERT_EQ(kv.second.defined(), it->second.defined());
      if (!kv.second.defined()) continue;
      EXPECT_TRUE(at::allclose(kv.second, it->second, 1e-5, 1e-6))
          << "max abs diff " << (kv.second - it->second).abs().max().item<double>();
    }
  }
}

// Rank r's model starts from different values (seed 100 + r): DDP must
// broadcast rank 0's, which the reference starts from.
void runCase(const std::string& backend, const Case& c) {
  at::manual_seed(7);
  Data d = makeData(c);
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < c.world; ++r) {
    at::manual_seed(100 + r);
    models.push_back(c.make());
    if (c.init) c.init(*models.back(), r);
  }
  at::manual_seed(100);
  auto reference = c.make();
  GradLog want = trainReference(c, *reference, d);
  std::vector<GradLog> got(c.world);
  expectNoErrors(runRanks(backend, c.world, [&](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[r], pg, c.options);
    if (c.hook) ddp.register_comm_hook(c.hook(pg));
    got[r] = trainRank(c, *models[r], ddp, r, d);
  }));
  for (int r = 0; r < c.world; ++r) expectSameGrads(want, got[r], r, c.untouched);
  // Same gradients and updates from the same start: same parameters.
  auto refParams = uniqueParams(*reference);
  for (int r = 0; r < c.world; ++r) {
    auto ps = uniqueParams(*models[r]);
    ASSERT_EQ(ps.size(), refParams.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      if (c.untouched.count(ps[i].first)) continue;
      EXPECT_TRUE(at::allclose(ps[i].second, refParams[i].second, 1e-5, 1e-6))
          << "rank " << r << " param " << ps[i].first;
    }
  }
}

// An out-of-place allreduce-and-average hook: exercises the comm-hook path,
// including a result tensor that is not the bucket buffer.
class MeanHook : public c10d::CommHookInterface {
 public:
  explicit MeanHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::atomic<int>* calls)
      : pg_(std::move(pg)), calls_(calls) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    ++*calls_;
    std::vector<Tensor> ts{bucket.getBufferRef()};
    const int world = pg_->getSize();
    return pg_->allreduce(ts)->getFuture()->then(
        [world](c10::ivalue::Future& f) {
          return c10::IValue(f.value().toTensorVector()[0] / world);
        },
        c10::TensorType::get());
  }
  Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::atomic<int>* calls_;
};

class ReducerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

DDPOptions tinyBuckets(DDPOptions o = {}) {
  // 16 then 32 bytes: most parameters get a bucket of their own, so order matters.
  o.first_bucket_mb = 16.0 / (1 << 20);
  o.bucket_cap_mb = 32.0 / (1 << 20);
  return o;
}

TEST_P(ReducerTest, MlpOneBucket) {
  Case c;
  c.make = [] { return std::make_shared<Mlp>(); };
  c.forward = plainForward<Mlp>();
  runCase(GetParam(), c);
}

TEST_P(ReducerTest, MlpManyBucketsRebuiltThreeRanks) {
  Case c;
  c.make = [] { return std::make_shared<Mlp>(); };
  c.forward = plainForward<Mlp>();
  c.world = 3;
  c.options = tinyBuckets();
  c.check = [](DistributedDataParallel& ddp, int, int step) {
    // Rebuilt at the second synced forward, which ran at step 1.
    EXPECT_EQ(ddp.reducer().bucketsRebuilt(), step >= 1);
    EXPECT_GE(ddp.reducer().bucketIndices().size(), 3u);
  };
  runCase(GetParam(), c);
}

TEST_P(ReducerTest, GradientAsBucketView) {
  for (bool toNone : {false, true}) {
    SCOPED_TRACE(toNone ? "grads set to none" : "grads zeroed");
    Case c;
    c.make = [] { return std::make_shared<Mlp>(); };
    c.forward = plainForward<Mlp>();
    c.options = tinyBuckets();
    c.options.gradient_as_bucket_view = true;
    c.gradsToNone = toNone;
    c.check = [](DistributedDataParallel& ddp, int, int) {
      // Every grad aliases the bucket storage.
      for (auto& p : ddp.module()->parameters()) {
        EXPECT_TRUE(p.grad().defined());
      }
    };
    runCase(GetParam(), c);
  }
}

TEST_P(ReducerTest, SharedParameters) {
  Case c;
  c.make = [] { return std::make_shared<Shared>(); };
  c.forward = plainForward<Shared>();
  c.options = tinyBuckets();
  runCase(GetParam(), c);
}

TEST_P(ReducerTest, UnusedParameters) {
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "bucket view" : "copy");
    Case c;
    c.make = [] { return std::make_shared<Branchy>(); };
    c.forward = [](torch::nn::Module& m, const Tensor& x, int rank, int step) {
      return dynamic_cast<Branchy&>(m).forward(x, rank, step);
    };
    c.rankDependent = true;
    c.options = tinyBuckets();
    c.options.find_unused_parameters = true;
    c.options.gradient_as_bucket_view = view;
    c.gradsToNone = true;
    // Unused on every rank: .grad keeps this rank's own value, unaveraged,
    // whether defined (weight) or not (bias).
    c.untouched = {"never.weight", "never.bias"};
    c.init = [](torch::nn::Module& m, int rank) {
      auto& w = dynamic_cast<Branchy&>(m).never->weight;
      w.mutable_grad() = at::full(w.sizes(), 7.0 + rank);
    };
    c.check = [](DistributedDataParallel& ddp, int rank, int) {
      auto& m = dynamic_cast<Branchy&>(*ddp.module());
      ASSERT_TRUE(m.never->weight.grad().defined());
      EXPECT_TRUE(at::equal(m.never->weight.grad(), at::full({kOut, kIn}, 7.0 + rank)));
      EXPECT_FALSE(m.never->bias.grad().defined());
    };
    runCase(GetParam(), c);
  }
}

TEST_P(ReducerTest, StaticGraphWithUnusedParameters) {
  Case c;
  c.make = [] { return std::make_shared<Branchy>(); };
  // Same graph every step (rank-dependent, step-independent).
  c.forward = [](torch::nn::Module& m, const Tensor& x, int rank, int) {
    return dynamic_cast<Branchy&>(m).forward(x, rank, 0);
  };
  c.rankDependent = true;
  c.options = tinyBuckets();
  c.options.static_graph = true;
  runCase(GetParam(), c);
}

TEST_P(ReducerTest, Buffers) {
  Case c;
  c.make = [] { return std::make_shared<Buffered>(); };
  c.forward = plainForward<Buffered>();
  c.afterStep = [](torch::nn::Module& m, int rank) {
    at::NoGradGuard noGrad;
    dynamic_cast<Buffered&>(m).scale.add_(0.25 + rank);  // ranks drift apart
  };
  runCase(GetParam(), c);
}

TEST_P(ReducerTest, NoSyncAccumulation) {
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "bucket view" : "copy");
    Case c;
    c.make = [] { return std::make_shared<Mlp>(); };
    c.forward = plainForward<Mlp>();
    c.accumulate = 3;
    c.options = tinyBuckets();
    c.options.gradient_as_bucket_view = view;
    runCase(GetParam(), c);
  }
}

TEST_P(ReducerTest, NoSyncWithUnusedParameters) {
  Case c;
  c.make = [] { return std::make_shared<Branchy>(); };
  // `odd` is used in the first (no_sync) micro-step of each step only: its
  // accumulated gradient must still be reduced by the synced step.
  c.forward = [](torch::nn::Module& m, const Tensor& x, int rank, int step) {
    return dynamic_cast<Branchy&>(m).forward(x, rank, step + 1);
  };
  c.rankDependent = true;
  c.accumulate = 2;
  c.options.find_unused_parameters = true;
  c.gradsToNone = true;
  runCase(GetParam(), c);
}

TEST_P(ReducerTest, CommHook) {
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "bucket view" : "copy");
    std::atomic<int> calls{0};
    Case c;
    c.make = [] { return std::make_shared<Mlp>(); };
    c.forward = plainForward<Mlp>();
    c.options = tinyBuckets();
    c.options.gradient_as_bucket_view = view;
    c.hook = [&](c10::intrusive_ptr<c10d::ProcessGroup> pg) {
      return std::make_shared<MeanHook>(pg, &calls);
    };
    runCase(GetParam(), c);
    EXPECT_GT(calls.load(), 0);
  }
}

// ---- bucket order -------------------------------------------------------------------

// Parameters registered in an order unlike their use: c, a, b; used a -> b -> c,
// so gradients become ready c (0), b (2), a (1).
struct Chain : torch::nn::Module {
  Chain() {
    c = register_parameter("c", at::randn({kHidden, kOut}) * 0.3);
    a = register_parameter("a", at::randn({kIn, kHidden}) * 0.3);
    b = register_parameter("b", at::randn({kHidden, kHidden}) * 0.3);
  }
  Tensor forward(const Tensor& x) { return at::tanh(at::tanh(x.mm(a)).mm(b)).mm(c); }
  Tensor a, b, c;
};

TEST_P(ReducerTest, BucketsRebuiltInReadyOrder) {
  Case c;
  c.make = [] { return std::make_shared<Chain>(); };
  c.forward = plainForward<Chain>();
  c.options = tinyBuckets();
  c.check = [](DistributedDataParallel& ddp, int, int step) {
    using V = std::vector<std::vector<size_t>>;
    const V want = step == 0 ? V{{2}, {1}, {0}} : V{{0}, {2}, {1}};
    EXPECT_EQ(ddp.reducer().bucketIndices(), want);
  };
  runCase(GetParam(), c);
}

TEST(ReducerBuckets, AssignBySizeAndKey) {
  // First bucket closes at >= 500 bytes, later ones at >= 1000.
  EXPECT_EQ(assignBuckets({{400, 0}, {400, 0}, {400, 0}, {400, 0}}, {3, 2, 1, 0}, {500, 1000}),
            (std::vector<std::vector<size_t>>{{3, 2}, {1, 0}}));
  // Keys never share a bucket; buckets sorted by their first visit.
  EXPECT_EQ(assignBuckets({{100, 0}, {100, 1}, {100, 0}, {100, 1}}, {0, 1, 2, 3}, {150}),
            (std::vector<std::vector<size_t>>{{0, 2}, {1, 3}}));
  // Larger than the limit: a bucket of its own.
  EXPECT_EQ(assignBuckets({{10, 0}, {5000, 0}, {10, 0}}, {0, 1, 2}, {100}),
            (std::vector<std::vector<size_t>>{{0, 1}, {2}}));
  EXPECT_THROW(assignBuckets({{1, 0}, {1, 0}}, {0, 0}, {1}), Error);
}

TEST_P(ReducerTest, MixedDtypesGetSeparateBuckets) {
  expectNoErrors(runRanks(GetParam(), 2, [](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    auto f = at::ones({4}).requires_grad_();
    auto d = at::ones({4}, at::kDouble).requires_grad_();
    Reducer reducer({f, d}, {"f", "d"}, pg);
    EXPECT_EQ(reducer.bucketIndices(), (std::vector<std::vector<size_t>>{{1}, {0}}));
    reducer.prepareForForward();
    reducer.prepareForBackward({});
    ((f * (r + 1)).sum() + (d * (r + 1)).sum()).backward();
    // Mean over ranks of (r + 1).
    EXPECT_TRUE(at::allclose(f.grad(), at::full({4}, 1.5)));
    EXPECT_TRUE(at::allclose(d.grad(), at::full({4}, 1.5, at::kDouble)));
  }));
}

// ---- errors -----------------------------------------------------------------------

TEST_P(ReducerTest, ShapeMismatchNamesParameterAndRanks) {
  at::manual_seed(1);
  std::vector<std::shared_ptr<torch::nn::Module>> models = {std::make_shared<Mlp>(10),
                                                            std::make_shared<Mlp>(12)};
  auto errors = runRanks(GetParam(), 2, [&](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[r], pg);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "braid ddp (rank " + std::to_string(r) +
                             "): parameter 'fc1.weight' (index 0) differs across ranks: [10, 6] "
                             "(Float) on rank 0 but [12, 6] (Float) on rank 1 (every rank must "
                             "wrap the same model, with parameters in the same order)");
  }
}

TEST_P(ReducerTest, ParameterCountMismatch) {
  auto errors = runRanks(GetParam(), 2, [&](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    std::vector<Tensor> params;
    std::vector<std::string> names;
    for (int i = 0; i <= r; ++i) {
      params.push_back(at::ones({2}));
      names.push_back("p" + std::to_string(i));
    }
    verifyParamsAcrossRanks(pg, params, names);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "braid ddp (rank " + std::to_string(r) +
                             "): ranks disagree on the number of parameters: rank 1 has 2 but "
                             "rank 0 has 1 (every rank must wrap the same model)");
  }
}

TEST_P(ReducerTest, UnfinishedReductionNamesUnusedParameters) {
  at::manual_seed(1);
  std::vector<std::shared_ptr<Branchy>> models = {std::make_shared<Branchy>(),
                                                  std::make_shared<Branchy>()};
  auto errors = runRanks(GetParam(), 2, [&](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[r], pg);  // no find_unused_parameters
    auto x = at::randn({kBatch, kIn});
    for (int step = 0; step < 2; ++step) {
      ddp.forward([&] { return models[r]->main->forward(x); }).sum().backward();
    }
  });
  const std::string tail =
      ". If your model has parameters that are not used to produce the loss, pass "
      "find_unused_parameters=true to DistributedDataParallel, and make sure every output of "
      "forward() takes part in the loss.";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "braid ddp (rank " + std::to_string(r) +
                             "): expected to have finished reducing gradients in the prior "
                             "iteration before starting a new one. Parameters that did not get a "
                             "gradient on rank " +
                             std::to_string(r) +
                             ": side.weight (index 2), side.bias (index 3), never.weight (index "
                             "4), never.bias (index 5), odd.weight (index 6), odd.bias (index 7)" +
                             tail);
  }
}

TEST_P(ReducerTest, MarkedReadyTwice) {
  at::manual_seed(1);
  std::vector<std::shared_ptr<Mlp>> models = {std::make_shared<Mlp>(), std::make_shared<Mlp>()};
  auto errors = runRanks(GetParam(), 2, [&](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DistributedDataParallel ddp(models[r], pg);  // one bucket: nothing launches early
    auto& m = *models[r];
    auto x = at::randn({kBatch, kIn});
    ddp.prepare_forward();
    auto h = m.fc1->forward(x);
    auto y = m.fc2->forward(at::tanh(h));
    ddp.prepare_backward({y});
    h.sum().backward({}, /*retain_graph=*/true);  // fc1's hooks fire
    y.sum().backward();                           // ... and again
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r].rfind("braid ddp (rank " + std::to_string(r) +
                                  "): parameter 'fc1.bias' (index 1) was marked ready twice in "
                                  "one backward pass",
                              0),
              0u)
        << errors[r];
  }
}

TEST_P(ReducerTest, StaticGraphChanged) {
  at::manual_seed(1);
  std::vector<std::shared_ptr<Branchy>> models = {std::make_shared<Branchy>(),
                                                  std::make_shared<Branchy>()};
  auto errors = runRanks(GetParam(), 2, [&](int r, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    DDPOptions o;
    o.static_graph = true;
    DistributedDataParallel ddp(models[r], pg, o);
    auto x = at::randn({kBatch, kIn});
    for (int step = 0; step < 2; ++step) {  // `odd` joins the graph at step 1
      ddp.forward([&] { return models[r]->forward(x, /*rank=*/1, step); }).sum().backward();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r].rfind("braid ddp (rank " + std::to_string(r) +
                                  "): the autograd graph changed under static_graph=true: "
                                  "parameter 'odd.",
                              0),
              0u)
        << errors[r];
    EXPECT_NE(errors[r].find("got 1 gradient hooks in this backward vs 0 in the first iteration"),
              std::string::npos)
        << errors[r];
  }
}

// ---- init_from_env -------------------------------------------------------------

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(InitFromEnv, NamesMissingVariable) {
  ScopedEnv ws("WORLD_SIZE", "2"), rank("RANK", "0"), addr("MASTER_ADDR", nullptr);
  try {
    init_from_env();
    FAIL() << "init_from_env did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "braid init_from_env (rank -1): environment variable MASTER_ADDR is not set (set "
              "by torchrun; for a manual launch set RANK, WORLD_SIZE, MASTER_ADDR and "
              "MASTER_PORT)");
  }
}

TEST(InitFromEnv, RejectsRankOutsideWorld) {
  ScopedEnv ws("WORLD_SIZE", "2"), rank("RANK", "2");
  try {
    init_from_env();
    FAIL() << "init_from_env did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "braid init_from_env (rank -1): environment variable RANK='2' is not an integer in "
              "[0, 1]");
  }
}

TEST(InitFromEnv, SingleRankGroupWorks) {
  ScopedEnv ws("WORLD_SIZE", "1"), rank("RANK", "0"), local("LOCAL_RANK", "0"),
      addr("MASTER_ADDR", "127.0.0.1"), agent("TORCHELASTIC_USE_AGENT_STORE", nullptr);
  // freePort() closes the port before the store binds it, and another test
  // running beside this one (ctest -j) may take it as an outgoing connection's
  // ephemeral port in between (seen in CI: "Address already in use"): a few
  // fresh ports before giving up.
  DistEnv env;
  for (int attempt = 0;; ++attempt) {
    const std::string port = std::to_string(freePort());
    ScopedEnv p("MASTER_PORT", port.c_str());
    try {
      env = init_from_env(std::chrono::seconds(20));
      break;
    } catch (const std::exception& e) {
      if (attempt == 4 || std::string(e.what()).find("Address already in use") ==
                              std::string::npos) {
        throw;
      }
    }
  }
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  ASSERT_TRUE(env.process_group);
  std::vector<Tensor> t{at::arange(4, at::kFloat)};
  env.process_group->allreduce(t)->wait();
  EXPECT_TRUE(at::equal(t[0], at::arange(4, at::kFloat)));
}

INSTANTIATE_TEST_SUITE_P(Backends, ReducerTest, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ReducerTest);

}  // namespace
}  // namespace braid
