// Collectives over the message transport (collectives/net), threads as ranks
// over loopback TCP (and over shared-memory messages), results checked
// against closed forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <numeric>
#include <thread>

#include "collectives/net/collectives.h"
#include "core_group.h"
#include "math/half.h"
#include "math/reduce.h"
#include "reduce_values.h"
#include "tcp_group.h"
#include "timing.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

namespace braid {
namespace {

using collectives::OpDesc;
using collectives::OpKind;
using collectives::net::NetComm;
using collectives::net::NetConfig;
using testing::desc;
using testing::runRanks;
using namespace testing;  // reduce_values.h
namespace net = collectives::net;

constexpr uint64_t kAlwaysRing = 0;
constexpr uint64_t kNeverRing = ~uint64_t(0);

// A group of NetComms over loopback TCP (or, with shm, over the shared-memory
// message transport); cfg(rank) gives each rank's settings.
struct NetGroup {
  std::vector<std::unique_ptr<transport::Transport>> ts;
  std::vector<std::unique_ptr<NetComm>> comms;
  NetGroup(int n, const std::function<NetConfig(int)>& cfg, bool shm = false) {
    if (shm) {
      MemoryStore store;
      ts.resize(n);
      runRanks(n, [&](int r) { ts[r] = transport::shm::connect(store, r, n, {}); });
    } else {
      auto o = testing::tcpOptions("net", 1);
      ts = testing::connectGroup(n, [o](int) { return o; });
    }
    for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<NetComm>(*ts[r], cfg(r)));
  }
  NetGroup(int n, uint64_t ringMin, bool shm = false)
      : NetGroup(
            n,
            [ringMin](int) {
              NetConfig c;
              c.allreduceRingMin = ringMin;
              return c;
            },
            shm) {}
  ~NetGroup() {
    comms.clear();
    for (auto& t : ts) t->close();
  }
};

// Every reducing op, dtype and reduce op at `count`, and the data movers.
// An alltoall in which rank `from` sends bytes(from, to) bytes to rank `to`,
// each block patterned by its pair: every block arrives whole, and nothing
// is written past it.
void checkAlltoall(NetComm& c, const std::function<uint64_t(int, int)>& bytes) {
  const int n = c.size(), r = c.rank();
  std::vector<uint64_t> sendB(n), recvB(n);
  std::vector<std::vector<uint8_t>> ins(n), outs(n);
  std::vector<const void*> inPtrs(n);
  std::vector<void*> outPtrs(n);
  for (int j = 0; j < n; ++j) {
    sendB[j] = bytes(r, j);
    recvB[j] = bytes(j, r);
    ins[j] = testing::patterned(r, j, 0, sendB[j]);
    outs[j].assign(recvB[j] + 1, 0xee);
    inPtrs[j] = ins[j].data();
    outPtrs[j] = outs[j].data();
  }
  OpDesc a = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
  a.sendBytes = sendB.data();
  a.recvBytes = recvB.data();
  net::alltoall(c, a, inPtrs.data(), outPtrs.data());
  for (int j = 0; j < n; ++j) {
    auto want = testing::patterned(j, r, 0, recvB[j]);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), outs[j].begin())) << "alltoall from " << j;
    EXPECT_EQ(outs[j][recvB[j]], 0xee) << "alltoall from " << j << " wrote past its block";
  }
}

