// Registered buffers (Note [Registered buffers]), ranks as threads: the
// registration collective, the registered allreduce against closed forms,
// ranks that disagree, and release.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "collectives/shm/collectives.h"
#include "collectives/shm/registered.h"
#include "core_group.h"
#include "memory_store.h"
#include "transport/shm/shared_region.h"

namespace braid {
namespace {

using collectives::Algo;
using collectives::Communicator;
using collectives::OpKind;
using collectives::RegionTable;
using testing::desc;
using testing::Group;
using testing::runRanks;
using transport::shm::SharedRegion;

// Every size takes the registered path, even one element (no one-shot).
testing::GroupOptions noOneShot() {
  collectives::CollectiveConfig c;
  c.allreduceOneShotMax = 0;
  return testing::withConfig(testing::slots(4096), c);
}

// A region of `count` floats registered on every rank; its id, or 0.
uint64_t registerFloats(Communicator& c, size_t count, std::shared_ptr<SharedRegion>* out) {
  *out = SharedRegion::create(count * sizeof(float), "test");
  return collectives::registerBuffer(c, desc(OpKind::kRegister, count * sizeof(float),
                                             DataType::kUInt8),
                                     *out);
}

float input(int rank, size_t i) { return static_cast<float>(static_cast<int>((rank + i) % 7) - 3); }

class Registered : public ::testing::TestWithParam<int> {};

TEST_P(Registered, AllreduceMatchesClosedFormsInPlaceInThePeersBuffers) {
  const int n = GetParam();
  Group g(n, noOneShot());
  for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{100003}}) {
    runRanks(n, [&](int r) {
      Communicator& c = *g.comms[r];
      std::shared_ptr<SharedRegion> region;
      const uint64_t id = registerFloats(c, count + 3, &region);
      ASSERT_GT(id, 0u);
      // at an offset of 3 elements inside the region: offsets travel in the header
      float* buf = static_cast<float*>(region->data()) + 3;
      EXPECT_EQ(c.plan(OpKind::kAllreduce, count * sizeof(float), true), Algo::kRegistered);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        for (size_t i = 0; i < count; ++i) buf[i] = input(r, i);
        collectives::allreduce(c, desc(OpKind::kAllreduce, count, DataType::kFloat32, 0, op), buf,
                               buf);
        for (size_t i = 0; i < count; ++i) {
          float sum = 0, most = input(0, i);
          for (int q = 0; q < n; ++q) {
            sum += input(q, i);
            most = std::max(most, input(q, i));
          }
          const float want = op == ReduceOp::kSum ? sum : op == ReduceOp::kMax ? most : sum / n;
          ASSERT_EQ(buf[i], want) << "rank " << r << " count " << count << " element " << i;
        }
      }
      c.regions()->release(id);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, Registered, ::testing::Values(1, 2, 3, 4));

TEST(RegisteredErrors, RegisteredAgainstPlainFailsEveryRankAndTheGroupRecovers) {
  Group g(3, noOneShot());
  std::vector<std::string> errors(3);
  runRanks(3, [&](int r) {
    Communicator& c = *g.comms[r];
    std::shared_ptr<SharedRegion> region;
    ASSERT_GT(registerFloats(c, 64, &region), 0u);
    std::vector<float> plain(64, 1.f);
    float* buf = r == 1 ? plain.data() : static_cast<float*>(region->data());
    try {
      collectives::allreduce(c, desc(OpKind::kAllreduce, 64), buf, buf);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    std::vector<float> ok(4, 1.f);
    collectives::allreduce(c, desc(OpKind::kAllreduce, 4), ok.data(), ok.data());
    EXPECT_EQ(ok[0], 3.f);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("braid allreduce (rank " + std::to_string(r) + ")"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find(r == 1 ? "registered-buffer path, this rank the"
                                    : "path, this rank the registered-buffer path"),
              std::string::npos)
        << errors[r];
  }
}

TEST(RegisteredErrors, BuffersOfDifferentRegistrationsFailEveryRank) {
  Group g(2, noOneShot());
  std::vector<std::string> errors(2);
  runRanks(2, [&](int r) {
    Communicator& c = *g.comms[r];
    std::shared_ptr<SharedRegion> a, b;
    const uint64_t ida = registerFloats(c, 32, &a);
    const uint64_t idb = registerFloats(c, 32, &b);
    ASSERT_NE(ida, idb);
    float* buf = static_cast<float*>((r == 0 ? a : b)->data());
    try {
      collectives::allreduce(c, desc(OpKind::kAllreduce, 32), buf, buf);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("different registered regions"), std::string::npos) << e;
  }
}

TEST(RegisteredErrors, SizesMustAgree) {
  Group g(2, noOneShot());
  std::vector<std::string> errors(2);
  runRanks(2, [&](int r) {
    std::shared_ptr<SharedRegion> region;
    try {
      registerFloats(*g.comms[r], 10 + r, &region);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("register_buffer"), std::string::npos) << e;
    EXPECT_NE(e.find("shape"), std::string::npos) << e;
  }
}

TEST(RegisteredRelease, AReleasedRegionIsOrdinaryMemoryAgain) {
  Group g(2, noOneShot());
  runRanks(2, [&](int r) {
    Communicator& c = *g.comms[r];
    std::shared_ptr<SharedRegion> region;
    const uint64_t id = registerFloats(c, 16, &region);
    RegionTable::Ref ref;
    ASSERT_TRUE(c.regions()->find(region->data(), 16 * sizeof(float), &ref));
    EXPECT_EQ(ref.id, id);
    EXPECT_FALSE(c.regions()->find(region->data(), 17 * sizeof(float), &ref));
    c.regions()->release(id);
    EXPECT_FALSE(c.regions()->find(region->data(), 16 * sizeof(float), &ref));
    EXPECT_TRUE(c.regions()->get(id).empty());
    // The memory stays usable, and its allreduce takes the ordinary path.
    auto* buf = static_cast<float*>(region->data());
    for (int i = 0; i < 16; ++i) buf[i] = static_cast<float>(r + 1);
    collectives::allreduce(c, desc(OpKind::kAllreduce, 16), buf, buf);
    EXPECT_EQ(buf[15], 3.f);
  });
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// Note [Adopting a repeated buffer]: offersBuffer is ANDed over the ranks'
// headers, not compared, on every path an allreduce takes (one-shot, slots).
TEST(AdoptionOffer, EveryRankLearnsWhetherAllOffered) {
  for (int n : {1, 2, 3, 5}) {
    Group g(n, testing::slots(4096));
    for (size_t count : {size_t{1}, size_t{3000}}) {  // one-shot, then through the slots
      for (int refuser : {-1, 0, n - 1}) {
        runRanks(n, [&](int r) {
          Communicator& c = *g.comms[r];
          std::vector<float> buf(count, static_cast<float>(r + 1));
          auto d = desc(OpKind::kAllreduce, count);
          d.offersBuffer = r != refuser;
          EXPECT_FALSE(c.everyRankOffered());
          collectives::allreduce(c, d, buf.data(), buf.data());
          EXPECT_EQ(c.everyRankOffered(), refuser < 0)
              << "n=" << n << " count=" << count << " refuser=" << refuser << " rank=" << r;
          EXPECT_EQ(buf[count - 1], n * (n + 1) / 2.f);  // the op itself is unchanged
          // the next op starts over
          collectives::barrier(c, desc(OpKind::kBarrier, 0));
          EXPECT_FALSE(c.everyRankOffered());
        });
      }
    }
  }
}

}  // namespace
}  // namespace braid
