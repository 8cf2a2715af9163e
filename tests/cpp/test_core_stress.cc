// Stress for the torch-free core with threads as ranks: more ranks than
// cores, several groups at once, many p2p tags and any-source receives,
// timeouts against slow peers, and shutdown (Window::abort, a peer leaving)
// while ranks wait. Every result is checked against a closed form, and every
// wait is bounded, so a bug fails a test instead of hanging it. Built for
// tools/sanitize.sh (ASan+UBSan, TSan) as much as for the plain build.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shm/collectives.h"
#include "transport/shm/p2p_engine.h"
#include "core_group.h"
#include "machine_skip.h"
#include "memory_store.h"
#include "timing.h"
#include "transport/shm/window.h"

namespace braid {
namespace {

using collectives::Communicator;
using collectives::OpDesc;
using collectives::OpKind;
using transport::shm::P2PEngine;
using std::chrono::milliseconds;
using testing::MemoryStore;
using testing::runRanks;
using Clock = transport::Clock;

constexpr milliseconds kLong{15000};  // "never" for a test; still bounded

struct Group : testing::Group {
  Group(int n, size_t slotBytes, size_t channelBytes = 4096)
      : testing::Group(n, slotBytes, channelBytes, kLong) {}
  Group(int n, testing::GroupOptions o) : testing::Group(n, withLongTimeout(o)) {}
  static testing::GroupOptions withLongTimeout(testing::GroupOptions o) {
    o.timeout = kLong;
    return o;
  }
};

OpDesc desc(OpKind k, size_t count, DataType t, int root = 0, ReduceOp op = ReduceOp::kSum,
            milliseconds timeout = kLong) {
  return testing::desc(k, count, t, root, op, timeout);
}

OpDesc barrierDesc(milliseconds timeout = kLong) {
  return desc(OpKind::kBarrier, 0, DataType::kUInt8, 0, ReduceOp::kSum, timeout);
}

// Restricts the calling thread to the first two CPUs it may use, so that the
// oversubscription is the same on a 2-core laptop and a 64-core CI runner.
void pinToTwoCpus() {
  cpu_set_t cur, two;
  CPU_ZERO(&two);
  if (sched_getaffinity(0, sizeof(cur), &cur) != 0) return;
  for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; ++c) {
    if (CPU_ISSET(c, &cur)) {
      CPU_SET(c, &two);
      ++k;
    }
  }
  pthread_setaffinity_np(pthread_self(), sizeof(two), &two);
}

// Random yields and short sleeps, so that ranks reach each step in changing orders.
void jitter(std::mt19937& rng) {
  switch (rng() % 8) {
    case 0:
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      break;
    case 1:
    case 2:
      std::this_thread::yield();
      break;
    default:
      break;
  }
}

// A callback that fulfils a promise with the source rank or the error.
struct Completion {
  std::promise<int> promise;
  std::future<int> future = promise.get_future();
  P2PEngine::Done done() {
    return [this](std::exception_ptr e, int src) {
      if (e) {
        promise.set_exception(e);
      } else {
        promise.set_value(src);
      }
    };
  }
  // The source rank; throws the op's error; fails the test instead of hanging.
  int get(milliseconds limit = kLong) {
    if (future.wait_for(limit) != std::future_status::ready) {
      ADD_FAILURE() << "p2p op did not complete within " << limit.count() << " ms";
      return -2;
    }
    return future.get();
  }
};

// Runs a test once with every op forced onto direct reads of peers' memory
// (Note [Direct transfers]) and once with shared memory only.
class BothPaths : public ::testing::TestWithParam<bool> {
 protected:
  // How to make the test's groups: every op direct, or shared memory only.
  testing::GroupOptions paths(size_t slotBytes) {
    testing::GroupOptions o = testing::slots(slotBytes);
    return GetParam() ? testing::withConfig(o, testing::directEverywhere()) : testing::shmOnly(o);
  }
  // Direct reads need process_vm_readv, which seccomp or Yama may forbid.
  bool directUnavailable(Communicator& c) { return GetParam() && !c.window().canReadPeers(); }
};
std::string pathName(const ::testing::TestParamInfo<bool>& p) { return p.param ? "Direct" : "Shm"; }

// ---- More ranks than cores ----------------------------------------------------

class Oversubscribed : public BothPaths {};
class ConcurrentGroups : public BothPaths {};
INSTANTIATE_TEST_SUITE_P(Paths, Oversubscribed, ::testing::Bool(), pathName);
INSTANTIATE_TEST_SUITE_P(Paths, ConcurrentGroups, ::testing::Bool(), pathName);

// 8 ranks pinned to 2 CPUs run every collective 80 times with sizes that take
// the one-shot and the chunked paths (4 KiB slots), rotating roots and random
// jitter. Integer data makes every closed form exact.
TEST_P(Oversubscribed, EightRanksOnTwoCoresAllCollectives) {
  const int n = 8;
  const size_t counts[] = {0, 1, 5, 1023, 1024, 3001, 9000};
  Group g(n, paths(4096));
  if (directUnavailable(*g.comms[0])) BRAID_MACHINE_SKIP("direct reads are not permitted here");
  runRanks(n, [&](int r) {
    pinToTwoCpus();
    std::mt19937 rng(1234 + r);
    Communicator& c = *g.comms[r];
    for (int it = 0; it < 80; ++it) {
      const size_t count = counts[it % 7];
      const int root = it % n;
      jitter(rng);
      // allreduce SUM: sum over q of (q + 1) * (i % 101) + it
      std::vector<int32_t> in(count), out(count, -1);
      for (size_t i = 0; i < count; ++i) in[i] = (r + 1) * static_cast<int32_t>(i % 101) + it;
      collectives::allreduce(c, desc(OpKind::kAllreduce, count, DataType::kInt32), in.data(),
                             out.data());
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], n * (n + 1) / 2 * static_cast<int32_t>(i % 101) + n * it)
            << "allreduce it=" << it << " i=" << i;
      }
      jitter(rng);
      // allreduce MAX in place: max over q of (q * 3 + i) % 17
      std::vector<int32_t> mx(count);
      for (size_t i = 0; i < count; ++i) mx[i] = static_cast<int32_t>((r * 3 + i) % 17);
      collectives::allreduce(c,
                             desc(OpKind::kAllreduce, count, DataType::kInt32, 0, ReduceOp::kMax),
                             mx.data(), mx.data());
      for (size_t i = 0; i < count; ++i) {
        int32_t want = 0;
        for (int q = 0; q < n; ++q) want = std::max<int32_t>(want, (q * 3 + i) % 17);
        ASSERT_EQ(mx[i], want) << "max it=" << it << " i=" << i;
      }
      jitter(rng);
      // broadcast from a rotating root
      std::vector<int64_t> b(count);
      for (size_t i = 0; i < count; ++i) b[i] = r == root ? int64_t(i) * 7 + it : -5;
      collectives::broadcast(c, desc(OpKind::kBroadcast, count, DataType::kInt64, root), b.data());
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], int64_t(i) * 7 + it) << "bcast i=" << i;
      jitter(rng);
      // reduce AVG of (r + 1) to another root: (n + 1) / 2 exactly in float
      const int rroot = (it + 3) % n;
      std::vector<float> fin(count, float(r + 1)), fout(count, -1.f);
      collectives::reduce(c,
                          desc(OpKind::kReduce, count, DataType::kFloat32, rroot, ReduceOp::kAvg),
                          fin.data(), fout.data());
      if (r == rroot) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(fout[i], (n + 1) / 2.f) << "reduce i=" << i;
      }
      jitter(rng);
      // reduce_scatter: section s of rank q holds q * 1000 + s + i % 13
      const size_t sec = count / 8 + 1;
      std::vector<std::vector<int64_t>> secs(n, std::vector<int64_t>(sec));
      std::vector<const void*> secPtrs(n);
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < sec; ++i) secs[s][i] = r * 1000 + s + int64_t(i % 13);
        secPtrs[s] = secs[s].data();
      }
      std::vector<int64_t> rs(sec, -1);
      collectives::reduceScatter(c, desc(OpKind::kReduceScatter, sec, DataType::kInt64),
                                 secPtrs.data(), rs.data());
      for (size_t i = 0; i < sec; ++i) {
        ASSERT_EQ(rs[i], 1000 * n * (n - 1) / 2 + n * (r + int64_t(i % 13))) << "rs i=" << i;
      }
      jitter(rng);
      // allgather of uint8 patterns
      std::vector<uint8_t> gin(sec);
      for (size_t i = 0; i < sec; ++i) gin[i] = static_cast<uint8_t>(r * 29 + i + it);
      std::vector<std::vector<uint8_t>> gouts(n, std::vector<uint8_t>(sec));
      std::vector<void*> gptr(n);
      for (int q = 0; q < n; ++q) gptr[q] = gouts[q].data();
      collectives::allgather(c, desc(OpKind::kAllgather, sec, DataType::kUInt8), gin.data(),
                             gptr.data());
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < sec; ++i) {
          ASSERT_EQ(gouts[q][i], static_cast<uint8_t>(q * 29 + i + it)) << "ag q=" << q;
        }
      }
      jitter(rng);
      // alltoall: rank i sends ((i + j + it) % 5) * 700 bytes of value i*8+j to rank j
      std::vector<uint64_t> sendB(n), recvB(n);
      std::vector<std::vector<uint8_t>> ains(n), aouts(n);
      std::vector<const void*> aip(n);
      std::vector<void*> aop(n);
      for (int j = 0; j < n; ++j) {
        sendB[j] = ((r + j + it) % 5) * 700;
        recvB[j] = ((j + r + it) % 5) * 700;
        ains[j].assign(sendB[j], static_cast<uint8_t>(r * 8 + j));
        aouts[j].assign(recvB[j], 0xee);
        aip[j] = ains[j].data();
        aop[j] = aouts[j].data();
      }
      OpDesc a = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
      a.sendBytes = sendB.data();
      a.recvBytes = recvB.data();
      collectives::alltoall(c, a, aip.data(), aop.data());
      for (int j = 0; j < n; ++j) {
        for (uint8_t v : aouts[j]) ASSERT_EQ(v, static_cast<uint8_t>(j * 8 + r)) << "a2a j=" << j;
      }
    }
    collectives::barrier(c, barrierDesc());
  });
}