void checkAll(NetGroup& g, int n, size_t count) {
  runRanks(n, [&](int r) {
    NetComm& c = *g.comms[r];
    for (DataType t : kTypes) {
      const size_t es = elementSize(t);
      for (ReduceOp op : opsFor(t)) {
        std::string what = strCat(toString(t), " ", toString(op), " n=", n, " count=", count);
        auto in = filled(t, op, r, count);
        std::vector<uint8_t> out(in.size(), 0xee);
        net::allreduce(c, desc(OpKind::kAllreduce, count, t, 0, op), in.data(), out.data());
        EXPECT_EQ(badReduced(t, op, n, out.data(), count), 0u) << "allreduce " << what;
        net::allreduce(c, desc(OpKind::kAllreduce, count, t, 0, op), in.data(), in.data());
        EXPECT_EQ(badReduced(t, op, n, in.data(), count), 0u) << "allreduce in place " << what;
        // reduce to the last rank
        in = filled(t, op, r, count);
        std::fill(out.begin(), out.end(), 0xee);
        net::reduce(c, desc(OpKind::kReduce, count, t, n - 1, op), in.data(), out.data());
        if (r == n - 1) {
          EXPECT_EQ(badReduced(t, op, n, out.data(), count), 0u) << "reduce " << what;
        }
        // reduce_scatter: section q of every rank holds input(op, r, q * count + i)
        std::vector<std::vector<uint8_t>> secs(n);
        std::vector<const void*> secPtrs(n);
        for (int q = 0; q < n; ++q) {
          secs[q].resize(count * es + 1);
          for (size_t i = 0; i < count; ++i)
            set(t, secs[q].data(), i, static_cast<double>(input(op, r, q * count + i)));
          secPtrs[q] = secs[q].data();
        }
        std::fill(out.begin(), out.end(), 0xee);
        net::reduceScatter(c, desc(OpKind::kReduceScatter, count, t, 0, op), secPtrs.data(),
                           out.data());
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i)
          bad += !close(t, get(t, out.data(), i), expected(op, t, n, r * count + i));
        EXPECT_EQ(bad, 0u) << "reduce_scatter " << what;
      }
      // broadcast from each root, allgather, gather and scatter
      const ReduceOp s = ReduceOp::kSum;
      for (int root = 0; root < n; ++root) {
        auto buf = filled(t, s, r, count);
        net::broadcast(c, desc(OpKind::kBroadcast, count, t, root), buf.data());
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i) bad += get(t, buf.data(), i) != input(s, root, i);
        EXPECT_EQ(bad, 0u) << "broadcast root " << root << " " << toString(t) << " count " << count;
      }
      auto in = filled(t, s, r, count);
      std::vector<std::vector<uint8_t>> outs(n, std::vector<uint8_t>(count * es + 1, 0xee));
      std::vector<void*> outPtrs(n);
      for (int q = 0; q < n; ++q) outPtrs[q] = outs[q].data();
      net::allgather(c, desc(OpKind::kAllgather, count, t), in.data(), outPtrs.data());
      size_t bad = 0;
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) bad += get(t, outs[q].data(), i) != input(s, q, i);
      EXPECT_EQ(bad, 0u) << "allgather " << toString(t) << " count " << count;
      for (auto& o : outs) std::fill(o.begin(), o.end(), 0xee);
      net::gather(c, desc(OpKind::kGather, count, t, n / 2), in.data(), outPtrs.data());
      if (r == n / 2) {
        bad = 0;
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) bad += get(t, outs[q].data(), i) != input(s, q, i);
        EXPECT_EQ(bad, 0u) << "gather " << toString(t) << " count " << count;
      }
      // scatter from rank n/2: section q holds input(q)
      std::vector<std::vector<uint8_t>> secs(n);
      std::vector<const void*> secPtrs(n);
      for (int q = 0; q < n; ++q) {
        secs[q] = filled(t, s, q, count);
        secPtrs[q] = secs[q].data();
      }
      std::vector<uint8_t> got(count * es + 1, 0xee);
      net::scatter(c, desc(OpKind::kScatter, count, t, n / 2), secPtrs.data(), got.data());
      bad = 0;
      for (size_t i = 0; i < count; ++i) bad += get(t, got.data(), i) != input(s, r, i);
      EXPECT_EQ(bad, 0u) << "scatter " << toString(t) << " count " << count;
    }
    // alltoall with uneven sizes: rank r sends (r + j + count) % 5 + count bytes to j
    checkAlltoall(c, [count](int from, int to) { return (from + to + count) % 5 + count; });
    net::barrier(c, desc(OpKind::kBarrier, 0));
  });
}

class Worlds : public ::testing::TestWithParam<int> {};

TEST_P(Worlds, RingEveryOpDtypeAndCount) {
  const int n = GetParam();
  NetGroup g(n, kAlwaysRing);
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1023)}) checkAll(g, n, count);
  EXPECT_EQ(g.comms[0]->opCount(), g.comms[n - 1]->opCount());
}

TEST_P(Worlds, DirectEveryOpDtypeAndCount) {
  const int n = GetParam();
  NetGroup g(n, kNeverRing);
  // Note [Eager data]: 64 elements are the inline area exactly for 4-byte
  // dtypes and twice it for 8-byte ones (a step-1 message).
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(64), size_t(1023)}) {
    checkAll(g, n, count);
  }
}

