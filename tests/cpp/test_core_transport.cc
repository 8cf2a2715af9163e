// The message Transport's contract (transport/transport.h), checked alike on
// both implementations: shared memory (transport/shm/transport.h; through
// the rings, and with every message read in place) and TCP over loopback
// (transport/tcp/transport.h), threads as ranks; and on their composition by
// host (transport/routed.h), with the ranks dealt to two pretend hosts in
// turn, so that every test crosses both. What only one
// of them has (authentication, framing, striping) is tested in
// test_core_tcp.cc and test_core_tcp_faults.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core_group.h"
#include "machine_skip.h"
#include "own_mount_ns.h"
#include "tcp_group.h"
#include "transport/routed.h"
#include "transport/shm/transport.h"

namespace braid {
namespace {

using testing::after;
using testing::patterned;
using testing::runRanks;
using transport::Request;
using transport::Transport;

constexpr int kWaitMs = 10000;

transport::shm::WindowOptions smallRings() {
  transport::shm::WindowOptions w;
  w.channelBytes = 64 << 10;  // small: large messages wrap the ring many times
  return w;
}

// Rank r on pretend host r % 2: shared memory among each host's ranks, TCP
// between the hosts (Note [Routing by host]). Messages of 4 KiB and more
// between ranks of a host are read in place (Note [Messages read in place]).
std::vector<std::unique_ptr<Transport>> connectRouted(int n) {
  std::vector<int> hosts[2];
  for (int r = 0; r < n; ++r) hosts[r % 2].push_back(r);
  testing::MemoryStore stores[2], tcpStore;
  std::vector<std::unique_ptr<Transport>> ts(n);
  const auto o = testing::tcpOptions("routed", 2);
  runRanks(n, [&](int r) {
    auto w = smallRings();
    w.logRank = r;
    w.directMin = 4096;
    for (int p : hosts[r % 2]) w.peerNames.push_back("rank " + std::to_string(p));
    auto local = transport::shm::connect(stores[r % 2], r / 2, hosts[r % 2].size(), w);
    auto t = o;
    t.skip.assign(n, false);
    for (int p : hosts[r % 2]) t.skip[p] = p != r;
    auto remote = transport::tcp::connect(tcpStore, r, n, t);
    ts[r] = std::make_unique<transport::RoutedTransport>(r, n, hosts[r % 2], std::move(local),
                                                         std::move(remote));
  });
  return ts;
}

std::vector<std::unique_ptr<Transport>> connectAll(const std::string& kind, int n) {
  if (kind == "tcp") {
    auto o = testing::tcpOptions("contract", 2);
    return testing::connectGroup(n, [o](int) { return o; });
  }
  if (kind == "routed") return connectRouted(n);
  testing::MemoryStore store;
  std::vector<std::unique_ptr<Transport>> ts(n);
  auto w = smallRings();
  if (kind == "shm_direct") w.directMin = 1;  // every message but empty ones read in place
  runRanks(n, [&](int r) { ts[r] = transport::shm::connect(store, r, n, w); });
  return ts;
}

class TransportContract : public ::testing::TestWithParam<std::string> {};

TEST_P(TransportContract, EverySizeBetweenEveryPairAndToItself) {
  const std::vector<size_t> sizes = {0, 1, 7, (64 << 10) - 1, (64 << 10) + 1, (1 << 20) + 3};
  for (int n : {1, 2, 3, 5}) {
    SCOPED_TRACE(GetParam() + ", world size " + std::to_string(n));
    auto ts = connectAll(GetParam(), n);
    runRanks(n, [&](int me) {
      std::vector<std::vector<uint8_t>> out, in;
      std::vector<std::shared_ptr<Request>> reqs;
      out.reserve(n * sizes.size());
      in.reserve(n * sizes.size());
      for (int peer = 0; peer < n; ++peer) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          in.emplace_back(sizes[k], 0xEE);
          reqs.push_back(ts[me]->irecv(peer, k, in.back().data(), sizes[k]));
          out.push_back(patterned(me, peer, k, sizes[k]));
          reqs.push_back(ts[me]->isend(peer, k, out.back().data(), sizes[k]));
        }
      }
      for (auto& r : reqs) r->wait(after(kWaitMs));
      size_t i = 0;
      for (int peer = 0; peer < n; ++peer) {
        for (size_t k = 0; k < sizes.size(); ++k, ++i) {
          EXPECT_TRUE(in[i] == patterned(peer, me, k, sizes[k]))
              << "rank " << me << " from " << peer << " size " << sizes[k];
        }
      }
    });
    for (auto& t : ts) t->close();
  }
}