// Every op lets the caller reuse its buffers as soon as it returns: each rank
// overwrites its input (and output) right after the call, while slower peers
// may still be finishing the same op. With direct reads, this is what the
// final step of each op guarantees (Note [Direct transfers]).
class BufferReuse : public BothPaths {};
INSTANTIATE_TEST_SUITE_P(Paths, BufferReuse, ::testing::Bool(), pathName);

TEST_P(BufferReuse, BuffersAreReusableAsSoonAsAnOpReturns) {
  const int n = 4;
  const size_t count = 3000;  // 12000 bytes: three 4 KiB slots
  Group g(n, paths(4096));
  if (directUnavailable(*g.comms[0])) BRAID_MACHINE_SKIP("direct reads are not permitted here");
  runRanks(n, [&](int r) {
    Communicator& c = *g.comms[r];
    std::mt19937 rng(5 + r);
    std::vector<int32_t> buf(count), other(count);
    std::vector<std::vector<int32_t>> many(n, std::vector<int32_t>(count));
    std::vector<void*> manyOut(n);
    std::vector<const void*> manyIn(n);
    for (int q = 0; q < n; ++q) {
      manyOut[q] = many[q].data();
      manyIn[q] = many[q].data();
    }
    for (int it = 0; it < 120; ++it) {
      const int root = it % n;
      // allreduce in place, then the buffer is rewritten at once
      std::fill(buf.begin(), buf.end(), r + it);
      collectives::allreduce(c, desc(OpKind::kAllreduce, count, DataType::kInt32), buf.data(),
                             buf.data());
      const int32_t sum = buf[count / 2];
      std::fill(buf.begin(), buf.end(), -7);
      ASSERT_EQ(sum, n * (n - 1) / 2 + n * it) << "allreduce it " << it;
      jitter(rng);
      // broadcast: the root rewrites its buffer at once
      std::fill(buf.begin(), buf.end(), r == root ? 1000 + it : -1);
      collectives::broadcast(c, desc(OpKind::kBroadcast, count, DataType::kInt32, root),
                             buf.data());
      const int32_t first = buf.front(), last = buf.back();
      std::fill(buf.begin(), buf.end(), -8);
      ASSERT_EQ(first, 1000 + it);
      ASSERT_EQ(last, 1000 + it);
      jitter(rng);
      // allgather: the input is rewritten at once
      std::fill(other.begin(), other.end(), 10 * r + it);
      collectives::allgather(c, desc(OpKind::kAllgather, count, DataType::kInt32), other.data(),
                             manyOut.data());
      std::fill(other.begin(), other.end(), -9);
      for (int q = 0; q < n; ++q) {
        ASSERT_EQ(many[q].front(), 10 * q + it);
        ASSERT_EQ(many[q].back(), 10 * q + it);
      }
      jitter(rng);
      // reduce_scatter: section s of rank q holds q + s + it; inputs rewritten at once
      for (int s2 = 0; s2 < n; ++s2) std::fill(many[s2].begin(), many[s2].end(), r + s2 + it);
      collectives::reduceScatter(c, desc(OpKind::kReduceScatter, count, DataType::kInt32),
                                 manyIn.data(), buf.data());
      for (auto& m : many) std::fill(m.begin(), m.end(), -10);
      ASSERT_EQ(buf.front(), n * (n - 1) / 2 + n * (r + it));
      ASSERT_EQ(buf.back(), n * (n - 1) / 2 + n * (r + it));
    }
    collectives::barrier(c, barrierDesc());
  });
}