// The same algorithms over the shared-memory message transport: the
// collectives of collectives/net depend on the Transport contract only.
TEST_P(Worlds, EveryOpOverSharedMemoryMessages) {
  const int n = GetParam();
  for (uint64_t ringMin : {kAlwaysRing, kNeverRing}) {
    NetGroup g(n, ringMin, /*shm=*/true);
    for (size_t count : {size_t(0), size_t(1), size_t(1023)}) checkAll(g, n, count);
  }
}

// Note [Eager data]: blocks of up to NetComm::kEagerMax go with the headers,
// larger ones after the check, and an alltoall mixes both (and empty blocks)
// across its pairs; over TCP and shared-memory messages.
TEST_P(Worlds, EagerBlocksAndLaterOnes) {
  const int n = GetParam();
  const uint64_t sizes[] = {NetComm::kEagerMax, NetComm::kEagerMax + 1, 3, 0};
  auto bytes = [&](int from, int to) { return sizes[(from + 2 * to) % 4]; };
  for (bool shm : {false, true}) {
    NetGroup g(n, NetConfig{}.allreduceRingMin, shm);
    runRanks(n, [&](int r) {
      NetComm& c = *g.comms[r];
      SCOPED_TRACE(shm ? "over shm messages" : "over TCP");
      checkAlltoall(c, bytes);
      for (uint64_t b : {NetComm::kEagerMax, NetComm::kEagerMax + 1}) {
        const int root = n - 1;
        std::vector<std::vector<uint8_t>> blocks(n);
        std::vector<const void*> blockPtrs(n);
        std::vector<void*> rows(n);
        for (int q = 0; q < n; ++q) {
          blocks[q] = r == root ? testing::patterned(root, q, 0, b) : std::vector<uint8_t>(b, 0);
          blockPtrs[q] = rows[q] = blocks[q].data();
        }
        std::vector<uint8_t> got(b, 0xee);
        net::scatter(c, desc(OpKind::kScatter, b, DataType::kUInt8, root), blockPtrs.data(),
                     got.data());
        EXPECT_EQ(got, testing::patterned(root, r, 0, b)) << "scatter of " << b << " shm " << shm;
        auto mine = testing::patterned(r, root, 1, b);
        for (auto& blk : blocks) std::fill(blk.begin(), blk.end(), 0xee);
        net::gather(c, desc(OpKind::kGather, b, DataType::kUInt8, root), mine.data(), rows.data());
        if (r == root) {
          for (int q = 0; q < n; ++q) {
            EXPECT_EQ(blocks[q], testing::patterned(q, root, 1, b)) << "gather of " << b << " from " << q;
          }
        }
      }
      net::barrier(c, desc(OpKind::kBarrier, 0));
      if (!shm) {
        EXPECT_EQ(static_cast<transport::tcp::TcpTransport&>(c.transport()).unexpectedBytes(), 0u);
      }
    });
  }
}

