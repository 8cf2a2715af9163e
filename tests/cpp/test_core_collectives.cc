// Collectives over the shared-memory window, ranks as threads, results
// checked against closed forms.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>

#include <sys/mman.h>

#include "collectives/shm/collectives.h"
#include "transport/shm/p2p_engine.h"
#include "core_group.h"
#include "memory_store.h"
#include "timing.h"
#include "transport/shm/window.h"

namespace braid {
namespace {

using collectives::Communicator;
using collectives::OpDesc;
using collectives::OpKind;
using testing::desc;
using testing::Group;
using testing::GroupOptions;
using testing::runRanks;
using testing::shmOnly;
using testing::slots;
using testing::withConfig;

float val(int rank, size_t i) { return static_cast<float>((rank + 1) * 1000 + i % 997); }

class Sizes : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

// A 4 KiB slot makes every count above 1024 floats take the chunked paths.
void checkAllCollectives(int n, size_t count, const GroupOptions& opts = slots(4096)) {
  Group g(n, opts);
  runRanks(n, [&](int r) {
    Communicator& c = *g.comms[r];
    std::vector<float> in(count), out(count, -1.f);
    for (size_t i = 0; i < count; ++i) in[i] = val(r, i);
    // allreduce SUM and MAX, in place and out of place
    collectives::allreduce(c, desc(OpKind::kAllreduce, count), in.data(), out.data());
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += val(q, i);
      ASSERT_EQ(out[i], want) << "allreduce i=" << i;
    }
    std::vector<float> buf = in;
    collectives::allreduce(c, desc(OpKind::kAllreduce, count, DataType::kFloat32, 0, ReduceOp::kMax),
                           buf.data(), buf.data());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], val(n - 1, i));
    // broadcast from the last rank
    buf = in;
    collectives::broadcast(c, desc(OpKind::kBroadcast, count, DataType::kFloat32, n - 1), buf.data());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], val(n - 1, i));
    // reduce to rank 0
    std::fill(out.begin(), out.end(), -1.f);
    collectives::reduce(c, desc(OpKind::kReduce, count), in.data(), out.data());
    if (r == 0) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += val(q, i);
        ASSERT_EQ(out[i], want);
      }
    }
    // allgather / gather
    std::vector<std::vector<float>> outs(n, std::vector<float>(count));
    std::vector<void*> outPtrs(n);
    for (int q = 0; q < n; ++q) outPtrs[q] = outs[q].data();
    collectives::allgather(c, desc(OpKind::kAllgather, count), in.data(), outPtrs.data());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(outs[q][i], val(q, i));
    // In place: the input is this rank's own block of the output.
    for (auto& o : outs) std::fill(o.begin(), o.end(), -1.f);
    outs[r] = in;
    collectives::allgather(c, desc(OpKind::kAllgather, count), outs[r].data(), outPtrs.data());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(outs[q][i], val(q, i)) << "in place, block " << q;
    collectives::gather(c, desc(OpKind::kGather, count, DataType::kFloat32, n / 2), in.data(),
                        outPtrs.data());
    // scatter from rank n/2: section q holds val(q, i)
    std::vector<std::vector<float>> secs(n, std::vector<float>(count));
    std::vector<const void*> secPtrs(n);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; ++i) secs[q][i] = val(q, i) + r;
      secPtrs[q] = secs[q].data();
    }
    collectives::scatter(c, desc(OpKind::kScatter, count, DataType::kFloat32, n / 2),
                         secPtrs.data(), out.data());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], val(r, i) + n / 2);
    // reduce_scatter: out = sum over ranks q of (val(r, i) + q)
    collectives::reduceScatter(c, desc(OpKind::kReduceScatter, count), secPtrs.data(), out.data());
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += val(r, i) + q;
      ASSERT_EQ(out[i], want);
    }
    collectives::barrier(c, desc(OpKind::kBarrier, 0, DataType::kUInt8));
  });
}