// ---- Several groups at once ---------------------------------------------------

// Four "processes" (0..3) each drive three groups from three threads, as the
// backend's per-group workers do: the world, a pair {0,1} / {2,3} and a group
// in reverse order. Groups are created concurrently too. Each group's values
// carry its id, so a message crossing groups shows up as a wrong sum.
TEST_P(ConcurrentGroups, ThreeGroupsPerRankFromDifferentThreads) {
  const int world = 4;
  std::unique_ptr<Group> groups[4];  // world, pair A {0,1}, pair B {2,3}, reversed world
  {
    std::vector<std::thread> t;
    t.emplace_back([&] { groups[0] = std::make_unique<Group>(world, paths(8192)); });
    t.emplace_back([&] { groups[1] = std::make_unique<Group>(2, paths(4096)); });
    t.emplace_back([&] { groups[2] = std::make_unique<Group>(2, paths(4096)); });
    t.emplace_back([&] { groups[3] = std::make_unique<Group>(world, paths(4096)); });
    for (auto& x : t) x.join();
  }
  if (directUnavailable(*groups[0]->comms[0]))
    BRAID_MACHINE_SKIP("direct reads are not permitted here");
  // The body for one member of one group: 150 allreduces (chunked every third
  // time) and a broadcast, with group-specific values.
  auto drive = [&](int gid, int gr, int gn) {
    Communicator& c = *groups[gid]->comms[gr];
    std::mt19937 rng(77 * gid + gr);
    for (int it = 0; it < 150; ++it) {
      const size_t count = it % 3 == 0 ? 5000 : 300;
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = gid * 100000 + gr * 10 + int32_t(i % 7);
      collectives::allreduce(c, desc(OpKind::kAllreduce, count, DataType::kInt32), v.data(),
                             v.data());
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(v[i], gn * (gid * 100000 + int32_t(i % 7)) + 10 * gn * (gn - 1) / 2)
            << "group " << gid << " it " << it << " i " << i;
      }
      if (it % 10 == 0) jitter(rng);
      std::vector<int32_t> b(64, gr == it % gn ? gid * 1000 + it : -1);
      collectives::broadcast(c, desc(OpKind::kBroadcast, 64, DataType::kInt32, it % gn), b.data());
      for (int32_t x : b) ASSERT_EQ(x, gid * 1000 + it);
    }
  };
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(12);
  auto spawn = [&](int slot, int gid, int gr, int gn) {
    threads.emplace_back([&, slot, gid, gr, gn] {
      try {
        drive(gid, gr, gn);
      } catch (...) {
        errors[slot] = std::current_exception();
      }
    });
  };
  for (int p = 0; p < world; ++p) {
    spawn(3 * p, 0, p, world);
    spawn(3 * p + 1, p < 2 ? 1 : 2, p % 2, 2);
    spawn(3 * p + 2, 3, world - 1 - p, world);
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Windows created one after another on the same store get separate
// incarnations (keys do not collide) and work side by side.
TEST(Incarnations, SequentialWindowsOnOneStore) {
  const int n = 3;
  MemoryStore store;
  std::vector<std::unique_ptr<Communicator>> a(n), b(n);
  runRanks(n, [&](int r) {
    transport::shm::WindowOptions o;
    o.controlBytes = collectives::Communicator::controlBytesFor(n);
    o.slotBytes = 4096;
    o.channelBytes = 4096;
    o.timeout = kLong;
    a[r] = std::make_unique<Communicator>(transport::shm::ShmWindow::create(store, r, n, o));
    b[r] = std::make_unique<Communicator>(transport::shm::ShmWindow::create(store, r, n, o));
  });
  runRanks(n, [&](int r) {
    int32_t x = r + 1, y = 10 * (r + 1);
    collectives::allreduce(*a[r], desc(OpKind::kAllreduce, 1, DataType::kInt32), &x, &x);
    collectives::allreduce(*b[r], desc(OpKind::kAllreduce, 1, DataType::kInt32), &y, &y);
    EXPECT_EQ(x, 6);
    EXPECT_EQ(y, 60);
  });
}

// ---- Point-to-point -----------------------------------------------------------

size_t p2pBytes(int src, int dst, int k) { return ((src * 7 + dst * 3 + k * 13) % 9) * 1000; }
uint8_t p2pByte(int src, int dst, int k, size_t i) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + k * 7 + i);
}

