// The flight recorder's ring buffer, sequence numbers, states and pickle
// bytes (Note [Flight recorder]); threads stand for ranks and for the worker.
// That a dump loads with Python's pickle and torch's tools is checked in
// tests/python/test_flight_recorder.py.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "common/flight_recorder.h"
#include "common/pickle_writer.h"

namespace braid {
namespace {

using fr::Entry;
using fr::Op;
using fr::Recorder;

Op allreduce(uint32_t group, int64_t n) {
  Op op;
  op.group = group;
  op.name = "all_reduce";
  op.timeoutMs = 1000;
  int64_t shape[] = {n};
  EXPECT_TRUE(op.addInput("Float", shape, 1));
  EXPECT_TRUE(op.addOutput("Float", shape, 1));
  return op;
}

TEST(PickleWriter, BytesMatchPythonsOpcodes) {
  PickleWriter w;
  w.beginDict();
  w.str("a");
  w.beginList();
  w.integer(1);
  w.none();
  w.str("b");
  w.beginTuple();
  w.boolean(true);
  w.real(1.5);
  w.integer(INT64_MIN);
  w.end();
  w.end();
  w.end();
  // pickle.loads gives {'a': [1, None, 'b', (True, 1.5, -9223372036854775808)]}
  const char expect[] =
      "\x80\x02}(X\x01\x00\x00\x00" "a](J\x01\x00\x00\x00NX\x01\x00\x00\x00" "b(\x88G?\xf8"
      "\x00\x00\x00\x00\x00\x00\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80teu.";
  EXPECT_EQ(w.finish(), std::string(expect, sizeof expect - 1));
}

TEST(PickleWriter, UnbalancedContainersThrow) {
  PickleWriter w;
  EXPECT_THROW(w.end(), std::exception);
  w.beginList();
  EXPECT_THROW(w.finish(), std::exception);
}

TEST(FlightRecorder, StatesAndSequenceNumbers) {
  Recorder r(16);
  uint32_t g = r.addGroup("0", "default_pg", {0, 1}, 1);
  EXPECT_EQ(r.processRank(), 1);
  uint64_t a = r.record(allreduce(g, 4));
  Op send;
  send.group = g;
  send.name = "send";
  send.isP2P = true;
  send.peer = 0;
  uint64_t s = r.record(send);
  uint64_t b = r.record(allreduce(g, 8));
  r.started(a);
  r.finished(a, false);
  r.started(b);
  r.finished(b, true);  // timed out: stays started
  auto es = r.entries();
  ASSERT_EQ(es.size(), 3u);
  EXPECT_EQ(es[0].collectiveSeq, 1u);
  EXPECT_EQ(es[0].p2pSeq, 0u);
  EXPECT_NE(es[0].completedNs, 0);
  EXPECT_EQ(es[1].p2pSeq, 1u);
  EXPECT_EQ(es[1].collectiveSeq, 1u);  // the current collective count
  EXPECT_EQ(es[1].startedNs, 0);       // scheduled
  EXPECT_EQ(es[2].collectiveSeq, 2u);
  EXPECT_NE(es[2].startedNs, 0);
  EXPECT_EQ(es[2].completedNs, 0);
  EXPECT_TRUE(es[2].retired);
  EXPECT_EQ(es[2].op.dims[0], 8);
  EXPECT_EQ(es[2].op.dims[1], 8);
  auto st = r.status(g);
  EXPECT_EQ(st.lastEnqueued, 2u);
  EXPECT_EQ(st.lastStarted, 2u);
  EXPECT_EQ(st.lastCompleted, 1u);
  (void)s;
}

TEST(FlightRecorder, WrapsAroundAndIgnoresOverwrittenIds) {
  Recorder r(4);
  uint32_t g = r.addGroup("0", "undefined", {0}, 0);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(r.record(allreduce(g, i)));
  r.started(ids[0]);  // overwritten long ago: no effect
  r.finished(ids[0], false);
  auto es = r.entries();
  ASSERT_EQ(es.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(es[i].id, ids[6 + i]);
    EXPECT_EQ(es[i].collectiveSeq, 7u + i);
    EXPECT_EQ(es[i].startedNs, 0);
    EXPECT_EQ(es[i].op.dims[0], 6 + i);
  }
}

TEST(FlightRecorder, OffRecordsNothing) {
  Recorder r(0);
  uint32_t g = r.addGroup("0", "undefined", {0}, 0);
  EXPECT_FALSE(r.enabled());
  EXPECT_EQ(r.record(allreduce(g, 1)), 0u);
  r.started(0);
  r.finished(0, false);
  EXPECT_TRUE(r.entries().empty());
}

TEST(FlightRecorder, LongTensorListsAreTruncated) {
  Op op;
  int64_t shape[] = {2, 3, 4, 5};
  int added = 0;
  for (int i = 0; i < 20; ++i) added += op.addInput("Float", shape, 4);
  EXPECT_EQ(added, fr::kMaxDims / 4);
  EXPECT_EQ(op.nDims, fr::kMaxDims);
  Op op2;
  EXPECT_TRUE(op2.addOutput("Long", shape, 1));
  EXPECT_FALSE(op2.addInput("Long", shape, 1));  // inputs come first
}

// Threads as ranks, each with its own recorder (its own process), and a
// worker thread per rank that starts and finishes what the caller records,
// as the backend's worker does.
TEST(FlightRecorder, ThreadsAsRanksWithWorkers) {
  constexpr int kRanks = 3, kOps = 500;
  std::vector<std::unique_ptr<Recorder>> recs;
  for (int r = 0; r < kRanks; ++r) recs.push_back(std::make_unique<Recorder>(64));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      Recorder& r = *recs[rank];
      uint32_t g = r.addGroup("0", "default_pg", {0, 1, 2}, rank);
      std::vector<uint64_t> ids(kOps);
      std::atomic<int> issued{0};
      std::thread worker([&] {
        for (int i = 0; i < kOps; ++i) {
          while (issued.load() <= i) std::this_thread::yield();
          r.started(ids[i]);
          r.finished(ids[i], false);
        }
      });
      for (int i = 0; i < kOps; ++i) {
        ids[i] = r.record(allreduce(g, rank));
        issued.store(i + 1);
      }
      worker.join();
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    auto es = recs[rank]->entries();
    ASSERT_EQ(es.size(), 64u);
    for (size_t i = 0; i < es.size(); ++i) {
      EXPECT_EQ(es[i].collectiveSeq, kOps - 64 + 1 + i);
      EXPECT_NE(es[i].completedNs, 0);
      EXPECT_GE(es[i].completedNs, es[i].startedNs);
    }
    EXPECT_EQ(recs[rank]->status(0).lastCompleted, static_cast<uint64_t>(kOps));
    std::string p = recs[rank]->dumpPickle();
    EXPECT_EQ(p.substr(0, 2), "\x80\x02");
    EXPECT_EQ(p.back(), '.');
    EXPECT_NE(p.find("braid:all_reduce"), std::string::npos);
    EXPECT_NE(p.find("default_pg"), std::string::npos);
  }
}

TEST(FlightRecorder, DumpToFileReportsErrors) {
  Recorder r(4);
  std::string err;
  EXPECT_FALSE(r.dumpToFile("/nonexistent-dir/fr_", &err));
  EXPECT_NE(err.find("/nonexistent-dir/fr_"), std::string::npos);
}

}  // namespace
}  // namespace braid