// Note [Broadcast across hosts]: from a few segments, 3 ranks and more pass
// the buffer along a chain, segment by segment (the last one short here),
// from any root.
TEST_P(Worlds, LargeBroadcastAlongAChain) {
  const int n = GetParam();
  const size_t count = (1 << 20) + 5;  // 4 MiB + 20 B of float32
  EXPECT_EQ(net::chainBroadcast(n, count * 4), n >= 3);
  EXPECT_FALSE(net::chainBroadcast(n, 1 << 20));  // one segment: the tree
  NetGroup g(n, NetConfig{}.allreduceRingMin);
  runRanks(n, [&](int r) {
    for (int root : {0, n - 1}) {
      auto buf = r == root ? filled(DataType::kFloat32, ReduceOp::kSum, root, count)
                           : std::vector<uint8_t>(count * 4, 0xee);
      net::broadcast(*g.comms[r], desc(OpKind::kBroadcast, count, DataType::kFloat32, root),
                     buf.data());
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        bad += get(DataType::kFloat32, buf.data(), i) != input(ReduceOp::kSum, root, i);
      }
      EXPECT_EQ(bad, 0u) << "root " << root << ", rank " << r;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Net, Worlds, ::testing::Values(1, 2, 3, 4, 5));

// ~1M elements (4 MiB of fp32, 2 MiB of bf16) through the ring and the default
// threshold; PREMUL_SUM as the backend passes it (input scaled, then SUM).
// Many segments per block: the ring (3 ranks) and the two-rank exchange
// (Note [Two-rank allreduce]), whose last segment is short.
class NetLarge : public ::testing::TestWithParam<int> {};

TEST_P(NetLarge, AllreduceReduceScatterAllgatherMiB) {
  const int n = GetParam();
  const size_t count = (1 << 20) + 3;
  NetGroup g(n, NetConfig{}.allreduceRingMin);
  runRanks(n, [&](int r) {
    NetComm& c = *g.comms[r];
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto in = filled(t, op, r, count);
        std::vector<uint8_t> out(in.size());
        net::allreduce(c, desc(OpKind::kAllreduce, count, t, 0, op), in.data(), out.data());
        EXPECT_EQ(badReduced(t, op, n, out.data(), count), 0u) << toString(t) << " " << toString(op);
      }
    }
    // PREMUL_SUM by 0.5: the caller scales, the op runs as SUM.
    auto in = filled(DataType::kFloat32, ReduceOp::kSum, r, count);
    reduce::scale(DataType::kFloat32, in.data(), in.data(), 0.5, count);
    net::allreduce(c, desc(OpKind::kAllreduce, count), in.data(), in.data());
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i)
      bad += get(DataType::kFloat32, in.data(), i) != 0.5 * expected(ReduceOp::kSum, DataType::kFloat32, n, i);
    EXPECT_EQ(bad, 0u) << "premul_sum";
    auto mine = filled(DataType::kFloat32, ReduceOp::kSum, r, count);
    std::vector<std::vector<float>> outs(n, std::vector<float>(count));
    std::vector<void*> outPtrs(n);
    for (int q = 0; q < n; ++q) outPtrs[q] = outs[q].data();
    net::allgather(c, desc(OpKind::kAllgather, count), mine.data(), outPtrs.data());
    bad = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; i += 97) bad += outs[q][i] != input(ReduceOp::kSum, q, i);
    EXPECT_EQ(bad, 0u) << "allgather";
  });
}

INSTANTIATE_TEST_SUITE_P(Net, NetLarge, ::testing::Values(2, 3));

// Note [Collectives over messages]: a ring that rounded to bf16 at every hop
// would lose 2^-8 + 2^-8 against 1 in some blocks (1 + 2^-8 ties to 1);
// partials travel as float32, so every element is 1 + 2^-7.
TEST(NetPrecision, Bf16RingRoundsOnce) {
  const int n = 3;
  const size_t count = 9;
  NetGroup g(n, kAlwaysRing);
  runRanks(n, [&](int r) {
    std::vector<uint16_t> buf(count, reduce::floatToBf16(r == 0 ? 1.0f : 0x1p-8f));
    net::allreduce(*g.comms[r], desc(OpKind::kAllreduce, count, DataType::kBFloat16), buf.data(),
                   buf.data());
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(reduce::bf16ToFloat(buf[i]), 1.0f + 0x1p-7f) << i;
  });
}

TEST(NetConfigTest, ReadFromTheEnvironmentAndChecked) {
  ::setenv("BRAID_NET_ALLREDUCE_RING_MIN", "4096", 1);
  EXPECT_EQ(NetConfig::fromEnv(0).allreduceRingMin, 4096u);
  ::setenv("BRAID_NET_ALLREDUCE_RING_MIN", "-1", 1);
  try {
    NetConfig::fromEnv(3);
    ADD_FAILURE() << "a negative threshold was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("init (rank 3): BRAID_NET_ALLREDUCE_RING_MIN must be >= 0, got -1"),
              std::string::npos) << e.what();
  }
  ::unsetenv("BRAID_NET_ALLREDUCE_RING_MIN");
  EXPECT_EQ(NetConfig::fromEnv(0).allreduceRingMin, NetConfig{}.allreduceRingMin);
}

// ---- errors ------------------------------------------------------------------