// Every rank sends 48 messages to every other rank (0 to 8000 bytes, the ring
// holds 4 KiB) with distinct tags, posted in a shuffled order; the receivers
// post in another shuffled order, a third of them from any source (the tag
// names the sender). All ops are posted before any completes, so both sides
// need the progress threads.
TEST(P2PStress, ManyTagsShuffledWithAnySource) {
  const int n = 4, k = 48;
  Group g(n, 4096, 4096);
  runRanks(n, [&](int r) {
    auto deadline = Clock::now() + kLong;
    std::mt19937 rng(99 + r);
    struct Msg {
      int peer, k;
      std::vector<uint8_t> buf;
      Completion done;
    };
    std::vector<std::unique_ptr<Msg>> sends, recvs;  // outlive the engine
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      for (int m = 0; m < k; ++m) {
        auto s = std::make_unique<Msg>();
        s->peer = j;
        s->k = m;
        s->buf.resize(p2pBytes(r, j, m));
        for (size_t i = 0; i < s->buf.size(); ++i) s->buf[i] = p2pByte(r, j, m, i);
        sends.push_back(std::move(s));
        auto v = std::make_unique<Msg>();
        v->peer = j;
        v->k = m;
        v->buf.assign(p2pBytes(j, r, m), 0xee);
        recvs.push_back(std::move(v));
      }
    }
    std::shuffle(sends.begin(), sends.end(), rng);
    std::shuffle(recvs.begin(), recvs.end(), rng);
    P2PEngine p2p(g.comms[r]->window());
    // Interleave the posting of sends and receives.
    for (size_t i = 0; i < sends.size(); ++i) {
      Msg& s = *sends[i];
      p2p.postSend(s.peer, s.peer * 1000 + r * 100 + s.k, s.buf.data(), s.buf.size(), deadline,
                   kLong, s.done.done());
      Msg& v = *recvs[i];
      const int src = i % 3 == 0 ? P2PEngine::kAnySource : v.peer;
      p2p.postRecv(src, r * 1000 + v.peer * 100 + v.k, v.buf.data(), v.buf.size(), deadline, kLong,
                   v.done.done());
    }
    for (auto& v : recvs) {
      ASSERT_EQ(v->done.get(), v->peer) << "tag " << v->k;
      for (size_t i = 0; i < v->buf.size(); ++i) {
        ASSERT_EQ(v->buf[i], p2pByte(v->peer, r, v->k, i)) << "from " << v->peer << " k " << v->k;
      }
    }
    for (auto& s : sends) s->done.get();
    // Keep the rings alive until every peer has received everything.
    collectives::barrier(*g.comms[r], barrierDesc());
  });
}