TEST_P(Sizes, AllCollectivesMatchClosedForms) {
  checkAllCollectives(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

// The same through direct reads of peers' memory (Note [Direct transfers]),
// and with direct reads turned off entirely.
TEST_P(Sizes, DirectPathMatchesClosedForms) {
  checkAllCollectives(std::get<0>(GetParam()), std::get<1>(GetParam()),
                      withConfig(slots(4096), testing::directEverywhere()));
}

// Chunks smaller than a slot (Note [Chunk size and direct reads]): 320 bytes
// split among up to 5 ranks leaves pieces of one cache line.
TEST_P(Sizes, SmallChunksMatchClosedForms) {
  collectives::CollectiveConfig cfg;
  cfg.chunkBytes = 320;
  checkAllCollectives(std::get<0>(GetParam()), std::get<1>(GetParam()),
                      shmOnly(withConfig(slots(4096), cfg)));
}

TEST_P(Sizes, SharedMemoryOnlyMatchesClosedForms) {
  checkAllCollectives(std::get<0>(GetParam()), std::get<1>(GetParam()), shmOnly(slots(4096)));
}

INSTANTIATE_TEST_SUITE_P(Core, Sizes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(0, 1, 7, 1023, 5000)));

class Alltoall : public ::testing::TestWithParam<bool> {};

// Direct: alltoall reads every block directly (BRAID_DIRECT_MIN_BYTES=0).
TEST_P(Alltoall, UnevenSplits) {
  collectives::CollectiveConfig cfg;
  cfg.directMinBytes = 0;
  for (int n : {1, 2, 3, 5}) {
    Group g(n, GetParam() ? withConfig(slots(4096), cfg) : shmOnly(slots(4096)));
    runRanks(n, [&](int r) {
      // rank i sends (i + j) * 300 + 1 bytes to rank j, byte value i*16+j
      std::vector<uint64_t> sendB(n), recvB(n);
      std::vector<std::vector<uint8_t>> ins(n), outs(n);
      std::vector<const void*> inP(n);
      std::vector<void*> outP(n);
      for (int j = 0; j < n; ++j) {
        sendB[j] = (r + j) * 300 + 1;
        recvB[j] = (j + r) * 300 + 1;
        ins[j].assign(sendB[j], static_cast<uint8_t>(r * 16 + j));
        outs[j].assign(recvB[j], 0);
        inP[j] = ins[j].data();
        outP[j] = outs[j].data();
      }
      OpDesc d = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
      d.sendBytes = sendB.data();
      d.recvBytes = recvB.data();
      collectives::alltoall(*g.comms[r], d, inP.data(), outP.data());
      for (int j = 0; j < n; ++j)
        for (uint8_t b : outs[j]) ASSERT_EQ(b, static_cast<uint8_t>(j * 16 + r));
    });
  }
}

INSTANTIATE_TEST_SUITE_P(DirectAndShm, Alltoall, ::testing::Values(true, false));

TEST(Errors, ShapeMismatchIsSeenByEveryRankAndTheGroupRecovers) {
  Group g(3, 4096);
  std::vector<std::string> errors(3);
  runRanks(3, [&](int r) {
    Communicator& c = *g.comms[r];
    size_t count = r == 1 ? 3 : 4;
    std::vector<float> buf(count, 1.f);
    try {
      collectives::allreduce(c, desc(OpKind::kAllreduce, count), buf.data(), buf.data());
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    std::vector<float> ok(4, 1.f);
    collectives::allreduce(c, desc(OpKind::kAllreduce, 4), ok.data(), ok.data());
    EXPECT_EQ(ok[0], 3.f);
  });
  EXPECT_NE(errors[0].find("braid allreduce (rank 0): rank 1 passed shape [3] (float32), this "
                           "rank shape [4] (float32)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0 passed shape [4]"), std::string::npos) << errors[1];
  EXPECT_FALSE(errors[2].empty());
}

TEST(Errors, UnknownDirectOpIsNamed) {
  setenv("BRAID_DIRECT_OPS", "allreduce,allgatherr", 1);
  try {
    Group g(1, 4096);
    ADD_FAILURE() << "BRAID_DIRECT_OPS=allgatherr was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown op 'allgatherr'"), std::string::npos)
        << e.what();
  }
  unsetenv("BRAID_DIRECT_OPS");
}

TEST(Errors, TimeoutNamesTheMissingRank) {
  Group g(3, 4096);
  runRanks(3, [&](int r) {
    if (r == 2) return;  // never arrives
    OpDesc d = desc(OpKind::kBarrier, 0, DataType::kUInt8);
    d.timeout = std::chrono::milliseconds(300);
    auto t0 = transport::Clock::now();
    d.deadline = t0 + d.timeout;
    try {
      collectives::barrier(*g.comms[r], d);
      ADD_FAILURE() << "barrier did not time out";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("Timed out after 300 ms waiting for rank(s) [2]"),
                std::string::npos)
          << e.what();
    }
    // Note [Timing bounds in tests] in tests/cpp/timing.h
    EXPECT_TRUE(testing::timedOut(transport::Clock::now() - t0, d.timeout)) << "rank " << r;
  });
}

