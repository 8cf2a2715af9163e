// Groups across hosts (collectives/hier, Note [Collectives across hosts]),
// threads as ranks: each rank claims a host identity, so the ranks of one
// "host" share memory and the hosts talk over loopback TCP. Results are
// checked against closed forms (reduce_values.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include "collectives/hier/hier_group.h"
#include "collectives/make_group.h"
#include "core_group.h"
#include "reduce_values.h"
#include "tcp_group.h"
#include "timing.h"

namespace braid {
namespace {

using collectives::Group;
using collectives::HierGroup;
using collectives::OpDesc;
using collectives::OpKind;
using namespace testing;

// Rank r runs on host hostOf[r] ("h<k>/boot/ns", as transport::hostIdentity).
struct HierFixture {
  MemoryStore store;
  std::vector<std::unique_ptr<Group>> groups;
  explicit HierFixture(const std::vector<int>& hostOf) {
    const int n = static_cast<int>(hostOf.size());
    std::vector<std::string> ids;
    for (int h : hostOf) ids.push_back(strCat("h", h, "/boot/ns"));
    groups.resize(n);
    collectives::HierOptions o;
    o.groupId = strCat("hier-test/", serial()++);
    o.timeout = std::chrono::seconds(20);
    runRanks(n, [&](int r) {
      groups[r] = std::make_unique<HierGroup>(store, transport::Topology(r, ids), o);
    });
  }
  ~HierFixture() {
    for (auto& g : groups) g->close();
  }
  static std::atomic<int>& serial() {
    static std::atomic<int> s{0};
    return s;
  }
};

// Sets an environment variable for one test's lifetime.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

std::string layout(const std::vector<int>& hostOf) {
  std::string s;
  for (int h : hostOf) s += std::to_string(h);
  return s;
}

// Every dtype and reduce op at `count`, out of place and in place.
void checkAllreduce(const std::vector<int>& hostOf, const std::vector<size_t>& counts) {
  HierFixture f(hostOf);
  const int n = static_cast<int>(hostOf.size());
  runRanks(n, [&](int r) {
    Group& g = *f.groups[r];
    for (size_t count : counts) {
      for (DataType t : kTypes) {
        for (ReduceOp op : opsFor(t)) {
          std::string what = strCat(toString(t), " ", toString(op), " hosts ", layout(hostOf),
                                    " count ", count, " rank ", r);
          auto in = filled(t, op, r, count);
          const auto given = in;
          std::vector<uint8_t> out(in.size(), 0xee);
          g.allreduce(desc(OpKind::kAllreduce, count, t, 0, op), in.data(), out.data());
          EXPECT_EQ(badReduced(t, op, n, out.data(), count), 0u) << what;
          EXPECT_EQ(out.back(), 0xee) << "wrote past the end: " << what;
          // Note [The host's sum in place]: out of place, only `out` is written.
          EXPECT_TRUE(in == given) << "changed the input: " << what;
          g.allreduce(desc(OpKind::kAllreduce, count, t, 0, op), in.data(), in.data());
          EXPECT_EQ(badReduced(t, op, n, in.data(), count), 0u) << "in place " << what;
        }
      }
    }
  });
}

// Counts around the sections' edges: 0, 1, fewer than the local ranks, odd,
// and large enough for the staged path at the default threshold.
const std::vector<size_t> kCounts = {0, 1, 2, 1001, 100003};

TEST(Hier, AllreduceTwoHostsTwoRanksEach) { checkAllreduce({0, 0, 1, 1}, kCounts); }
TEST(Hier, AllreduceInterleavedRanks) { checkAllreduce({0, 1, 0, 1}, kCounts); }
TEST(Hier, AllreduceThreeHostsOneRankEach) { checkAllreduce({0, 1, 2}, {0, 1, 1001, 100003}); }
TEST(Hier, AllreduceUnevenHosts) { checkAllreduce({0, 0, 1}, {0, 1, 1001, 100003}); }
// Below the threshold on three hosts: the host sums ride on the header
// exchange (Note [Small allreduce across hosts]).
TEST(Hier, AllreduceSmallThreeHostsTwoRanksEach) { checkAllreduce({0, 1, 2, 0, 1, 2}, {0, 1, 7, 1001}); }

// Every size through the staged path: sections of one element, short last
// sections and empty ones.
TEST(Hier, AllreduceStagedAtEverySize) {
  ScopedEnv env("BRAID_HIER_MIN_BYTES", "0");
  checkAllreduce({0, 0, 0, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 7, 11, 1000});
}

// Pieces of 64 bytes (Note [Pipelined stages]): many pieces, a short last
// piece, one piece that has padded sections, on 2 and 3 ranks per host.
TEST(Hier, AllreducePipelinedPieces) {
  ScopedEnv min("BRAID_HIER_MIN_BYTES", "0");
  ScopedEnv piece("BRAID_HIER_PIPELINE_BYTES", "64");
  checkAllreduce({0, 0, 1, 1}, {0, 1, 2, 5, 33, 257});
  checkAllreduce({0, 0, 0, 1, 1, 1}, {1, 7, 40, 101});
}

// Broadcast, reduce, allgather and reduce_scatter, every dtype and reduce op
// at `counts`, from a few roots, checked against closed forms. With
// BRAID_HIER_MIN_BYTES=0 every one runs in stages (Note [Staged broadcast and
// reduce], Note [Staged allgather and reduce-scatter]).
void checkOthers(const std::vector<int>& hostOf, const std::vector<size_t>& counts) {
  HierFixture f(hostOf);
  const int n = static_cast<int>(hostOf.size());
  const std::vector<int> roots = {0, n / 2, n - 1};
  runRanks(n, [&](int r) {
    Group& g = *f.groups[r];
    for (size_t count : counts) {
      for (DataType t : kTypes) {
        const size_t es = elementSize(t);
        const std::string where = strCat(toString(t), " hosts ", layout(hostOf), " count ", count,
                                         " rank ", r);
        for (int root : roots) {
          auto buf = r == root ? filled(t, ReduceOp::kSum, root, count)
                               : std::vector<uint8_t>(count * es + 1, 0xee);
          g.broadcast(desc(OpKind::kBroadcast, count, t, root), buf.data());
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) {
            bad += get(t, buf.data(), i) != input(ReduceOp::kSum, root, i);
          }
          EXPECT_EQ(bad, 0u) << "broadcast from " << root << ", " << where;
        }
        // outs[q] gets rank q's input; one byte past each block stays.
        auto in = filled(t, ReduceOp::kSum, r, count);
        std::vector<std::vector<uint8_t>> outs(n, std::vector<uint8_t>(count * es + 1, 0xee));
        std::vector<void*> ptrs(n);
        for (int q = 0; q < n; ++q) ptrs[q] = outs[q].data();
        g.allgather(desc(OpKind::kAllgather, count, t), in.data(), ptrs.data());
        for (int q = 0; q < n; ++q) {
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) bad += get(t, outs[q].data(), i) != input(ReduceOp::kSum, q, i);
          EXPECT_EQ(bad, 0u) << "allgather, block of rank " << q << ", " << where;
          EXPECT_EQ(outs[q].back(), 0xee) << "allgather wrote past block " << q << ", " << where;
        }
        for (ReduceOp op : opsFor(t)) {
          const std::string what = strCat(toString(op), " ", where);
          for (int root : roots) {
            auto mine = filled(t, op, r, count);
            std::vector<uint8_t> out(count * es + 1, 0xee);
            g.reduce(desc(OpKind::kReduce, count, t, root, op), mine.data(), out.data());
            if (r == root) {
              EXPECT_EQ(badReduced(t, op, n, out.data(), count), 0u) << "reduce to " << root << " " << what;
              EXPECT_EQ(out.back(), 0xee) << "reduce wrote past the end: " << what;
            }
          }
          // Rank q's block is elements [q * count, (q + 1) * count) of one
          // long input, so a block that lands on the wrong rank shows.
          auto all = filled(t, op, r, n * count);
          std::vector<const void*> ins(n);
          for (int q = 0; q < n; ++q) ins[q] = all.data() + q * count * es;
          std::vector<uint8_t> out(count * es + 1, 0xee);
          g.reduceScatter(desc(OpKind::kReduceScatter, count, t, 0, op), ins.data(), out.data());
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) {
            bad += !close(t, get(t, out.data(), i), expected(op, t, n, r * count + i));
          }
          EXPECT_EQ(bad, 0u) << "reduce_scatter " << what;
          EXPECT_EQ(out.back(), 0xee) << "reduce_scatter wrote past the end: " << what;
        }
      }
    }
  });
}