// Rank 1 passes `bad` instead of `good`: every rank throws a message with all
// the `needles`, and the group then runs an allreduce correctly.
void expectMismatch(int n, const OpDesc& good, const OpDesc& bad,
                    std::vector<std::string> needles, const std::function<NetConfig(int)>& cfg = {}) {
  NetGroup g(n, cfg ? cfg : [](int) { return NetConfig{}; });
  runRanks(n, [&](int r) {
    NetComm& c = *g.comms[r];
    OpDesc d = r == 1 ? bad : good;
    d.deadline = testing::after(10000);
    // The whole op's bytes: a direct allreduce sends its input eagerly,
    // before the check that fails it (Note [Eager data]).
    std::vector<uint8_t> buf(std::max<size_t>(64 * 8 + 64, d.bytes()), 1);
    // A gather's or scatter's blocks, one per rank.
    std::vector<uint8_t> blocks(n * d.bytes(), 2);
    std::vector<void*> outs(n);
    for (int q = 0; q < n; ++q) outs[q] = blocks.data() + q * d.bytes();
    try {
      if (!d.localError.empty()) {
        net::failOp(c, d);
      } else if (d.kind == OpKind::kGather) {
        net::gather(c, d, buf.data(), outs.data());
      } else if (d.kind == OpKind::kScatter) {
        std::vector<const void*> ins(outs.begin(), outs.end());
        net::scatter(c, d, ins.data(), buf.data());
      } else if (d.kind == OpKind::kAllreduce) {
        net::allreduce(c, d, buf.data(), buf.data());
      } else if (d.kind == OpKind::kBroadcast) {
        net::broadcast(c, d, buf.data());
      } else if (d.kind == OpKind::kReduce) {
        net::reduce(c, d, buf.data(), buf.data());
      } else {
        FAIL() << "test: kind";
      }
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const Error& e) {
      for (const auto& s : needles) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << "rank " << r << ": " << e.what() << " lacks " << s;
    }
    // The group still works: a gather, which no setting shapes (the settings
    // cases keep their differing settings, which fail every op they shape).
    std::vector<float> v(10, static_cast<float>(r + 1)), all(10 * n, 0.0f);
    std::vector<void*> rows(n);
    for (int q = 0; q < n; ++q) rows[q] = all.data() + 10 * q;
    net::gather(c, desc(OpKind::kGather, 10, DataType::kFloat32, n - 1), v.data(), rows.data());
    if (r == n - 1) {
      for (int q = 0; q < n; ++q) EXPECT_EQ(all[10 * q + 9], static_cast<float>(q + 1));
    }
    if (!cfg) {
      net::broadcast(c, desc(OpKind::kBroadcast, 10, DataType::kFloat32, n - 1), v.data());
      for (float x : v) EXPECT_EQ(x, static_cast<float>(n));
      net::allreduce(c, desc(OpKind::kAllreduce, 10), v.data(), v.data());
      for (float x : v) EXPECT_EQ(x, static_cast<float>(n * n));
    }
    // Every eager block the failed op sent was taken (Note [Eager data]): it
    // came before the later ops' messages, so it would be buffered by now.
    EXPECT_EQ(static_cast<transport::tcp::TcpTransport&>(c.transport()).unexpectedBytes(), 0u)
        << "rank " << r;
  });
}