// A message goes to the first unmatched receive with its tag; messages with
// one tag match in the order they were sent; 64-bit tags keep all their bits.
TEST_P(TransportContract, TagsMatchInAnyOrderAndOneTagInSendOrder) {
  auto ts = connectAll(GetParam(), 2);
  const std::vector<uint64_t> tags = {7, 7, uint64_t{1} << 40, (uint64_t{1} << 40) + 7, 3, 7};
  std::vector<std::vector<uint8_t>> out, in(tags.size(), std::vector<uint8_t>(33));
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t k = 0; k < tags.size(); ++k) {
    out.push_back(patterned(0, 1, k, 33));
    reqs.push_back(ts[0]->isend(1, tags[k], out[k].data(), 33));
  }
  for (size_t k = tags.size(); k-- > 0;) {  // posted in reverse
    reqs.push_back(ts[1]->irecv(0, tags[k], in[k].data(), 33));
  }
  for (auto& r : reqs) r->wait(after(kWaitMs));
  // Receives with tag 7 were posted as k = 5, 1, 0: they get the messages
  // sent as k = 0, 1, 5 in that order.
  EXPECT_TRUE(in[5] == out[0]);
  EXPECT_TRUE(in[1] == out[1]);
  EXPECT_TRUE(in[0] == out[5]);
  for (size_t k : {2, 3, 4}) EXPECT_TRUE(in[k] == out[k]) << "tag " << tags[k];
  for (auto& t : ts) t->close();
}

TEST_P(TransportContract, SizeMismatchFailsTheReceiveNamingBothSizesAndThePairGoesOn) {
  auto ts = connectAll(GetParam(), 2);
  auto big = patterned(0, 1, 5, 200000), ok = patterned(0, 1, 6, 10);
  auto s1 = ts[0]->isend(1, 5, big.data(), big.size());
  auto s2 = ts[0]->isend(1, 6, ok.data(), ok.size());
  std::vector<uint8_t> small(100), in(10);
  try {
    ts[1]->irecv(0, 5, small.data(), small.size())->wait(after(kWaitMs));
    FAIL() << "expected a size mismatch";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("200000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("100 bytes"), std::string::npos) << m;
    // TCP names the peer's address too (transport.h: "rank 3 at 10.0.0.2:41234").
    const char* peer = GetParam() == "tcp" ? "rank 0 at 127.0.0.1:" : "rank 0";
    EXPECT_NE(m.find(peer), std::string::npos) << m;
  }
  ts[1]->irecv(0, 6, in.data(), in.size())->wait(after(kWaitMs));
  EXPECT_TRUE(in == ok);
  s1->wait(after(kWaitMs));
  s2->wait(after(kWaitMs));
  for (auto& t : ts) t->close();
}

// A peer that leaves fails the ops pending with it (PeerLostError naming it);
// abort fails what is pending and what comes later, with its reason.
TEST_P(TransportContract, APeerLeavingAndAnAbortFailPendingAndLaterOps) {
  auto ts = connectAll(GetParam(), 3);
  std::vector<uint8_t> buf(64);
  auto fromGone = ts[0]->irecv(2, 1, buf.data(), buf.size());
  ts[2]->close();
  try {
    fromGone->wait(after(kWaitMs));
    FAIL() << "a receive from a rank that left completed";
  } catch (const PeerLostError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 2"), std::string::npos) << m;
  }
  std::vector<uint8_t> buf1(64);
  auto pending = ts[1]->irecv(0, 9, buf1.data(), buf1.size());
  ts[1]->abort("the test gave up");
  auto later = ts[1]->isend(0, 9, buf1.data(), buf1.size());
  for (auto* r : {&pending, &later}) {
    try {
      (*r)->wait(after(kWaitMs));
      FAIL() << "an op of an aborted transport completed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the test gave up"), std::string::npos) << e.what();
    }
  }
  for (auto& t : ts) t->close();
}

// Callbacks run once each, and may post the next op (here: an echo server
// that lives entirely in rank 1's receive callbacks).
TEST_P(TransportContract, CallbacksRunOnceAndMayPostTheNextOp) {
  auto ts = connectAll(GetParam(), 2);
  const int kRounds = 200;
  std::vector<uint8_t> ball(16, 0), got(16, 0);
  std::atomic<int> calls{0};
  // Rank 1 echoes every message back from inside its receive callback.
  std::function<void(int)> echo = [&](int round) {
    ts[1]->irecv(0, round, got.data(), got.size(), [&, round](std::exception_ptr e) {
      ASSERT_FALSE(e);
      ++calls;
      ts[1]->isend(0, round, got.data(), got.size());
      if (round + 1 < kRounds) echo(round + 1);
    });
  };
  echo(0);
  for (int round = 0; round < kRounds; ++round) {
    ball.assign(16, static_cast<uint8_t>(round));
    std::vector<uint8_t> back(16);
    auto r = ts[0]->irecv(1, round, back.data(), back.size());
    ts[0]->isend(1, round, ball.data(), ball.size())->wait(after(kWaitMs));
    r->wait(after(kWaitMs));
    ASSERT_TRUE(back == ball) << "round " << round;
  }
  EXPECT_EQ(calls.load(), kRounds);
  for (auto& t : ts) t->close();
}