TEST(Hier, OtherCollectivesStagedAtEverySize) {
  ScopedEnv env("BRAID_HIER_MIN_BYTES", "0");
  checkOthers({0, 0, 1, 1}, {0, 1, 2, 7, 1000});
  checkOthers({0, 1, 0, 1}, {1, 33});
  checkOthers({0, 0, 0, 1, 1, 1}, {1, 5});
  checkOthers({0, 0, 1, 1, 2, 2}, {3, 101});
}

// Pieces of 64 bytes (Note [Pipelined stages]): many pieces, a short last
// piece, on 2 and 3 ranks per host and 3 hosts.
TEST(Hier, OtherCollectivesPipelinedPieces) {
  ScopedEnv min("BRAID_HIER_MIN_BYTES", "0");
  ScopedEnv piece("BRAID_HIER_PIPELINE_BYTES", "64");
  checkOthers({0, 0, 1, 1}, {0, 1, 33, 257});
  checkOthers({0, 0, 0, 1, 1, 1}, {7, 101});
  checkOthers({0, 1, 2, 0, 1, 2}, {40});
}

// At the default threshold: the small counts over the world group, the large
// ones in stages, several TCP ring steps and shared-memory chunks each.
TEST(Hier, OtherCollectivesEitherSideOfTheThreshold) {
  checkOthers({0, 0, 1, 1}, {1001, 70001});
}