TEST(NetErrors, HeaderMismatchesFailEveryRankAndKeepTheGroup) {
  auto d = [](OpKind k, size_t count, DataType t = DataType::kFloat32, int root = 0,
              ReduceOp op = ReduceOp::kSum) { return desc(k, count, t, root, op); };
  expectMismatch(3, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 9), {"shape [8]", "[9]"});
  // Note [Eager data]: one side sends no data, the other does; or a ring vs a direct op
  expectMismatch(3, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 0), {"shape [8]", "[0]"});
  expectMismatch(3, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 1 << 20), {"[1048576]"});
  // data inside the header message against data in a message of its own
  expectMismatch(3, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 1000), {"shape [8]", "[1000]"});
  expectMismatch(3, d(OpKind::kReduce, 8), d(OpKind::kReduce, 1000), {"shape [8]", "[1000]"});
  expectMismatch(3, d(OpKind::kBroadcast, 8), d(OpKind::kBroadcast, 1000), {"shape [8]", "[1000]"});
  // Note [Eager data]: a gather's blocks go to the root, a scatter's root's
  // blocks to each rank, with the headers: inline, on step 1, or after the check
  expectMismatch(3, d(OpKind::kGather, 8), d(OpKind::kGather, 1000), {"shape [8]", "[1000]"});
  expectMismatch(3, d(OpKind::kGather, 1000), d(OpKind::kGather, 1001), {"[1000]", "[1001]"});
  expectMismatch(3, d(OpKind::kGather, 1000), d(OpKind::kGather, 20000), {"[1000]", "[20000]"});
  expectMismatch(4, d(OpKind::kGather, 1000, DataType::kFloat32, 0),
                 d(OpKind::kGather, 1000, DataType::kFloat32, 2), {"root 0", "root 2"});
  expectMismatch(3, d(OpKind::kScatter, 8), d(OpKind::kScatter, 1000), {"shape [8]", "[1000]"});
  expectMismatch(3, d(OpKind::kScatter, 1000), d(OpKind::kScatter, 20000), {"[1000]", "[20000]"});
  expectMismatch(4, d(OpKind::kScatter, 1000, DataType::kFloat32, 0),
                 d(OpKind::kScatter, 1000, DataType::kFloat32, 1), {"root 0", "root 1"});
  expectMismatch(4, d(OpKind::kScatter, 1000, DataType::kFloat32, 3),
                 d(OpKind::kScatter, 1000, DataType::kFloat32, 1), {"root 3", "root 1"});
  expectMismatch(3, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 8, DataType::kInt32),
                 {"float32", "int32"});
  expectMismatch(3, d(OpKind::kAllreduce, 8), d(OpKind::kBroadcast, 8), {"allreduce", "broadcast"});
  expectMismatch(3, d(OpKind::kBroadcast, 8, DataType::kFloat32, 0),
                 d(OpKind::kBroadcast, 8, DataType::kFloat32, 2), {"root 0", "root 2"});
  expectMismatch(4, d(OpKind::kReduce, 8), d(OpKind::kReduce, 8, DataType::kFloat32, 0, ReduceOp::kMax),
                 {"SUM", "MAX"});
  OpDesc poison = d(OpKind::kAllreduce, 8);
  poison.localError = "braid allreduce (rank 1): the tensor is not contiguous";
  expectMismatch(3, d(OpKind::kAllreduce, 8), poison, {"not contiguous"});
  // a reduction the kernels cannot run fails in the header exchange
  expectMismatch(3, d(OpKind::kAllreduce, 8, DataType::kFloat32, 0, ReduceOp::kBand),
                 d(OpKind::kAllreduce, 8, DataType::kFloat32, 0, ReduceOp::kBand),
                 {"BAND is not supported for float32"});
  expectMismatch(2, d(OpKind::kReduce, 8, DataType::kFloat32, 0, ReduceOp::kPremulSum),
                 d(OpKind::kReduce, 8, DataType::kFloat32, 0, ReduceOp::kPremulSum),
                 {"PREMUL_SUM: scale the input, pass SUM"});
  // a setting that shapes the steps
  expectMismatch(2, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 8),
                 {"BRAID_NET_ALLREDUCE_RING_MIN=1024", "BRAID_NET_ALLREDUCE_RING_MIN=65536"},
                 [](int r) {
                   NetConfig c;
                   if (r == 1) c.allreduceRingMin = 1024;
                   return c;
                 });
  // the hierarchy's settings shape every op it stages, not only allreduce
  expectMismatch(2, d(OpKind::kBroadcast, 8), d(OpKind::kBroadcast, 8),
                 {"BRAID_HIER_MIN_BYTES=0", "BRAID_HIER_MIN_BYTES=65536"}, [](int r) {
                   NetConfig c;
                   c.hierMinBytes = r == 1 ? 0 : 65536;
                   return c;
                 });
  expectMismatch(2, d(OpKind::kAllreduce, 8), d(OpKind::kAllreduce, 8),
                 {"BRAID_HIER_PIPELINE_BYTES=4096", "BRAID_HIER_PIPELINE_BYTES=0"},
                 [](int r) {
                   NetConfig c;
                   if (r == 1) c.hierPieceBytes = 4096;
                   return c;
                 });
}