// Messages with the same (source, tag) arrive in sending order; any-source
// receives with one tag shared by all senders see each sender's sequence in
// order too, and every message exactly once.
TEST(P2PStress, SameTagIsNonOvertakingAndAnySourceTakesEachMessageOnce) {
  const int n = 4, perSender = 12, half = perSender / 2;
  // Message m from rank s: 2 ints in the first half when m is even, else 1500
  // ints (6000 bytes, more than the ring); always 1500 in the second half, so
  // that an any-source receive fits whichever sender comes next.
  auto ints = [&](int m) -> size_t { return m < half && m % 2 == 0 ? 2 : 1500; };
  Group g(n, 4096, 4096);
  runRanks(n, [&](int r) {
    std::deque<std::vector<int32_t>> bufs;  // outlive the engine (declared after)
    std::deque<Completion> ops;
    P2PEngine p2p(g.comms[r]->window());
    auto deadline = Clock::now() + kLong;
    if (r != 0) {
      for (int m = 0; m < perSender; ++m) {
        auto& b = bufs.emplace_back(ints(m), r * 100 + m);
        p2p.postSend(0, 42, b.data(), b.size() * 4, deadline, kLong, ops.emplace_back().done());
      }
      for (auto& op : ops) op.get();
    } else {
      std::vector<int> next(n, 0);
      // The first half by source, in order.
      for (int src = 1; src < n; ++src) {
        for (int m = 0; m < half; ++m) {
          auto& got = bufs.emplace_back(ints(m), -1);
          Completion& c = ops.emplace_back();
          p2p.postRecv(src, 42, got.data(), got.size() * 4, deadline, kLong, c.done());
          ASSERT_EQ(c.get(), src);
          ASSERT_EQ(got.front(), src * 100 + m);
          ASSERT_EQ(got.back(), src * 100 + m);
          next[src] = m + 1;
        }
      }
      // The second half from any source: each sender's messages in order.
      for (int k = 0; k < (n - 1) * (perSender - half); ++k) {
        auto& got = bufs.emplace_back(1500, -1);
        Completion& c = ops.emplace_back();
        p2p.postRecv(P2PEngine::kAnySource, 42, got.data(), got.size() * 4, deadline, kLong,
                     c.done());
        int src = c.get();
        ASSERT_GE(src, 1);
        ASSERT_LT(src, n);
        ASSERT_EQ(got.front(), src * 100 + next[src]) << "out of order from rank " << src;
        ASSERT_EQ(got.back(), src * 100 + next[src]);
        ++next[src];
      }
      for (int src = 1; src < n; ++src) EXPECT_EQ(next[src], perSender);
    }
    collectives::barrier(*g.comms[r], barrierDesc());
  });
}

// ---- Timeouts with slow peers ---------------------------------------------------

// A peer that is late but within the timeout changes nothing.
TEST(Timeouts, SlowPeerWithinTheTimeoutGivesCorrectResults) {
  const int n = 3;
  Group g(n, 4096);
  runRanks(n, [&](int r) {
    const size_t count = 5000;  // chunked: 5 chunks, 10 steps
    for (int it = 0; it < 3; ++it) {
      if (r == it) std::this_thread::sleep_for(milliseconds(300));
      std::vector<int32_t> v(count, r + it);
      collectives::allreduce(
          *g.comms[r],
          desc(OpKind::kAllreduce, count, DataType::kInt32, 0, ReduceOp::kSum, milliseconds(10000)),
          v.data(), v.data());
      for (int32_t x : v) ASSERT_EQ(x, 3 + n * it);
    }
  });
}

// Ranks that wait for a peer slower than the timeout fail with the peer's
// rank, within the timeout plus the liveness period plus scheduling slack
// (Note [Timing bounds in tests] in tests/cpp/timing.h).
TEST(Timeouts, PeerSlowerThanTheTimeoutIsNamed) {
  const int n = 3;
  const milliseconds timeout(300);
  Group g(n, 4096);
  std::atomic<int> timedOut{0}, gaveUp{0};
  runRanks(n, [&](int r) {
    const size_t count = 5000;
    std::vector<int32_t> v(count, 1);
    if (r == 2) {
      // Late: after the others gave up (or could have, on a loaded machine),
      // not after a fixed sleep that a slow timeout could outlast.
      const auto until = Clock::now() + testing::timeoutBound(timeout) + milliseconds(1000);
      while (gaveUp.load() < n - 1 && Clock::now() < until) {
        std::this_thread::sleep_for(milliseconds(5));
      }
      // Either outcome is fine for the late rank; it must return in bounded time.
      auto t0 = Clock::now();
      try {
        collectives::allreduce(
            *g.comms[r],
            desc(OpKind::kAllreduce, count, DataType::kInt32, 0, ReduceOp::kSum, timeout),
            v.data(), v.data());
      } catch (const TimeoutError&) {
      }
      EXPECT_TRUE(testing::endedByTimeout(Clock::now() - t0, timeout));
      return;
    }
    auto t0 = Clock::now();
    try {
      collectives::allreduce(
          *g.comms[r],
          desc(OpKind::kAllreduce, count, DataType::kInt32, 0, ReduceOp::kSum, timeout),
          v.data(), v.data());
      ADD_FAILURE() << "rank " << r << " did not time out";
    } catch (const TimeoutError& e) {
      ++timedOut;
      EXPECT_NE(std::string(e.what()).find("Timed out after 300 ms waiting for rank(s) [2]"),
                std::string::npos)
          << e.what();
    }
    ++gaveUp;
    EXPECT_TRUE(testing::timedOut(Clock::now() - t0, timeout)) << "rank " << r;
  });
  EXPECT_EQ(timedOut.load(), 2);
}