// Note [Small broadcast across hosts]: up to 512 bytes a broadcast rides on
// the header relay (128 elements of 4 bytes exactly), above it the tree; every
// dtype, roots on every host.
TEST(Hier, SmallOpsAcrossThreeHosts) {
  checkOthers({0, 1, 2, 0, 1, 2}, {0, 1, 7, 128, 129});
}

// A rank that leaves in the middle of a pipelined allreduce (its group
// aborted from another thread, as a shutdown does, so its peers see its
// sockets close as when its host goes away) fails every rank
// by the op's deadline, and no stage touches the buffers after the op
// returns (ASan/TSan builds check that).
TEST(Hier, RankLostMidPipelineFailsEveryRank) {
  ScopedEnv piece("BRAID_HIER_PIPELINE_BYTES", "65536");
  HierFixture f({0, 0, 1, 1});
  const auto deadline = std::chrono::milliseconds(4000);
  runRanks(4, [&](int r) {
    Group& g = *f.groups[r];
    auto in = std::make_unique<std::vector<float>>(8 << 20, 1.0f);
    auto out = std::make_unique<std::vector<float>>(in->size());
    std::future<void> leave;
    if (r == 3) {
      leave = std::async(std::launch::async, [&g] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        g.abort();
      });
    }
    const auto t0 = transport::Clock::now();
    try {
      g.allreduce(desc(OpKind::kAllreduce, in->size(), DataType::kFloat32, 0, ReduceOp::kSum,
                       deadline),
                  in->data(), out->data());
      // Rank 3 may finish before it leaves on a fast machine; then nobody fails.
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    }
    in.reset();
    out.reset();
    // By the deadline (Note [Timing bounds in tests] in tests/cpp/timing.h).
    EXPECT_TRUE(testing::endedByTimeout(transport::Clock::now() - t0, deadline)) << "rank " << r;
    if (leave.valid()) leave.get();
  });
}