TEST(P2P, TagsAnySourceAndCrossingSends) {
  const int n = 3;
  Group g(n, 4096);
  runRanks(n, [&](int r) {
    transport::shm::P2PEngine p2p(g.comms[r]->window());
    auto deadline = transport::Clock::now() + std::chrono::seconds(20);
    std::chrono::milliseconds to(20000);
    // Every rank sends 20000 floats (more than the 4 KiB ring) to every other
    // rank with two tags, before receiving: needs progress on both sides.
    std::vector<std::vector<float>> payload(2 * n, std::vector<float>(20000));
    std::vector<std::promise<void>> sent(2 * n);
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      for (int tag = 0; tag < 2; ++tag) {
        auto& p = payload[2 * j + tag];
        std::iota(p.begin(), p.end(), float(r * 100 + tag));
        p2p.postSend(j, tag, p.data(), p.size() * 4, deadline, to,
                     [&, j, tag](std::exception_ptr e, int) { sent[2 * j + tag].set_value(); });
      }
    }
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      for (int tag : {1, 0}) {  // receive in the other tag order
        std::vector<float> got(20000);
        std::promise<int> src;
        p2p.postRecv(j, tag, got.data(), got.size() * 4, deadline, to,
                     [&](std::exception_ptr e, int s) {
                       if (e) src.set_exception(e); else src.set_value(s);
                     });
        ASSERT_EQ(src.get_future().get(), j);
        ASSERT_EQ(got[5], float(j * 100 + tag + 5));
      }
    }
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      for (int tag = 0; tag < 2; ++tag) sent[2 * j + tag].get_future().wait();
    }
    // recv from any source
    if (r == 0) {
      for (int k = 0; k < n - 1; ++k) {
        int x = -1;
        std::promise<int> src;
        p2p.postRecv(transport::shm::P2PEngine::kAnySource, 7, &x, 4, deadline, to,
                     [&](std::exception_ptr e, int s) { src.set_value(s); });
        int s = src.get_future().get();
        ASSERT_EQ(x, s * 11);
      }
    } else {
      int x = r * 11;
      std::promise<void> done;
      p2p.postSend(0, 7, &x, 4, deadline, to, [&](std::exception_ptr, int) { done.set_value(); });
      done.get_future().wait();
    }
    collectives::barrier(*g.comms[r], desc(OpKind::kBarrier, 0, DataType::kUInt8));
  });
}

// Note [Started messages]: a send that times out with part of it in the ring
// goes on from a copy. Its Done callback may release the caller's buffer (a
// Work dropping its tensor), so the copy must be made before the callback
// runs: here the buffer is freed inside Done, and a copy made after it read
// freed memory (SIGSEGV on torch 2.14 in the fault-injection suite, sendrecv
// cbhang with 4 MiB messages). The receiver, arriving late, still gets every
// byte intact.
TEST(P2P, TimedOutStartedSendCopiesBeforeItsCallbackReleasesTheBuffer) {
  Group g(2, 4096);  // 4 KiB rings
  const size_t count = 1 << 20;  // 4 MiB: freed with munmap, so a late read faults
  std::promise<void> timedOut;
  runRanks(2, [&](int r) {
    // Rank 1 starts its progress thread only after the sender gave up (a live
    // one would drain the message into its buffer of unexpected ones).
    if (r == 1) timedOut.get_future().wait();
    transport::shm::P2PEngine p2p(g.comms[r]->window());
    if (r == 0) {
      auto buf = std::make_shared<std::vector<float>>(count);
      std::iota(buf->begin(), buf->end(), 1.0f);
      std::promise<std::string> err;
      const float* data = buf->data();
      p2p.postSend(1, 3, data, count * 4, transport::Clock::now() + std::chrono::milliseconds(200),
                   std::chrono::milliseconds(200),
                   [&err, buf = std::move(buf)](std::exception_ptr e, int) mutable {
                     std::string what = "no error";
                     try {
                       if (e) std::rethrow_exception(e);
                     } catch (const std::exception& x) {
                       what = x.what();
                     }
                     buf.reset();  // the caller's buffer goes, as a Work's tensor may
                     err.set_value(what);
                   });
      std::string what = err.get_future().get();
      EXPECT_NE(what.find("Timed out after 200 ms waiting for rank 1 to receive tag 3"),
                std::string::npos)
          << what;
      timedOut.set_value();
    } else {
      std::vector<float> got(count);
      std::promise<int> src;
      p2p.postRecv(0, 3, got.data(), count * 4, transport::Clock::now() + std::chrono::seconds(20),
                   std::chrono::milliseconds(20000), [&](std::exception_ptr e, int s) {
                     if (e) src.set_exception(e); else src.set_value(s);
                   });
      ASSERT_EQ(src.get_future().get(), 0);
      for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(got[i], float(i + 1)) << i;
      ASSERT_EQ(got[count - 1], float(count));
    }
    collectives::barrier(*g.comms[r], desc(OpKind::kBarrier, 0, DataType::kUInt8));
  });
}