// A receive that times out is withdrawn: the late message is kept as
// unexpected and goes to the next matching receive, intact.
TEST(Timeouts, RecvTimesOutAndTheLateMessageGoesToTheNextRecv) {
  const int n = 2;
  const milliseconds timeout(200);
  Group g(n, 4096, 4096);
  std::atomic<bool> timedOut{false};
  runRanks(n, [&](int r) {
    std::vector<int32_t> buf(3000), got(3000, -1);  // 12000 bytes: three rings' worth
    Completion first, second;
    P2PEngine p2p(g.comms[r]->window());
    if (r == 1) {
      // Late: after rank 0's receive gave up, however long a loaded machine
      // took to fire its timeout (a bounded wait: rank 0 checks the bound).
      const auto until = Clock::now() + testing::timeoutBound(timeout) + milliseconds(1000);
      while (!timedOut.load() && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = int32_t(i * 3 + 1);
      p2p.postSend(0, 5, buf.data(), buf.size() * 4, Clock::now() + kLong, kLong, first.done());
      first.get();
    } else {
      auto t0 = Clock::now();
      p2p.postRecv(1, 5, buf.data(), buf.size() * 4, t0 + timeout, timeout, first.done());
      try {
        first.get();
        ADD_FAILURE() << "the receive did not time out";
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("Timed out after 200 ms waiting for rank 1 (tag 5)"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_TRUE(testing::timedOut(Clock::now() - t0, timeout));
      timedOut = true;
      p2p.postRecv(1, 5, got.data(), got.size() * 4, Clock::now() + kLong, kLong, second.done());
      ASSERT_EQ(second.get(), 1);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], int32_t(i * 3 + 1)) << i;
    }
    collectives::barrier(*g.comms[r], barrierDesc());
  });
}

// ---- Shutdown while waiting -------------------------------------------------------

// Window::abort from another thread ends a wait at once (long before the
// timeout) with PeerLostError, for a first step and for a later one.
TEST(Shutdown, AbortWakesWaitersInEveryStep) {
  const int n = 3;
  for (int variant = 0; variant < 2; ++variant) {
    Group g(n, 4096);
    std::atomic<int> waiting{0};
    std::vector<std::string> errors(n);
    std::thread aborter([&] {
      while (waiting.load() < n - 1) std::this_thread::sleep_for(milliseconds(5));
      std::this_thread::sleep_for(milliseconds(200));
      for (int r = 0; r < n - 1; ++r) g.comms[r]->window().abort();
      g.comms[0]->window().abort();  // idempotent
    });
    std::exception_ptr failed;
    try {
      runRanks(n, [&](int r) {
        if (variant == 1) {
          // One chunked allreduce that everyone finishes, so the next wait is
          // for a step other than the first.
          std::vector<int32_t> v(3000, r);
          collectives::allreduce(*g.comms[r], desc(OpKind::kAllreduce, 3000, DataType::kInt32),
                                 v.data(), v.data());
          for (int32_t x : v) ASSERT_EQ(x, n * (n - 1) / 2);
        }
        if (r == n - 1) return;  // never joins the barrier
        ++waiting;
        auto t0 = Clock::now();
        try {
          collectives::barrier(*g.comms[r], barrierDesc());
          ADD_FAILURE() << "barrier returned on rank " << r;
        } catch (const PeerLostError& e) {
          errors[r] = e.what();
        }
        EXPECT_TRUE(testing::endedEarly(Clock::now() - t0, kLong)) << "abort did not wake rank "
                                                                    << r;
      });
    } catch (...) {
      failed = std::current_exception();
      waiting = n;  // let the aborter finish
    }
    aborter.join();
    if (failed) std::rethrow_exception(failed);
    for (int r = 0; r < n - 1; ++r) {
      EXPECT_NE(errors[r].find("the group was shut down while op #"), std::string::npos)
          << errors[r];
    }
  }
}

// After abort, every later wait fails immediately too.
TEST(Shutdown, WaitsAfterAbortFailAtOnce) {
  Group g(2, 4096);
  g.comms[0]->window().abort();
  auto t0 = Clock::now();
  EXPECT_THROW(collectives::barrier(*g.comms[0], barrierDesc()), PeerLostError);
  EXPECT_TRUE(testing::endedEarly(Clock::now() - t0, kLong));
}

// A peer that closes its window (the backend's shutdown, or a destroyed
// group) fails the ranks waiting for it with its rank, not with a timeout.
// Ranks 0 and 1 of 3 enter a barrier; 200 ms later rank 2 runs `leave`
// instead. The barrier fails on ranks 0 and 1 with a PeerLostError holding
// `expect`, well before its timeout (Note [Timing bounds in tests] in
// tests/cpp/timing.h).
void barrierFailsWhenRank2Leaves(Group& g, const std::function<void()>& leave,
                                 const std::string& expect) {
  runRanks(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(milliseconds(200));
      leave();
      return;
    }
    auto t0 = Clock::now();
    try {
      collectives::barrier(*g.comms[r], barrierDesc());
      ADD_FAILURE() << "barrier returned on rank " << r;
    } catch (const PeerLostError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
    EXPECT_TRUE(testing::endedEarly(Clock::now() - t0, kLong)) << "rank " << r;
  });
}