// Each peer is reached one way: this host's ranks through shared memory,
// which TCP never connects (and refuses to be asked for), the others
// through TCP.
TEST(RoutedTransport, ReachesThisHostThroughSharedMemoryAndOtherHostsThroughTcp) {
  const int n = 4;
  const int fdsBefore = testing::countFds();
  auto ts = connectRouted(n);
  EXPECT_NE(ts[0]->peerName(2).find("shared memory"), std::string::npos) << ts[0]->peerName(2);
  EXPECT_NE(ts[0]->peerName(1).find("127.0.0.1"), std::string::npos) << ts[0]->peerName(1);
  EXPECT_NE(ts[3]->peerName(1).find("rank 1 (shared memory)"), std::string::npos)
      << ts[3]->peerName(1);
  // Sockets: 2 per pair of ranks on different hosts (4 pairs), 1 listener
  // and one epoll and eventfd each; none between ranks 0 and 2 or 1 and 3.
  const int tcpFds = 2 * 2 * 4 + 3 * n;
  const int fdsNow = testing::countFds() - fdsBefore;
  EXPECT_GE(fdsNow, tcpFds);
  EXPECT_LT(fdsNow, tcpFds + 2 * 2 * 2) << "TCP connected ranks of one host";
  // A bad rank is the caller's error, named there.
  std::vector<uint8_t> buf(8);
  try {
    ts[1]->isend(4, 0, buf.data(), buf.size());
    FAIL() << "a send to rank 4 of 4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("peer rank 4 is not in the group of 4"),
              std::string::npos) << e.what();
  }
  for (auto& t : ts) t->close();
}