// Note [A stalled progress thread]: a receive attached to a message whose
// sender is alive but has stopped sending (its progress thread is stuck) times
// out instead of waiting for ever (fault suite: n4-sendrecv-cbhang, a survivor
// hung in a 4 MiB receive from the victim whose callback held its p2p thread).
// Here rank 0, a sender with no progress thread, writes a frame (p2p.cc's
// layout: magic, tag, bytes) and 1000 of its 1 MiB into the ring, then stops.
TEST(P2P, ReceiveOfAMessageThatStopsArrivingTimesOut) {
  Group g(2, 4096);  // 4 KiB rings
  const size_t count = 1 << 18;
  std::promise<void> received;
  runRanks(2, [&](int r) {
    if (r == 0) {
      struct {
        uint32_t magic = 0x62703270;  // P2PEngine's frame header
        uint32_t reserved = 0;
        int64_t tag = 5;
        uint64_t bytes = count * 4;
      } frame;
      std::vector<uint8_t> part(1000, 7);
      auto& ch = g.comms[r]->window().to(1);
      ASSERT_EQ(ch.write(&frame, sizeof frame), sizeof frame);
      ASSERT_EQ(ch.write(part.data(), part.size()), part.size());
      g.comms[r]->window().notifyActivity();
      received.get_future().wait();
      return;
    }
    transport::shm::P2PEngine p2p(g.comms[r]->window());
    std::vector<float> got(count);
    std::promise<std::string> err;
    auto t0 = transport::Clock::now();
    p2p.postRecv(0, 5, got.data(), count * 4, t0 + std::chrono::milliseconds(300),
                 std::chrono::milliseconds(300), [&](std::exception_ptr e, int) {
                   std::string what = "no error";
                   try {
                     if (e) std::rethrow_exception(e);
                   } catch (const std::exception& x) {
                     what = x.what();
                   }
                   err.set_value(what);
                 });
    auto f = err.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "the receive of a stalled message never ended";
    std::string what = f.get();
    EXPECT_NE(what.find("braid recv (rank 1): Timed out after 300 ms waiting for rank 0 to go on "
                        "with a message with tag 5 (1000 of 1048576 bytes received)"),
              std::string::npos)
        << what;
    EXPECT_TRUE(testing::timedOut(transport::Clock::now() - t0, std::chrono::milliseconds(300)));
    received.set_value();
  });
}

// Note [A peer that leaves during a direct read]: a read of a peer's memory
// that fails because the peer unmapped its buffer (it left the op) is a lost
// peer naming that rank and the op, not an unexplained I/O error (fault suite:
// a survivor read a buffer that another survivor had freed after seeing a
// third rank die, "reading ... failed: Bad address").
TEST(DirectRead, UnmappedPeerBufferIsALostPeer) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' builds copy a thread-rank's memory in user space";
#else
  Group g(2, 4096);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  ASSERT_EQ(munmap(page, 4096), 0);  // what a peer's freed buffer looks like
  transport::WaitContext ctx;
  ctx.op = "alltoall";
  ctx.opSeq = 7;
  ctx.timeout = std::chrono::milliseconds(1000);
  ctx.deadline = transport::Clock::now() + ctx.timeout;
  std::vector<uint8_t> dst(4096);
  try {
    g.comms[0]->window().readPeer(1, reinterpret_cast<uint64_t>(page), dst.data(), dst.size(), ctx);
    FAIL() << "reading unmapped memory succeeded";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("braid alltoall (rank 0): rank 1 left op #7 while this "
                                         "rank read its memory"),
              std::string::npos)
        << e.what();
  }
#endif
}

}  // namespace
}  // namespace braid