// A rank that leaves in the middle of a staged, pipelined broadcast, reduce,
// allgather or reduce_scatter (its group aborted from another thread) fails
// every other rank by the op's deadline (ASan/TSan builds check the threads
// and the pieces; that no TCP stage outlives its op, which CrossStages makes
// so, the pipelined allreduce's test checks by freeing the buffers). Each rank that fails marks its group broken, as the
// backend does on a lost peer or a timeout, so that host mates waiting for it
// in a shared-memory stage learn it at once (Note [A rank that gives up]);
// the leaving rank's own host mate may wait to its deadline, since a thread
// that leaves does not close its group as a process that exits does. The
// buffers outlive every rank's op: a host mate may still read a failed rank's
// input directly (Note [Direct transfers]), which between processes reads
// memory that stays mapped (or fails) and fails the op at its last step, but
// between threads reads freed memory.
TEST(Hier, RankLostMidStagedOpFailsEveryRank) {
  for (OpKind kind : {OpKind::kBroadcast, OpKind::kReduce, OpKind::kAllgather,
                      OpKind::kReduceScatter}) {
    HierFixture f({0, 0, 1, 1});
    const auto deadline = std::chrono::milliseconds(4000);
    const size_t count = 4 << 20;
    struct Buffers {
      std::vector<float> buf = std::vector<float>(count, 1.0f);
      std::vector<std::vector<float>> outs{4, std::vector<float>(count)};
    };
    std::vector<Buffers> mem(4);
    runRanks(4, [&](int r) {
      Group& g = *f.groups[r];
      std::vector<float>& buf = mem[r].buf;
      std::vector<std::vector<float>>& outs = mem[r].outs;
      std::vector<void*> ptrs = {outs[0].data(), outs[1].data(), outs[2].data(), outs[3].data()};
      std::future<void> leave;
      if (r == 3) {
        leave = std::async(std::launch::async, [&g] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          g.abort();
        });
      }
      auto t0 = transport::Clock::now();
      for (int i = 0; i < 4; ++i) {  // rank 3 leaves during one of them
        t0 = transport::Clock::now();
        try {
          OpDesc d = desc(kind, count, DataType::kFloat32, 0, ReduceOp::kSum, deadline);
          std::vector<const void*> ins(ptrs.begin(), ptrs.end());
          switch (kind) {
            case OpKind::kBroadcast: g.broadcast(d, buf.data()); break;
            case OpKind::kReduce: g.reduce(d, buf.data(), outs[0].data()); break;
            case OpKind::kAllgather: g.allgather(d, buf.data(), ptrs.data()); break;
            default: g.reduceScatter(d, ins.data(), buf.data());
          }
        } catch (const Error& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(collectives::opName(kind)), std::string::npos) << what;
          if (dynamic_cast<const PeerLostError*>(&e) || dynamic_cast<const TimeoutError*>(&e)) {
            g.markBroken(what);
          }
          break;
        }
      }
      EXPECT_TRUE(testing::endedByTimeout(transport::Clock::now() - t0, deadline))
          << collectives::opName(kind) << ", rank " << r << " (its last op)";
      if (leave.valid()) leave.get();
    });
  }
}