TEST(Shutdown, PeerLeavingFailsWaitersFast) {
  Group g(3, 4096);
  barrierFailsWhenRank2Leaves(
      g, [&] { g.comms[2].reset(); },  // ~ShmWindow marks the rank closed
      "rank 2 left the group");
}

// Note [A rank that gives up]: a rank that marks its group broken (its op
// failed because of someone else) fails its peers' waits on it at once, with
// its reason, not at their deadline naming it. Its later ops fail too.
TEST(Shutdown, ARankThatGivesUpFailsWaitersAtOnceWithItsReason) {
  Group g(3, 4096);
  const std::string why = "braid allreduce (rank 2): lost rank 7 on host 'far'";
  barrierFailsWhenRank2Leaves(
      g,
      [&] {
        g.comms[2]->markBroken(why);
        EXPECT_THROW(collectives::barrier(*g.comms[2], barrierDesc()), Error);
      },
      "rank 2 gave up on the group after an error: " + why);
}

// Shutting the p2p engine down completes every pending send and receive
// with an error (none is lost, none hangs), and later posts throw.
TEST(Shutdown, P2PShutdownFailsPendingOps) {
  Group g(2, 4096, 4096);
  // Rank 1 never starts an engine: rank 0's send fills the ring and stalls.
  std::vector<uint8_t> big(100000, 7), in(64);
  Completion send, recv, late;
  P2PEngine p2p(g.comms[0]->window());
  p2p.postSend(1, 1, big.data(), big.size(), Clock::now() + kLong, kLong, send.done());
  p2p.postRecv(1, 1, in.data(), in.size(), Clock::now() + kLong, kLong, recv.done());
  std::this_thread::sleep_for(milliseconds(100));
  p2p.shutdown();
  for (Completion* c : {&send, &recv}) {
    try {
      c->get(milliseconds(5000));
      ADD_FAILURE() << "a pending op succeeded after shutdown";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the group was shut down"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(p2p.postRecv(1, 1, in.data(), in.size(), Clock::now() + kLong, kLong, late.done()),
               Error);
  p2p.shutdown();  // idempotent
}

// ---- P2P failures in the middle of a message (Note [Started messages] in p2p_engine.cc) -------

// A send that times out after part of it entered the ring is dropped from
// the queue mid-message; the next message's frame then lands inside the
// previous payload and the stream to that peer is unframed from then on.
// The receiver starts its engine late, as the backend does (p2p() starts on
// first use).
TEST(P2PRecovery, SendTimingOutMidMessageKeepsTheStreamFramed) {
  Group g(2, 4096, 4096);
  std::vector<int32_t> big(16384, 3), small(4, 9), got(4, -1);
  Completion s1, s2, r2;
  auto sender = std::make_unique<P2PEngine>(g.comms[1]->window());
  sender->postSend(0, 1, big.data(), big.size() * 4, Clock::now() + milliseconds(150),
                   milliseconds(150), s1.done());
  EXPECT_THROW(s1.get(milliseconds(5000)), TimeoutError);  // rank 0 is not reading yet
  sender->postSend(0, 2, small.data(), small.size() * 4, Clock::now() + kLong, kLong, s2.done());
  P2PEngine receiver(g.comms[0]->window());
  receiver.postRecv(1, 2, got.data(), got.size() * 4, Clock::now() + milliseconds(3000),
                    milliseconds(3000), r2.done());
  EXPECT_EQ(r2.get(milliseconds(6000)), 1);  // the half-sent message must not swallow it
  EXPECT_EQ(got, small);
  s2.get(milliseconds(6000));
}

// The same, followed by a large message: the receiver then parses payload
// bytes as a frame header, BRAID_ENFORCE throws on the progress thread, and
// nothing catches it there: std::terminate ends the process. Runs in a child.
[[noreturn]] void sendAfterAHalfSentMessage() {
  alarm(20);
  Group g(2, 4096, 4096);
  std::vector<int32_t> big(16384, 3), small(4, 9), got(4, -1), got3(16384, -1);
  Completion s1, s2, s3, r2, r3;
  bool failed = false;
  {
    P2PEngine sender(g.comms[1]->window());
    sender.postSend(0, 1, big.data(), big.size() * 4, Clock::now() + milliseconds(150),
                    milliseconds(150), s1.done());
    try {
      s1.get(milliseconds(5000));
    } catch (const TimeoutError&) {
    }
    sender.postSend(0, 2, small.data(), small.size() * 4, Clock::now() + kLong, kLong, s2.done());
    sender.postSend(0, 3, big.data(), big.size() * 4, Clock::now() + kLong, kLong, s3.done());
    P2PEngine receiver(g.comms[0]->window());
    receiver.postRecv(1, 2, got.data(), got.size() * 4, Clock::now() + milliseconds(3000),
                      milliseconds(3000), r2.done());
    receiver.postRecv(1, 3, got3.data(), got3.size() * 4, Clock::now() + milliseconds(3000),
                      milliseconds(3000), r3.done());
    try {
      r2.get(milliseconds(6000));
      r3.get(milliseconds(6000));
    } catch (const Error&) {
      failed = true;
    }
  }
  std::exit(failed ? 3 : got == small && got3 == big ? 0 : 4);
}

TEST(P2PRecovery, SendsAfterAHalfSentMessageArriveIntact) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(sendAfterAHalfSentMessage(), ::testing::ExitedWithCode(0), "");
}

