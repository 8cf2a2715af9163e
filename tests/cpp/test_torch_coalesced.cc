// One Work for a whole coalesced call (Note [Coalesced calls] in
// c10d/coalesced_work.h), ranks as threads over a HashStore. Runs on every
// torch: on 1.13 the *_tensor_coalesced calls are plain members. Covers what
// Python cannot reach (torch 2.x's dispatcher refuses empty lists before any
// backend sees them) and an argument error in the middle of a call.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "c10d/process_group.h"
#include "torch_group.h"

namespace {

using PG = braid_test::PG;

using braid_test::makeGroup;
using braid_test::onRanks;

// wait()'s error ("" when it passed).
std::string waitError(const c10::intrusive_ptr<c10d::Work>& w) {
  try {
    w->wait();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

enum class Which { kAllgather, kReduceScatter };

struct Call {
  std::vector<at::Tensor> ins, outs, want;
};

// counts[i] elements per rank for op i; rank r's values depend on r and i.
Call makeCall(Which which, int r, int n, const std::vector<int64_t>& counts) {
  Call c;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t k = counts[i];
    if (which == Which::kAllgather) {
      c.ins.push_back(at::full({k}, float(r * 10 + i)));
      c.outs.push_back(at::full({k * n}, -1.f));
      std::vector<at::Tensor> parts;
      for (int p = 0; p < n; ++p) parts.push_back(at::full({k}, float(p * 10 + i)));
      c.want.push_back(at::cat(parts));
    } else {
      c.ins.push_back(at::full({k * n}, float(r + i)));
      c.outs.push_back(at::full({k}, -1.f));
      float sum = 0;
      for (int p = 0; p < n; ++p) sum += float(p + i);
      c.want.push_back(at::full({k}, sum));
    }
  }
  return c;
}

c10::intrusive_ptr<c10d::Work> issue(const PG& pg, Which which, Call& c) {
  if (which == Which::kAllgather) return pg->allgather_into_tensor_coalesced(c.outs, c.ins);
  return pg->reduce_scatter_tensor_coalesced(c.outs, c.ins);
}

class Coalesced : public ::testing::TestWithParam<Which> {};

TEST_P(Coalesced, AnEmptyCallIsACompletedWorkWithNoOutputs) {
  auto pgs = makeGroup(2);
  onRanks(2, [&](int r) {
    Call c;
    auto work = issue(pgs[r], GetParam(), c);
    EXPECT_TRUE(work->isCompleted());
    EXPECT_TRUE(work->isSuccess());
    EXPECT_EQ(waitError(work), "");
    EXPECT_TRUE(work->result().empty());
    auto fut = work->getFuture();
    ASSERT_TRUE(fut->completed());
    EXPECT_TRUE(fut->value().toTensorVector().empty());
  });
}

TEST_P(Coalesced, OneWorkCarriesEveryOutput) {
  auto pgs = makeGroup(3);
  onRanks(3, [&](int r) {
    Call c = makeCall(GetParam(), r, 3, {3, 1, 4});
    auto work = issue(pgs[r], GetParam(), c);
    EXPECT_EQ(waitError(work), "");
    EXPECT_TRUE(work->isCompleted() && work->isSuccess());
    auto fut = work->getFuture();
    fut->wait();
    auto values = fut->value().toTensorVector();
    auto result = work->result();
    ASSERT_EQ(values.size(), 3u);
    ASSERT_EQ(result.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(c.outs[i].equal(c.want[i])) << "op " << i;
      EXPECT_TRUE(values[i].is_same(c.outs[i])) << "op " << i;
      EXPECT_TRUE(result[i].is_same(c.outs[i])) << "op " << i;
    }
  });
}

TEST_P(Coalesced, TheFirstOpFailingOnTheWorkerFailsTheWorkAfterTheOthersRan) {
  auto pgs = makeGroup(2);
  onRanks(2, [&](int r) {
    // Op 0's shape differs between the ranks: its header check fails on both.
    Call c = makeCall(GetParam(), r, 2, {r == 0 ? 3 : 4, 5, 2});
    auto work = issue(pgs[r], GetParam(), c);
    const std::string err = waitError(work);
    EXPECT_HAS(err, "passed shape");
    EXPECT_TRUE(work->isCompleted());
    EXPECT_FALSE(work->isSuccess());
    auto fut = work->getFuture();
    ASSERT_TRUE(fut->completed());
    ASSERT_TRUE(fut->hasError());
    EXPECT_EQ(fut->tryRetrieveErrorMessage(), err);
    EXPECT_EQ(work->result().size(), 3u);
    for (size_t i = 1; i < 3; ++i) EXPECT_TRUE(c.outs[i].equal(c.want[i])) << "op " << i;
    // The group is in step: a plain op works.
    std::vector<at::Tensor> t{at::ones({2})};
    pgs[r]->allreduce(t)->wait();
    EXPECT_TRUE(t[0].equal(at::full({2}, 2.f)));
  });
}

TEST_P(Coalesced, AnArgumentErrorMidCallFailsTheRestOnEveryRankAndKeepsThemInStep) {
  auto pgs = makeGroup(2);
  onRanks(2, [&](int r) {
    Call c = makeCall(GetParam(), r, 2, {3, 5, 2});
    if (r == 0) c.outs[1] = at::full({7}, -1.f);  // op 1's sizes fail rank 0's own check
    if (r == 0) {
      try {
        issue(pgs[r], GetParam(), c);
        ADD_FAILURE() << "rank 0's bad op 1 was accepted";
      } catch (const std::exception& e) {
        EXPECT_HAS(std::string(e.what()), "(rank 0)");
      }
    } else {
      auto work = issue(pgs[r], GetParam(), c);
      const std::string err = waitError(work);
      EXPECT_HAS(err, "rank 0");  // op 1's poison, quoting rank 0's error
      EXPECT_TRUE(c.outs[0].equal(c.want[0]));  // op 0 ran on both ranks
    }
    // Ops 1 and 2 were failed on both ranks: the next op meets its peer's.
    std::vector<at::Tensor> t{at::ones({2})};
    pgs[r]->allreduce(t)->wait();
    EXPECT_TRUE(t[0].equal(at::full({2}, 2.f)));
  });
}

INSTANTIATE_TEST_SUITE_P(Calls, Coalesced,
                         ::testing::Values(Which::kAllgather, Which::kReduceScatter),
                         [](const ::testing::TestParamInfo<Which>& i) {
                           return i.param == Which::kAllgather ? "allgather_into_tensor"
                                                               : "reduce_scatter_tensor";
                         });

}  // namespace