// The other collectives on uneven hosts (the world group) and point-to-point: one pass each.
TEST(Hier, OtherCollectivesAndPointToPoint) {
  HierFixture f({0, 0, 1, 1, 2});
  const int n = 5;
  const DataType t = DataType::kInt64;
  const size_t count = 777;
  runRanks(n, [&](int r) {
    Group& g = *f.groups[r];
    auto buf = filled(t, ReduceOp::kSum, r, count);
    g.broadcast(desc(OpKind::kBroadcast, count, t, 3), buf.data());
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += get(t, buf.data(), i) != input(ReduceOp::kSum, 3, i);
    EXPECT_EQ(bad, 0u) << "broadcast, rank " << r;

    auto in = filled(t, ReduceOp::kSum, r, count);
    std::vector<std::vector<uint8_t>> outs(n, std::vector<uint8_t>(count * 8));
    std::vector<void*> ptrs(n);
    for (int q = 0; q < n; ++q) ptrs[q] = outs[q].data();
    g.allgather(desc(OpKind::kAllgather, count, t), in.data(), ptrs.data());
    bad = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) bad += get(t, outs[q].data(), i) != input(ReduceOp::kSum, q, i);
    EXPECT_EQ(bad, 0u) << "allgather, rank " << r;

    std::vector<uint8_t> red(count * 8);
    g.reduce(desc(OpKind::kReduce, count, t, 1, ReduceOp::kMax), filled(t, ReduceOp::kMax, r, count).data(),
             red.data());
    if (r == 1) {
      EXPECT_EQ(badReduced(t, ReduceOp::kMax, n, red.data(), count), 0u);
    }
    g.barrier(desc(OpKind::kBarrier, 0));

    // A ring of sends: to the next rank (across hosts or not), from the previous.
    auto& p2p = g.p2p();
    const auto deadline = transport::Clock::now() + std::chrono::seconds(20);
    int64_t mine = 1000 + r, got = -1;
    std::promise<std::exception_ptr> sent, recvd;
    p2p.postRecv((r + n - 1) % n, 7, &got, sizeof(got), deadline, std::chrono::seconds(20),
                 [&](std::exception_ptr e, int) { recvd.set_value(e); });
    p2p.postSend((r + 1) % n, 7, &mine, sizeof(mine), deadline, std::chrono::seconds(20),
                 [&](std::exception_ptr e, int) { sent.set_value(e); });
    EXPECT_EQ(sent.get_future().get(), nullptr);
    EXPECT_EQ(recvd.get_future().get(), nullptr);
    EXPECT_EQ(got, 1000 + (r + n - 1) % n);
    EXPECT_THROW(p2p.postRecv(collectives::PointToPoint::kAnySource, 7, &got, sizeof(got),
                              deadline, std::chrono::seconds(20), {}),
                 Error);
  });
}

// Note [Point-to-point across hosts]: a receive past its deadline aborts the
// transport and fails, naming itself; posted while the watcher sleeps on a
// later deadline, it wakes the watcher (net_p2p.cc, watch()).
TEST(Hier, P2PReceivePastItsDeadlineFailsNamingIt) {
  HierFixture f({0, 1});
  std::promise<void> done;
  std::shared_future<void> over = done.get_future().share();
  runRanks(2, [&](int r) {
    auto& p2p = f.groups[r]->p2p();
    if (r == 1) {
      over.wait();
      return;
    }
    int64_t a = 0, b = 0;
    // The errors as text, taken on the completing thread: an exception object
    // shared with it is released there in an order TSan cannot see.
    auto text = [](std::exception_ptr e) -> std::string {
      if (!e) return "";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        return x.what();
      }
    };
    std::promise<std::string> late, soon;
    const auto now = transport::Clock::now();
    p2p.postRecv(1, 8, &a, sizeof(a), now + std::chrono::seconds(20), std::chrono::seconds(20),
                 [&](std::exception_ptr e, int) { late.set_value(text(e)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the watcher sleeps
    const auto posted = transport::Clock::now();
    p2p.postRecv(1, 9, &b, sizeof(b), posted + std::chrono::milliseconds(30),
                 std::chrono::milliseconds(30),
                 [&](std::exception_ptr e, int) { soon.set_value(text(e)); });
    const std::string e = soon.get_future().get();
    const auto took = transport::Clock::now() - posted;
    EXPECT_NE(e.find("timed out after 30 ms"), std::string::npos) << e;
    EXPECT_NE(e.find("tag"), std::string::npos) << e;
    // At its own deadline, not at the later one the watcher slept on (Note
    // [Timing bounds in tests] in tests/cpp/timing.h).
    EXPECT_GE(took, std::chrono::milliseconds(30));
    EXPECT_TRUE(testing::endedEarly(took, std::chrono::seconds(20)));
    EXPECT_NE(late.get_future().get(), "");  // the abort fails it too
    done.set_value();
  });
}

// A mismatch between hosts fails every rank before any data moves (the
// world's header exchange), naming both values, and the group stays usable.
TEST(Hier, MismatchAcrossHostsFailsEveryRankAndKeepsTheGroup) {
  HierFixture f({0, 0, 1, 1});
  runRanks(4, [&](int r) {
    Group& g = *f.groups[r];
    const size_t count = r >= 2 ? 200000 : 200001;  // host 1 passes another count
    std::vector<float> in(count, 1.0f), out(count);
    try {
      g.allreduce(desc(OpKind::kAllreduce, count, DataType::kFloat32), in.data(), out.data());
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("200000"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("200001"), std::string::npos) << e.what();
    }
    std::vector<float> a(300000, static_cast<float>(r + 1)), b(300000);
    g.allreduce(desc(OpKind::kAllreduce, a.size(), DataType::kFloat32), a.data(), b.data());
    EXPECT_EQ(b[0], 10.0f);
    EXPECT_EQ(b.back(), 10.0f);
  });
}

// Note [Eager data] through the hierarchy's header relay: an alltoall's and a
// scatter's blocks travel before the relayed check; when it fails, every rank
// throws, and the group goes on.
TEST(Hier, EagerBlocksOfAFailedCheckAcrossHostsKeepTheGroup) {
  HierFixture f({0, 0, 1, 1});
  runRanks(4, [&](int r) {
    Group& g = *f.groups[r];
    std::vector<uint64_t> sendB(4, 100), recvB(4, 100);
    if (r == 3) recvB[0] = 101;  // rank 0 sends 100 bytes, rank 3 expects 101
    std::vector<uint8_t> src(4 * 128, static_cast<uint8_t>(r)), dst(4 * 128);
    std::vector<const void*> ins(4);
    std::vector<void*> outs(4);
    for (int j = 0; j < 4; ++j) {
      ins[j] = src.data() + 128 * j;
      outs[j] = dst.data() + 128 * j;
    }
    OpDesc a = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
    a.sendBytes = sendB.data();
    a.recvBytes = recvB.data();
    try {
      g.alltoall(a, ins.data(), outs.data());
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 sends 100 bytes to rank 3, which expects 101"),
                std::string::npos) << e.what();
    }
    // A scatter whose ranks disagree on the count (the root's blocks go eagerly).
    std::vector<float> got(r == 2 ? 1001 : 1000);
    std::vector<std::vector<float>> blocks(4, std::vector<float>(1000, 7.0f));
    std::vector<const void*> bp(4);
    for (int q = 0; q < 4; ++q) bp[q] = blocks[q].data();
    try {
      g.scatter(desc(OpKind::kScatter, got.size(), DataType::kFloat32, 1), bp.data(), got.data());
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("1001"), std::string::npos) << e.what();
    }
    recvB[0] = 100;
    g.alltoall(a, ins.data(), outs.data());
    for (int j = 0; j < 4; ++j) EXPECT_EQ(dst[128 * j + 99], j) << "block from " << j;
  });
}

