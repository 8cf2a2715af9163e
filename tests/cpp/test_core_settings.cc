// Ranks whose settings differ (Note [Settings that shape an op]): every rank
// fails the op, naming the setting and both values, before any data moves,
// and the next op on the same group gives correct results. Settings are set
// per rank through CollectiveConfig, as if each process had its own
// environment; the odd one out is the last rank.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/shm/collectives.h"
#include "core_group.h"

namespace braid {
namespace {

using collectives::CollectiveConfig;
using collectives::Communicator;
using collectives::OpDesc;
using collectives::OpKind;
using testing::desc;
using testing::Group;
using testing::GroupOptions;
using testing::runRanks;

enum class Op { kAllreduce, kReduce, kBroadcast, kAllgather, kAlltoall };

float val(int rank, size_t i) { return static_cast<float>((rank + 1) * 100 + i % 7); }

// Runs `op` with `count` floats per rank (alltoall: per peer). Returns the
// error message, "" when it succeeded. Either way the outputs must hold the
// closed form (success) or be untouched (error: no data moved).
std::string run(Op op, Communicator& c, size_t count) {
  const int n = c.size(), me = c.rank();
  std::vector<float> in(count), out(count, -1.f);
  for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
  std::vector<std::vector<float>> outs(n, std::vector<float>(count, -1.f));
  std::vector<void*> outP(n);
  std::vector<const void*> inP(n, in.data());
  for (int q = 0; q < n; ++q) outP[q] = outs[q].data();
  std::vector<uint64_t> bytes(n, count * sizeof(float));
  std::string error;
  try {
    switch (op) {
      case Op::kAllreduce:
        collectives::allreduce(c, desc(OpKind::kAllreduce, count), in.data(), out.data());
        break;
      case Op::kReduce:
        collectives::reduce(c, desc(OpKind::kReduce, count), in.data(), out.data());
        break;
      case Op::kBroadcast:
        out = in;
        collectives::broadcast(c, desc(OpKind::kBroadcast, count, DataType::kFloat32, n - 1),
                               out.data());
        break;
      case Op::kAllgather:
        collectives::allgather(c, desc(OpKind::kAllgather, count), in.data(), outP.data());
        break;
      case Op::kAlltoall: {
        OpDesc d = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
        d.sendBytes = bytes.data();
        d.recvBytes = bytes.data();
        collectives::alltoall(c, d, inP.data(), outP.data());
        break;
      }
    }
  } catch (const Error& e) {
    error = e.what();
  }
  const bool ok = error.empty();
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += val(q, i);
    switch (op) {
      case Op::kAllreduce:
        EXPECT_EQ(out[i], ok ? sum : -1.f) << "i " << i;
        break;
      case Op::kReduce:
        EXPECT_EQ(out[i], ok && me == 0 ? sum : -1.f) << "i " << i;
        break;
      case Op::kBroadcast:
        EXPECT_EQ(out[i], ok ? val(n - 1, i) : val(me, i)) << "i " << i;
        break;
      case Op::kAllgather:
      case Op::kAlltoall:
        for (int q = 0; q < n; ++q) EXPECT_EQ(outs[q][i], ok ? val(q, i) : -1.f) << "i " << i;
        break;
    }
    if (::testing::Test::HasFailure()) break;
  }
  return error;
}

struct Case {
  const char* name;
  const char* setting;  // as the error names it
  const char* op;       // the failing op's name
  std::string values[2];  // as printed: the others' value, the last rank's
  std::function<void(CollectiveConfig&, bool odd)> set;
  Op failing;
  size_t failCount;
  Op next;  // on the same group, must then succeed
  size_t nextCount;
};

// 8 KiB slots: 1024 floats fit one-shot; 5000 floats are pipelined. The next
// op is one whose steps do not depend on the setting that differs.
std::vector<Case> cases() {
  return {
      {"AllreduceOneShotMax", "BRAID_ALLREDUCE_ONESHOT_MAX", "allreduce", {"0", "1073741824"},
       [](CollectiveConfig& c, bool odd) { c.allreduceOneShotMax = odd ? 1u << 30 : 0; },
       Op::kAllreduce, 1024, Op::kReduce, 1024},
      {"ReduceOneShotMax", "BRAID_REDUCE_ONESHOT_MAX", "reduce", {"1073741824", "0"},
       [](CollectiveConfig& c, bool odd) { c.reduceOneShotMax = odd ? 0 : 1u << 30; },
       Op::kReduce, 1024, Op::kAllreduce, 1024},
      {"DirectOpsAllgather", "BRAID_DIRECT_OPS", "allgather", {"allgather,alltoall", "alltoall"},
       [](CollectiveConfig& c, bool odd) {
         c.directOps = collectives::parseDirectOps(odd ? "alltoall" : "allgather,alltoall", 0);
       },
       Op::kAllgather, 7, Op::kAlltoall, 7},
      {"DirectOpsAlltoall", "BRAID_DIRECT_OPS", "alltoall", {"allgather,alltoall", "allgather"},
       [](CollectiveConfig& c, bool odd) {
         c.directOps = collectives::parseDirectOps(odd ? "allgather" : "allgather,alltoall", 0);
       },
       Op::kAlltoall, 7, Op::kAllgather, 7},
      {"DirectMinBytes", "BRAID_DIRECT_MIN_BYTES", "allgather", {"0", "1048576"},
       [](CollectiveConfig& c, bool odd) { c.directMinBytes = odd ? 1 << 20 : 0; },
       Op::kAllgather, 1, Op::kAllreduce, 5000},
      {"ChunkBytes", "BRAID_CHUNK_BYTES", "allreduce",
       {"1024 (1024-byte chunks)", "2048 (2048-byte chunks)"},
       [](CollectiveConfig& c, bool odd) { c.chunkBytes = odd ? 2048 : 1024; },
       Op::kAllreduce, 5000, Op::kAllreduce, 1024},
      {"ChunkBytesAutomatic", "BRAID_CHUNK_BYTES", "broadcast",
       {"4096 (4096-byte chunks)", "0 (8192-byte chunks)"},
       [](CollectiveConfig& c, bool odd) { c.chunkBytes = odd ? 0 : 4096; },
       Op::kBroadcast, 3, Op::kReduce, 3},
  };
}

void PrintTo(const Case& k, std::ostream* os) { *os << k.name; }

class Mismatch : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(Mismatch, EveryRankNamesTheSettingAndBothValuesThenTheGroupWorks) {
  const Case& k = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  GroupOptions o = testing::slots(8192);
  o.config = [&](int r) {
    CollectiveConfig c;
    k.set(c, r == n - 1);
    return c;
  };
  Group g(n, o);
  std::vector<std::string> errors(n);
  runRanks(n, [&](int r) {
    errors[r] = run(k.failing, *g.comms[r], k.failCount);
    EXPECT_EQ(run(k.next, *g.comms[r], k.nextCount), "") << "rank " << r;
  });
  for (int r = 0; r < n; ++r) {
    const bool odd = r == n - 1;
    const std::string want =
        strCat("braid ", k.op, " (rank ", r, "): rank ", odd ? 0 : n - 1, " runs with ",
               k.setting, "=", k.values[odd ? 0 : 1], ", this rank with ", k.setting, "=",
               k.values[odd ? 1 : 0]);
    EXPECT_NE(errors[r].find(want), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Settings, Mismatch,
                         ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<Case, int>>& p) {
                           return strCat(std::get<0>(p.param).name, "_n",
                                         std::get<1>(p.param));
                         });

// A setting that does not change the op's steps is not compared: reduce has
// no direct path, so BRAID_DIRECT_OPS listing it changes nothing.
TEST(Mismatch, DirectOpsNamingReduceChangesNothing) {
  GroupOptions o = testing::slots(8192);
  o.config = [](int r) {
    CollectiveConfig c;
    c.directMinBytes = 0;
    c.directOps = collectives::parseDirectOps(r ? "reduce,allgather" : "allgather", 0);
    return c;
  };
  Group g(2, o);
  runRanks(2, [&](int r) {
    for (size_t count : {0, 1, 1023, 5000}) EXPECT_EQ(run(Op::kReduce, *g.comms[r], count), "");
  });
}

// The header carries the path each rank takes, not what its settings would
// choose: ranks that call different algorithms directly fail the op.
TEST(Mismatch, DifferentPathsAreNamedAndTheGroupRecovers) {
  Group g(2, testing::slots(8192));
  std::vector<std::string> errors(2);
  runRanks(2, [&](int r) {
    std::vector<float> buf(100, 1.f);
    try {
      auto d = desc(OpKind::kAllreduce, buf.size());
      if (r == 0) collectives::allreduceOneShot(*g.comms[r], d, buf.data(), buf.data());
      if (r == 1) collectives::allreduceRsAg(*g.comms[r], d, buf.data(), buf.data());
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    EXPECT_EQ(buf[0], 1.f);
    EXPECT_EQ(run(Op::kAllreduce, *g.comms[r], 100), "");
  });
  EXPECT_NE(errors[0].find("rank 1 takes the pipelined shared-memory path, this rank the "
                           "one-shot path"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0 takes the one-shot path"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace braid