TEST(NetErrors, AlltoallSizesCheckedOnEveryRank) {
  const int n = 3;
  NetGroup g(n, kAlwaysRing);
  runRanks(n, [&](int r) {
    std::vector<uint64_t> sendB(n, 4), recvB(n, 4);
    if (r == 2) recvB[0] = 5;  // rank 0 sends 4 bytes, rank 2 expects 5
    std::vector<uint8_t> buf(16);
    std::vector<const void*> ins(n, buf.data());
    std::vector<uint8_t> o(16 * n);
    std::vector<void*> outs(n);
    for (int j = 0; j < n; ++j) outs[j] = o.data() + 16 * j;
    OpDesc a = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
    a.sendBytes = sendB.data();
    a.recvBytes = recvB.data();
    try {
      net::alltoall(*g.comms[r], a, ins.data(), outs.data());
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 sends 4 bytes to rank 2, which expects 5"),
                std::string::npos) << e.what();
    }
    net::barrier(*g.comms[r], desc(OpKind::kBarrier, 0));
  });
}

// Rank 2 closes its transport instead of joining the op: the others fail
// with PeerLostError naming it, well before the deadline, and later ops fail
// at once with that first error.
TEST(NetErrors, LostPeerFailsTheOthersNamingIt) {
  const int n = 3;
  NetGroup g(n, kAlwaysRing);
  const size_t count = 1 << 18;
  runRanks(n, [&](int r) {
    if (r == 2) {
      g.ts[2]->close();
      return;
    }
    std::vector<float> buf(count, 1.f);
    auto t0 = transport::Clock::now();
    try {
      net::allreduce(*g.comms[r], desc(OpKind::kAllreduce, count, DataType::kFloat32, 0,
                                       ReduceOp::kSum, std::chrono::seconds(20)),
                     buf.data(), buf.data());
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const Error& e) {
      // Rank 2 is lost, or, for the rank that hears it second, the rank that
      // aborted on seeing it.
      std::string w = e.what();
      EXPECT_NE(w.find("allreduce (rank " + std::to_string(r) + ")"), std::string::npos) << w;
      EXPECT_TRUE(w.find("rank 2") != std::string::npos || w.find("lost") != std::string::npos) << w;
    }
    // Note [Timing bounds in tests] in tests/cpp/timing.h
    EXPECT_TRUE(testing::endedEarly(transport::Clock::now() - t0, std::chrono::seconds(20)))
        << "rank " << r;
    try {
      net::barrier(*g.comms[r], desc(OpKind::kBarrier, 0));
      ADD_FAILURE() << "barrier after a lost peer did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unusable after an earlier error"), std::string::npos)
          << e.what();
    }
  });
}

// Rank 2 passes the header exchange of a 16 MiB ring allreduce, then its
// transport is aborted (as its process dies): the others, now waiting for
// ring data, fail within the deadline naming a lost peer (rank 2, or the
// survivor that aborted on seeing it).
TEST(NetErrors, PeerLostMidOp) {
  const int n = 3;
  NetGroup g(n, kAlwaysRing);
  const size_t count = 4 << 20;
  runRanks(n, [&](int r) {
    OpDesc d = desc(OpKind::kAllreduce, count, DataType::kFloat32, 0, ReduceOp::kSum,
                    std::chrono::seconds(20));
    if (r == 2) {
      g.comms[2]->begin(d, net::NetAlgo::kRing);
      g.ts[2]->abort("test: rank 2 dies");
      return;
    }
    std::vector<float> buf(count, 1.f);
    auto t0 = transport::Clock::now();
    try {
      net::allreduce(*g.comms[r], d, buf.data(), buf.data());
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const PeerLostError& e) {
      std::string w = e.what();
      EXPECT_NE(w.find("allreduce (rank " + std::to_string(r) + "): op #1 lost rank"),
                std::string::npos) << w;
    } catch (const Error& e) {
      ADD_FAILURE() << "not a PeerLostError: " << e.what();
    }
    EXPECT_TRUE(testing::endedEarly(transport::Clock::now() - t0, d.timeout)) << "rank " << r;
  });
}

// Rank 2 never arrives: the others time out at the op's deadline naming it.
TEST(NetErrors, MissingRankTimesOutNamingIt) {
  const int n = 3;
  NetGroup g(n, kAlwaysRing);
  runRanks(n, [&](int r) {
    if (r == 2) return;
    std::vector<float> buf(16, 1.f);
    try {
      net::allreduce(*g.comms[r], desc(OpKind::kAllreduce, 16, DataType::kFloat32, 0,
                                       ReduceOp::kSum, std::chrono::milliseconds(300)),
                     buf.data(), buf.data());
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const TimeoutError& e) {
      std::string w = e.what();
      EXPECT_NE(w.find("timed out after 300 ms waiting for rank 2"), std::string::npos) << w;
    } catch (const Error& e) {
      ADD_FAILURE() << "not a timeout: " << e.what();
    }
  });
}