// Host mates that disagree fail every rank, on both hosts, with both values,
// before any data moves, and the group stays usable: a small allreduce (no
// host sums are made, Note [Small allreduce across hosts]), a staged one, a
// broadcast's root, and a barrier against an allreduce.
TEST(Hier, MismatchWithinAHostFailsEveryRankAndKeepsTheGroup) {
  HierFixture f({0, 0, 1, 1});
  runRanks(4, [&](int r) {
    Group& g = *f.groups[r];
    auto fails = [&](const char* what, auto&& op, const char* a, const char* b) {
      try {
        op();
        ADD_FAILURE() << what << ", rank " << r << ": no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(a), std::string::npos) << what << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find(b), std::string::npos) << what << ": " << e.what();
      }
    };
    // Host sums inside the headers' messages, in messages of their own, and staged.
    for (size_t base : {size_t(70), size_t(1000), size_t(100000)}) {
      const size_t count = r == 1 ? base + 1 : base;  // rank 1 passes another count
      std::vector<float> in(count, 1.0f), out(count);
      fails("allreduce", [&] {
        g.allreduce(desc(OpKind::kAllreduce, count, DataType::kFloat32), in.data(), out.data());
      }, std::to_string(base).c_str(), std::to_string(base + 1).c_str());
    }
    // A broadcast that rides the relay against one that does too (10 and 20
    // elements) and against one that takes the tree (100 and 200).
    for (size_t base : {size_t(10), size_t(100)}) {
      const size_t count = r == 1 ? 2 * base : base;
      std::vector<float> v(count, 1.0f);
      fails("broadcast count", [&] {
        g.broadcast(desc(OpKind::kBroadcast, count, DataType::kFloat32, 0), v.data());
      }, std::to_string(base).c_str(), std::to_string(2 * base).c_str());
    }
    std::vector<int32_t> buf(10, r);
    fails("broadcast", [&] {
      g.broadcast(desc(OpKind::kBroadcast, buf.size(), DataType::kInt32, r == 3 ? 2 : 0), buf.data());
    }, "root", "rank");
    fails("barrier", [&] {
      if (r == 2) return g.barrier(desc(OpKind::kBarrier, 0));
      g.allreduce(desc(OpKind::kAllreduce, buf.size(), DataType::kInt32), buf.data(), buf.data());
    }, "barrier", "allreduce");
    std::vector<float> a(100, static_cast<float>(r + 1)), b(100);
    g.allreduce(desc(OpKind::kAllreduce, a.size(), DataType::kFloat32), a.data(), b.data());
    EXPECT_EQ(b[0], 10.0f);
    EXPECT_EQ(b.back(), 10.0f);
  });
}