// Note [Messages read in place]: such a send completes when its receive has
// read it, not before; it fails, and never leaves a receive with bytes read
// from a buffer handed back, when either side leaves first.
TEST(ShmDirect, ASendWaitsForItsReceiveAndFailsWhenEitherSideLeaves) {
  auto ts = connectAll("shm_direct", 3);
  auto msg = patterned(0, 1, 1, 100000);
  auto sent = ts[0]->isend(1, 1, msg.data(), msg.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(sent->test()) << "a send read in place completed before its receive was posted";
  std::vector<uint8_t> in(msg.size());
  ts[1]->irecv(0, 1, in.data(), in.size())->wait(after(kWaitMs));
  sent->wait(after(kWaitMs));
  EXPECT_TRUE(in == msg);

  // The receiver leaves: the send fails, naming it.
  auto toGone = ts[0]->isend(2, 2, msg.data(), msg.size());
  ts[2]->close();
  try {
    toGone->wait(after(kWaitMs));
    FAIL() << "a send to a rank that left completed";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  // The sender leaves before its message is received: the receive fails.
  auto fromGone = ts[0]->isend(1, 3, msg.data(), msg.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its frame is in rank 1's hands
  ts[0]->close();
  EXPECT_THROW(fromGone->wait(after(kWaitMs)), Error);
  try {
    ts[1]->irecv(0, 3, in.data(), in.size())->wait(after(kWaitMs));
    FAIL() << "a receive read a message whose sender had left";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  for (auto& t : ts) t->close();
}

// Note [Ring size]: 1 MiB up to 17 ranks, then 16 MiB over the peers (in
// pages), never below 256 KiB.
TEST(ShmRings, DefaultSizeFollowsTheGroupSize) {
  using transport::shm::defaultChannelBytes;
  EXPECT_EQ(defaultChannelBytes(1), size_t{1} << 20);
  EXPECT_EQ(defaultChannelBytes(2), size_t{1} << 20);
  EXPECT_EQ(defaultChannelBytes(17), size_t{1} << 20);
  EXPECT_EQ(defaultChannelBytes(18), (size_t{16} << 20) / 17 / 4096 * 4096);  // 984 KiB
  EXPECT_EQ(defaultChannelBytes(33), size_t{512} << 10);
  EXPECT_EQ(defaultChannelBytes(65), size_t{256} << 10);
  EXPECT_EQ(defaultChannelBytes(1000), size_t{256} << 10);
}

// Note [Reserved shared memory]: with too little room in /dev/shm, making a
// window fails on every rank naming the room, and a ring's first message
// fails its send; nothing raises SIGBUS. The cases run in a child process
// that has a 3 MiB /dev/shm of its own (a mount namespace; needs root): it
// runs this binary again with ShmRoom.Inside alone.
TEST(ShmRoom, AFullDevShmFailsCleanly) {
  auto run = testing::inOwnMountNamespace("3m", [] {
    setenv("BRAID_TEST_SMALL_SHM", "1", 1);
    execl("/proc/self/exe", "test_core_transport", "--gtest_filter=ShmRoom.Inside", nullptr);
    std::perror("execl");
    _exit(1);
  });
  if (!run) BRAID_MACHINE_SKIP("cannot mount a /dev/shm of its own here (needs root)");
  EXPECT_TRUE(WIFEXITED(run->status) && WEXITSTATUS(run->status) == 0) << run->out;
  EXPECT_NE(run->out.find("[  PASSED  ] 1 test"), std::string::npos) << run->out;
  EXPECT_EQ(run->out.find("SKIPPED"), std::string::npos) << run->out;
}

TEST(ShmRoom, Inside) {
  if (!getenv("BRAID_TEST_SMALL_SHM")) GTEST_SKIP() << "runs in ShmRoom.AFullDevShmFailsCleanly";
  // Two ranks with 1 MiB slots need 2 MiB each for their slots alone.
  {
    testing::MemoryStore store;
    std::vector<std::string> errors(2);
    runRanks(2, [&](int r) {
      transport::shm::WindowOptions w;
      w.slotBytes = 1 << 20;
      w.timeout = std::chrono::milliseconds(20000);
      try {
        transport::shm::connect(store, r, 2, w);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
    int reserved = 0;
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(errors[r]);
      EXPECT_NE(errors[r].find("braid init (rank " + std::to_string(r) + ")"), std::string::npos);
      if (errors[r].find("cannot reserve") != std::string::npos) {
        ++reserved;
        EXPECT_NE(errors[r].find("this rank's slots"), std::string::npos);
        EXPECT_NE(errors[r].find("/dev/shm has"), std::string::npos);
        EXPECT_NE(errors[r].find("--shm-size"), std::string::npos);
      } else {
        EXPECT_NE(errors[r].find("could not make its shared memory"), std::string::npos);
      }
    }
    EXPECT_GE(reserved, 1);
  }
  // Small slots fit; the first 2 MiB ring fits, the second does not.
  testing::MemoryStore store;
  std::vector<std::unique_ptr<Transport>> ts(2);
  runRanks(2, [&](int r) {
    transport::shm::WindowOptions w;
    w.slotBytes = 64 << 10;
    w.channelBytes = 2 << 20;
    w.peerNames = {"rank 0", "rank 1"};
    ts[r] = transport::shm::connect(store, r, 2, w);
  });
  auto msg = patterned(0, 1, 5, 64 << 10);
  std::vector<uint8_t> got(msg.size());
  auto rq = ts[1]->irecv(0, 5, got.data(), got.size(), nullptr);
  ts[0]->isend(1, 5, msg.data(), msg.size(), nullptr)->wait(after(kWaitMs));
  rq->wait(after(kWaitMs));
  EXPECT_EQ(got, msg);
  try {
    ts[1]->isend(0, 6, msg.data(), msg.size(), nullptr)->wait(after(kWaitMs));
    ADD_FAILURE() << "a send whose ring has no room did not fail";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot reserve 2.0 MiB of shared memory for the ring to rank 0"),
              std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
  }
  for (auto& t : ts) t->close();
}

TEST(RoutedTransport, TcpRefusesPeersItSkips) {
  testing::MemoryStore store;
  std::vector<std::unique_ptr<Transport>> ts(3);
  auto o = testing::tcpOptions("skip", 1);
  runRanks(3, [&](int r) {
    auto t = o;
    t.skip = {false, r == 2, r == 1};  // ranks 1 and 2 skip each other
    ts[r] = transport::tcp::connect(store, r, 3, t);
  });
  std::vector<uint8_t> buf(8);
  try {
    ts[1]->isend(2, 0, buf.data(), buf.size());
    FAIL() << "TCP accepted a send to a rank it skips";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reached through shared memory"), std::string::npos)
        << e.what();
  }
  auto r = ts[2]->irecv(0, 5, buf.data(), buf.size());
  std::vector<uint8_t> msg(8, 7);
  ts[0]->isend(2, 5, msg.data(), msg.size())->wait(after(kWaitMs));
  r->wait(after(kWaitMs));
  EXPECT_EQ(buf, msg);
  for (auto& t : ts) t->close();
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, TransportContract,
                         ::testing::Values("shm", "shm_direct", "tcp", "routed"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace braid