// Any exception on the progress thread (a corrupt frame, as above; a
// throwing callback; bad_alloc for a huge frame) ends the process, because
// loop() has no handler. It should fail the pending ops instead.
[[noreturn]] void corruptFrame() {
  alarm(20);
  Group g(2, 4096, 4096);
  int32_t x = 0;
  Completion r;
  int code = 3;  // the receive succeeded
  {
    P2PEngine receiver(g.comms[0]->window());
    receiver.postRecv(1, 1, &x, 4, Clock::now() + kLong, kLong, r.done());
    uint8_t garbage[24];  // a whole frame header's worth (magic, reserved, tag, bytes)
    for (int i = 0; i < 24; ++i) garbage[i] = static_cast<uint8_t>(i + 1);
    g.comms[1]->window().to(0).write(garbage, sizeof(garbage));
    g.comms[1]->window().notifyActivity();
    try {
      r.get(milliseconds(5000));
    } catch (const Error& e) {
      code = std::string(e.what()).find("corrupt message from rank 1") != std::string::npos ? 0 : 4;
    }
  }
  std::exit(code);
}

TEST(P2PRecovery, CorruptFrameFailsTheOpsNotTheProcess) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(corruptFrame(), ::testing::ExitedWithCode(0), "");
}

// A receive matched to a message whose sender leaves mid-message never
// completes: failExpired skips matched receives for both the deadline and
// peerGone.
TEST(P2PRecovery, RecvOfAPartialMessageFailsWhenTheSenderLeaves) {
  Group g(2, 4096, 4096);
  std::vector<int32_t> big(16384, 3), got(16384, -1);
  Completion s1, r1;
  auto sender = std::make_unique<P2PEngine>(g.comms[1]->window());
  // The receiver's engine is not running: the send stalls after one ring.
  sender->postSend(0, 1, big.data(), big.size() * 4, Clock::now() + kLong, kLong, s1.done());
  std::this_thread::sleep_for(milliseconds(200));
  sender.reset();  // fails s1; the ring holds the frame and 4080 payload bytes
  EXPECT_THROW(s1.get(milliseconds(5000)), Error);
  g.comms[1].reset();  // rank 1 leaves the group
  P2PEngine receiver(g.comms[0]->window());
  receiver.postRecv(1, 1, got.data(), got.size() * 4, Clock::now() + milliseconds(500),
                    milliseconds(500), r1.done());
  EXPECT_THROW(r1.get(milliseconds(5000)), Error);  // not only at shutdown
}

// A receive that matches a message which arrived before it was posted
// completes inside the progress thread's critical section (loop() ->
// matchUnexpected -> complete, under mu_). A callback that posts the next op
// (a reply; c10d runs Future callbacks inline) then locks mu_ again:
// self-deadlock, and every p2p op of the group hangs. Runs in a child
// process with an alarm, so that the deadlock fails the test instead of
// hanging it.
// Rank 0 answers rank 1's message from the receive's callback; exits 0 when
// the answer arrives.
[[noreturn]] void replyFromACallback() {
  alarm(10);  // a deadlock kills the process: the test fails instead of hanging
  Group g(2, 4096, 4096);
  int32_t ping = 41, got = 0, pong = 0, back = 0;
  Completion sent, reply, replied;
  {
    P2PEngine e1(g.comms[1]->window());
    P2PEngine e0(g.comms[0]->window());
    e1.postSend(0, 1, &ping, 4, Clock::now() + kLong, kLong, sent.done());
    sent.get();
    std::this_thread::sleep_for(milliseconds(200));  // rank 0 buffers it as unexpected
    e0.postRecv(1, 1, &got, 4, Clock::now() + kLong, kLong, [&](std::exception_ptr, int) {
      pong = got + 1;
      e0.postSend(1, 2, &pong, 4, Clock::now() + kLong, kLong, reply.done());
    });
    e1.postRecv(0, 2, &back, 4, Clock::now() + kLong, kLong, replied.done());
    replied.get();
  }
  std::exit(back == 42 ? 0 : 3);
}

TEST(P2PRecovery, CallbackOfAnUnexpectedMatchMayPostTheNextOp) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(replyFromACallback(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace braid