// A rank that fails its argument checks tells every rank on every host.
TEST(Hier, ArgumentErrorOnOneRankFailsEveryRank) {
  HierFixture f({0, 0, 1, 1});
  runRanks(4, [&](int r) {
    Group& g = *f.groups[r];
    std::vector<float> in(100000, 1.0f), out(100000);
    OpDesc d = desc(OpKind::kAllreduce, in.size(), DataType::kFloat32);
    try {
      if (r == 3) {
        d.localError = "allreduce (rank 3): bad tensor";
        g.failOp(d);
      } else {
        g.allreduce(d, in.data(), out.data());
      }
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad tensor"), std::string::npos) << e.what();
    }
  });
}

// A rank that leaves (its transports aborted, as when its process dies) fails
// every other rank, on its host and on the other, at once (the world's header
// exchange sees it leave), naming its rank and host.
TEST(Hier, LostHostFailsTheOthersNamingIt) {
  HierFixture f({0, 0, 1, 1});
  runRanks(4, [&](int r) {
    Group& g = *f.groups[r];
    std::vector<float> in(1 << 20, 1.0f), out(in.size());
    const auto t0 = transport::Clock::now();
    if (r == 3) {
      g.markBroken("rank 3 left");  // aborts its transports: its peers see it leave
      return;
    }
    try {
      g.allreduce(desc(OpKind::kAllreduce, in.size(), DataType::kFloat32, 0, ReduceOp::kSum,
                       std::chrono::milliseconds(20000)),
                  in.data(), out.data());
      ADD_FAILURE() << "rank " << r << ": no error";
    } catch (const Error& e) {
      // Rank 3, or a rank that saw it leave and left too, before this one saw
      // rank 3 itself (a loaded machine). That rank's goodbye usually quotes
      // rank 3 (Note [Saying why on the way out]) but is best effort: so a
      // rank with its host, never a timeout.
      const std::string what = e.what();
      const bool names = what.find("rank 3 on host 'h1'") != std::string::npos ||
                         what.find("rank 2 on host 'h1'") != std::string::npos ||
                         what.find("rank 0 on host 'h0'") != std::string::npos ||
                         what.find("rank 1 on host 'h0'") != std::string::npos;
      EXPECT_TRUE(names) << what;
      EXPECT_EQ(what.find("timed out"), std::string::npos) << what;
    }
    // Long before the op's deadline: the peers saw rank 3 leave (Note [Timing
    // bounds in tests] in tests/cpp/timing.h).
    EXPECT_TRUE(testing::endedEarly(transport::Clock::now() - t0, std::chrono::milliseconds(20000)))
        << "rank " << r;
  });
}

// makeGroup picks shared memory for one host and the hierarchy across hosts.
TEST(Hier, MakeGroupChoosesByHost) {
  MemoryStore store;
  collectives::GroupOptions o;
  o.timeout = std::chrono::seconds(20);
  o.storeHost = "127.0.0.1";
  std::vector<std::unique_ptr<Group>> gs(2);
  runRanks(2, [&](int r) { gs[r] = collectives::makeGroup(store, r, 2, o); });
  EXPECT_EQ(gs[0]->describe(), "shared memory");
  for (auto& g : gs) g->close();
}

}  // namespace
}  // namespace braid
