// Group topology (Note [Group topology]): every rank derives the same layout
// from the identities exchanged through the store.
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>

#include "machine_skip.h"
#include "memory_store.h"
#include "own_mount_ns.h"
#include "transport/host.h"
#include "transport/topology.h"

namespace braid {
namespace {

using transport::Topology;

TEST(Topology, OneHost) {
  Topology t(2, {"a", "a", "a"});
  EXPECT_TRUE(t.singleHost());
  EXPECT_EQ(t.numHosts(), 1);
  EXPECT_EQ(t.localRank(), 2);
  EXPECT_EQ(t.localSize(), 3);
  EXPECT_FALSE(t.isLeader());
  EXPECT_EQ(t.leaders(), std::vector<int>({0}));
  EXPECT_EQ(t.describe(), "1 host: 'a' has ranks 0,1,2");
}

TEST(Topology, InterleavedHostsAreNumberedByTheirLowestRank) {
  // Ranks 0,2,4 on "x" and 1,3 on "y": a hybrid layout no launch variable describes.
  std::vector<std::string> ids = {"x", "y", "x", "y", "x"};
  for (int r = 0; r < 5; ++r) {
    Topology t(r, ids);
    EXPECT_FALSE(t.singleHost());
    EXPECT_EQ(t.numHosts(), 2);
    EXPECT_EQ(t.host(), r % 2);
    EXPECT_EQ(t.localRank(), r / 2);
    EXPECT_EQ(t.localSize(), r % 2 ? 2 : 3);
    EXPECT_EQ(t.isLeader(), r < 2);
    EXPECT_EQ(t.ranksOn(0), std::vector<int>({0, 2, 4}));
    EXPECT_EQ(t.ranksOn(1), std::vector<int>({1, 3}));
    EXPECT_EQ(t.leaders(), std::vector<int>({0, 1}));
    EXPECT_EQ(t.identityOf(1), "y");
  }
  EXPECT_EQ(Topology(0, ids).describe(), "2 hosts: 'x' has ranks 0,2,4; 'y' has ranks 1,3");
}

TEST(Topology, OneRankPerHost) {
  Topology t(1, {"h0", "h1", "h2"});
  EXPECT_EQ(t.numHosts(), 3);
  EXPECT_EQ(t.localSize(), 1);
  EXPECT_TRUE(t.isLeader());
  EXPECT_EQ(t.leaders(), std::vector<int>({0, 1, 2}));
  EXPECT_EQ(t.describe(), "3 hosts: 'h0' has rank 0; 'h1' has rank 1; 'h2' has rank 2");
}

TEST(Topology, BadArgumentsNameTheValues) {
  EXPECT_THROW(Topology(0, {}), Error);
  try {
    Topology(3, {"a", "b"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 is outside the group of 2 ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST(Topology, ExchangeGivesEveryRankTheSameLayout) {
  for (int n : {1, 2, 3, 4, 5}) {
    testing::MemoryStore store;
    std::vector<std::string> described(n);
    std::vector<int> local(n);
    testing::runRanks(n, [&](int r) {
      std::string id = r < (n + 1) / 2 ? "left" : "right";
      Topology t = transport::exchangeTopology(store, r, n, id, std::chrono::seconds(10));
      described[r] = t.describe();
      local[r] = t.localRank();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(described[r], described[0]) << "n=" << n << " rank " << r;
      EXPECT_EQ(local[r], r < (n + 1) / 2 ? r : r - (n + 1) / 2) << "n=" << n;
    }
  }
}

TEST(Topology, ExchangeTimeoutNamesTheRanksThatNeverJoined) {
  testing::MemoryStore store;
  store.set("host/1", {'a'});  // rank 1 joined; ranks 2 and 3 never do
  try {
    transport::exchangeTopology(store, 0, 4, "a", std::chrono::milliseconds(50));
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("braid init (rank 0)"), std::string::npos) << what;
    EXPECT_NE(what.find("Timed out after 50 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("ranks 2,3 "), std::string::npos) << what;
  }
}

// The identity a child process reports after entering a mount namespace of
// its own, with a fresh /dev/shm when `ownShm`; "" when it may not (no root).
std::string identityInOwnMountNamespace(bool ownShm) {
  auto run = testing::inOwnMountNamespace(ownShm ? "1m" : nullptr, [] {
    std::fputs(transport::hostIdentity().c_str(), stdout);
  });
  return run ? run->out : "";
}

// Segments live in /dev/shm: processes that each mount their own cannot open
// each other's, so they must count as two hosts (transport/host.cc).
TEST(HostIdentity, AnOwnDevShmMakesAnotherHost) {
  ::unsetenv("BRAID_HOST_ID_OVERRIDE");
  const std::string mine = transport::hostIdentity();
  const std::string same = identityInOwnMountNamespace(false);
  if (same.empty()) BRAID_MACHINE_SKIP("cannot enter a mount namespace here (needs root)");
  EXPECT_EQ(same, mine) << "the same /dev/shm seen from another mount namespace";
  const std::string own = identityInOwnMountNamespace(true);
  ASSERT_FALSE(own.empty());
  EXPECT_NE(own, mine);
  const size_t cut = mine.find("/shm:");
  ASSERT_NE(cut, std::string::npos) << mine;
  EXPECT_EQ(own.substr(0, cut), mine.substr(0, cut)) << "hostname, boot id and pid namespace";
}

}  // namespace
}  // namespace braid