// Note [Waiters drive the sockets]: an op that moves at least driveMinBytes
// per rank moves them on the calling thread (the transport counts the epoll
// batches handled there), with the same results; a small op, or any op with
// -1, leaves them to the progress thread.
TEST(NetDrive, LargeOpsMoveTheirBytesOnTheCallingThread) {
  for (int64_t min : {int64_t(1) << 20, int64_t(-1)}) {
    for (int n : {2, 3}) {
      NetGroup g(n, [min](int) {
        NetConfig c;
        c.driveMinBytes = min;
        return c;
      });
      auto driven = [&](int r) {
        return dynamic_cast<transport::tcp::TcpTransport&>(*g.ts[r]).drivenBatches();
      };
      const size_t small = 1000, large = (1 << 20) + 3;  // floats: 4 KB, 4 MiB + 12 B
      runRanks(n, [&](int r) {
        for (size_t count : {small, large}) {
          const uint64_t before = driven(r);
          std::vector<float> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = float(r + 1) * float(i % 97);
          net::allreduce(*g.comms[r], desc(OpKind::kAllreduce, count), buf.data(), buf.data());
          const float sum = float(n * (n + 1) / 2);
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], sum * float(i % 97)) << i;
          const bool drives = min >= 0 && count == large;
          EXPECT_EQ(driven(r) > before, drives)
              << "n " << n << " rank " << r << " count " << count << " min " << min;
        }
        std::vector<float> b(large, r == 1 ? 2.5f : 0.f);
        net::broadcast(*g.comms[r], desc(OpKind::kBroadcast, large, DataType::kFloat32, 1),
                       b.data());
        EXPECT_EQ(std::count(b.begin(), b.end(), 2.5f), static_cast<long>(large));
      });
    }
  }
}

// A driven op whose peer never comes times out at its deadline naming the
// peer, and the group then closes (the progress thread was parked).
TEST(NetDrive, ADrivenOpTimesOutNamingThePeer) {
  NetGroup g(2, kAlwaysRing);
  std::vector<float> buf(1 << 20, 1.f);
  auto t0 = transport::Clock::now();
  try {
    net::allreduce(*g.comms[0], desc(OpKind::kAllreduce, buf.size(), DataType::kFloat32, 0,
                                     ReduceOp::kSum, std::chrono::milliseconds(300)),
                   buf.data(), buf.data());
    ADD_FAILURE() << "did not throw";
  } catch (const TimeoutError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("timed out after 300 ms waiting for rank 1"), std::string::npos) << w;
  }
  EXPECT_TRUE(testing::timedOut(transport::Clock::now() - t0, std::chrono::milliseconds(300)));
}

// An abort from another thread reaches a thread that drives: its op fails at
// once with the reason, not at its deadline; so does its peer, naming it.
TEST(NetDrive, AnAbortFromAnotherThreadEndsADrivenOp) {
  const int n = 2;
  NetGroup g(n, kAlwaysRing);
  const size_t count = 16 << 20;  // 64 MiB of floats: still moving when the abort comes
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    g.ts[0]->abort("test: aborted from another thread");
  });
  runRanks(n, [&](int r) {
    std::vector<float> buf(count, 1.f);
    auto t0 = transport::Clock::now();
    try {
      net::allreduce(*g.comms[r], desc(OpKind::kAllreduce, count), buf.data(), buf.data());
      // A fast machine may finish first: then the abort fails the next op.
      net::barrier(*g.comms[r], desc(OpKind::kBarrier, 0));
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const Error& e) {
      // Rank 0 says why; rank 1 names rank 0 (with the reason, or mid-stream
      // as a broken connection).
      std::string w = e.what();
      EXPECT_TRUE(w.find(r == 0 ? "test: aborted from another thread" : "lost rank 0") !=
                      std::string::npos ||
                  w.find("unusable after an earlier error") != std::string::npos) << w;
    }
    // Not at the op's deadline (desc's default timeout).
    const auto timeout = desc(OpKind::kAllreduce, count).timeout;
    EXPECT_TRUE(testing::endedEarly(transport::Clock::now() - t0, timeout)) << "rank " << r;
  });
  killer.join();
}

}  // namespace
}  // namespace braid
