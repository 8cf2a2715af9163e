// The c10d backend driven from C++, ranks as threads over a HashStore:
// results, futures, and argument errors that Python cannot reach on every
// torch version (torch 1.13's dispatcher rejects meta tensors before any
// backend sees them).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "c10d/process_group.h"
#include "timing.h"
#include "torch_group.h"

namespace {

using PG = braid_test::PG;

using braid_test::makeGroup;
using braid_test::onRanks;

TEST(Backend, AllreduceFutureHoldsTheOutput) {
  auto pgs = makeGroup(3);
  onRanks(3, [&](int r) {
    std::vector<at::Tensor> t{at::full({5}, float(r + 1))};
    auto work = pgs[r]->allreduce(t);
    auto fut = work->getFuture();
    fut->wait();
    auto out = fut->value().toTensorVector();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].equal(at::full({5}, 6.f)));
    EXPECT_TRUE(work->isCompleted() && work->isSuccess());
  });
}

TEST(Backend, ArgumentErrorsNameOpRankAndValue) {
  auto pgs = makeGroup(2);
  onRanks(2, [&](int r) {
    std::vector<at::Tensor> meta{at::empty({2}, at::TensorOptions().device(at::kMeta))};
    try {
      pgs[r]->allreduce(meta);
      ADD_FAILURE() << "meta tensor accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("braid allreduce (rank " + std::to_string(r) +
                                           "): tensors must be on the CPU or a CUDA device, got meta"),
                std::string::npos)
          << e.what();
    }
    std::vector<at::Tensor> cplx{at::ones({2}, at::kComplexFloat)};
    try {
      pgs[r]->broadcast(cplx);
      ADD_FAILURE() << "complex tensor accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("unsupported dtype complex64"), std::string::npos)
          << e.what();
    }
    // Both ranks failed locally; the group still works.
    std::vector<at::Tensor> ok{at::ones({2})};
    pgs[r]->allreduce(ok)->wait();
    EXPECT_TRUE(ok[0].equal(at::full({2}, 2.f)));
  });
}

TEST(Backend, OneRankFailingLocallyFailsThePeerFast) {
  const std::chrono::milliseconds timeout(20000);
  auto pgs = makeGroup(2, timeout);
  onRanks(2, [&](int r) {
    std::vector<at::Tensor> t{r == 0 ? at::ones({2}, at::kComplexFloat) : at::ones({2})};
    auto t0 = std::chrono::steady_clock::now();
    try {
      pgs[r]->allreduce(t)->wait();
      ADD_FAILURE() << "no error on rank " << r;
    } catch (const std::exception& e) {
      if (r == 1) {
        EXPECT_NE(std::string(e.what()).find("rank 0 failed this op"), std::string::npos)
            << e.what();
      }
    }
    // Not at the op's deadline (Note [Timing bounds in tests] in tests/cpp/timing.h).
    EXPECT_TRUE(braid::testing::endedEarly(std::chrono::steady_clock::now() - t0, timeout))
        << "rank " << r;
  });
}

// torchft's errored(): empty while the group is usable (argument errors
// leave it usable), then the first error that broke it.
TEST(Backend, ErroredReportsTheErrorThatBrokeTheGroup) {
  auto pgs = makeGroup(2);
  for (auto& pg : pgs) EXPECT_EQ(pg->errored(), "");
  onRanks(2, [&](int r) {
    std::vector<at::Tensor> cplx{at::ones({2}, at::kComplexFloat)};
    EXPECT_ANY_THROW(pgs[r]->allreduce(cplx));  // rejected on the caller's thread
    std::vector<at::Tensor> ok{at::ones({2})};
    pgs[r]->allreduce(ok)->wait();  // each rank's poison header reached the other
  });
  for (auto& pg : pgs) EXPECT_EQ(pg->errored(), "");

  // Rank 0 allreduces alone: it times out, which breaks the group for it.
  pgs[0]->setTimeout(std::chrono::milliseconds(200));
  std::vector<at::Tensor> t{at::ones({4})};
  EXPECT_ANY_THROW(pgs[0]->allreduce(t)->wait());
  EXPECT_NE(pgs[0]->errored().find("Timed out after 200 ms"), std::string::npos)
      << pgs[0]->errored();
  pgs[0]->abort();  // the first error stays
  EXPECT_NE(pgs[0]->errored().find("Timed out"), std::string::npos) << pgs[0]->errored();

  EXPECT_EQ(pgs[1]->errored(), "");
  pgs[1]->abort();
  EXPECT_NE(pgs[1]->errored().find("aborted"), std::string::npos) << pgs[1]->errored();
}

}  // namespace
