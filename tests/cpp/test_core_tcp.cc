// The TCP transport (csrc/transport/tcp) with threads as ranks over loopback:
// messages of every awkward size between every pair, striped over several
// sockets and checked byte for byte; tag matching; authentication failures;
// strangers; peers that vanish; abort; and no leaked fds or threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <thread>

#include "common/settings.h"
#include "transport/tcp/frame.h"

#include "tcp_group.h"
#include "timing.h"

namespace braid {
namespace {

using testing::after;
using testing::connectGroup;
using testing::patterned;
using testing::tcpOptions;
using transport::Request;
using transport::tcp::ConnectMode;
using transport::tcp::TcpOptions;

constexpr int kWaitMs = 10000;

// Every rank sends one message of each size to every rank (itself included)
// and checks what it receives.
void exchangeAll(std::vector<std::unique_ptr<transport::Transport>>& ts,
                 const std::vector<size_t>& sizes) {
  const int n = static_cast<int>(ts.size());
  testing::runRanks(n, [&](int me) {
    auto& t = *ts[me];
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<std::shared_ptr<Request>> reqs;
    for (int peer = 0; peer < n; ++peer) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        in.emplace_back(sizes[k], 0xEE);
        reqs.push_back(t.irecv(peer, k, in.back().data(), sizes[k]));
        out.push_back(patterned(me, peer, k, sizes[k]));
        reqs.push_back(t.isend(peer, k, out.back().data(), sizes[k]));
      }
    }
    for (auto& r : reqs) r->wait(after(kWaitMs));
    size_t i = 0;
    for (int peer = 0; peer < n; ++peer) {
      for (size_t k = 0; k < sizes.size(); ++k, ++i) {
        ASSERT_TRUE(in[i] == patterned(peer, me, k, sizes[k]))
            << "rank " << me << " from " << peer << " size " << sizes[k];
      }
    }
  });
}

TEST(TcpTransport, EverySizeBetweenEveryPair) {
  const std::vector<size_t> sizes = {0, 1, 7, (64 << 10) - 1, 64 << 10, (64 << 10) + 1,
                                     (3 << 20) + 5};
  for (int n : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto o = tcpOptions("sizes", n == 3 ? 3 : 2);
    auto ts = connectGroup(n, [&](int) { return o; });
    exchangeAll(ts, sizes);
    for (auto& t : ts) t->close();
  }
}

TEST(TcpTransport, LazyConnectWithBothSidesDialing) {
  auto o = tcpOptions("lazy", 3);
  o.connect = ConnectMode::kLazy;
  auto ts = connectGroup(4, [&](int) { return o; });
  exchangeAll(ts, {0, 5, (1 << 20) + 3});
  exchangeAll(ts, {100});
}

TEST(TcpTransport, TagsMatchInAnyOrderAndSameTagInSendOrder) {
  auto ts = connectGroup(2, [o = tcpOptions("tags")](int) { return o; });
  const int kMsgs = 12;
  std::vector<std::vector<uint8_t>> out;
  for (int k = 0; k < kMsgs; ++k) out.push_back(patterned(0, 1, k, 1000 + 40000 * k));
  // Two messages with tag 99: the first receive gets the first one.
  auto a = patterned(0, 1, 1001, 300), b = patterned(0, 1, 1002, 300);
  std::vector<std::shared_ptr<Request>> sends;
  for (int k = 0; k < kMsgs; ++k) sends.push_back(ts[0]->isend(1, k, out[k].data(), out[k].size()));
  sends.push_back(ts[0]->isend(1, 99, a.data(), a.size()));
  sends.push_back(ts[0]->isend(1, 99, b.data(), b.size()));
  // Unexpected at the receiver: every send completes before any receive.
  for (auto& s : sends) s->wait(after(kWaitMs));
  std::vector<std::vector<uint8_t>> in(kMsgs);
  std::vector<std::shared_ptr<Request>> recvs;
  for (int k = kMsgs - 1; k >= 0; --k) {
    in[k].resize(out[k].size());
    recvs.push_back(ts[1]->irecv(0, k, in[k].data(), in[k].size()));
  }
  std::vector<uint8_t> first(300), second(300);
  ts[1]->irecv(0, 99, first.data(), 300)->wait(after(kWaitMs));
  ts[1]->irecv(0, 99, second.data(), 300)->wait(after(kWaitMs));
  for (auto& r : recvs) r->wait(after(kWaitMs));
  for (int k = 0; k < kMsgs; ++k) EXPECT_TRUE(in[k] == out[k]) << "tag " << k;
  EXPECT_TRUE(first == a);
  EXPECT_TRUE(second == b);
}

TEST(TcpTransport, ReceivesBeyondTheBufferBudgetWaitForTheirReceive) {
  // 1 MiB of room for unexpected messages, four of 1 MiB, received in reverse:
  // later messages wait on their sockets until their receives are posted.
  auto o = tcpOptions("budget");
  o.maxUnexpectedBytes = 1 << 20;
  auto ts = connectGroup(2, [&](int) { return o; });
  std::vector<std::vector<uint8_t>> out, in(4, std::vector<uint8_t>(1 << 20));
  std::vector<std::shared_ptr<Request>> reqs;
  for (int k = 0; k < 4; ++k) out.push_back(patterned(0, 1, k, 1 << 20));
  for (int k = 0; k < 4; ++k) reqs.push_back(ts[0]->isend(1, k, out[k].data(), 1 << 20));
  for (int k = 3; k >= 0; --k) reqs.push_back(ts[1]->irecv(0, k, in[k].data(), 1 << 20));
  for (auto& r : reqs) r->wait(after(kWaitMs));
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(in[k] == out[k]) << "tag " << k;
}

TEST(TcpTransport, AReceivePostedWhileItsMessageArrivesTakesItOver) {
  // Note [TCP matching and buffering]: 16 MiB in 64 KiB frames over 3
  // sockets, its receive posted after delays from none to longer than the
  // transfer, so that it finds the message not started, partly buffered
  // (frames still being read, some not yet seen) or whole.
  auto o = tcpOptions("adopt", 3);
  o.chunkBytes = 64 << 10;
  auto ts = connectGroup(2, [&](int) { return o; });
  const size_t bytes = (16 << 20) + 3;
  int tag = 0;
  for (int delayUs : {0, 20, 100, 300, 1000, 3000, 20000}) {
    for (int rep = 0; rep < 3; ++rep, ++tag) {
      auto out = patterned(0, 1, tag, bytes);
      std::vector<uint8_t> in(bytes, 0xEE);
      auto s = ts[0]->isend(1, tag, out.data(), bytes);
      std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
      ts[1]->irecv(0, tag, in.data(), bytes)->wait(after(kWaitMs));
      s->wait(after(kWaitMs));
      ASSERT_TRUE(in == out) << "receive posted " << delayUs << " us after the send";
    }
  }
}

TEST(TcpTransport, ManyConcurrentMessagesFromSeveralThreads) {
  const int n = 4, kPerPeer = 60;
  auto ts = connectGroup(n, [o = tcpOptions("many")](int) { return o; });
  testing::runRanks(n, [&](int me) {
    std::vector<std::thread> threads;
    for (int half = 0; half < 2; ++half) {  // sends on one thread, receives on another
      threads.emplace_back([&, half] {
        std::mt19937 rng(me * 7 + half);
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<std::shared_ptr<Request>> reqs;
        std::vector<std::pair<int, int>> order;
        for (int p = 0; p < n; ++p)
          for (int k = 0; k < kPerPeer; ++k) order.emplace_back(p, k);
        std::shuffle(order.begin(), order.end(), rng);
        auto size = [](int k) { return static_cast<size_t>((k * 7919) % 150000); };
        for (auto [p, k] : order) {
          if (half == 0) {
            bufs.push_back(patterned(me, p, k, size(k)));
            reqs.push_back(ts[me]->isend(p, k, bufs.back().data(), size(k)));
          } else {
            bufs.emplace_back(size(k));
            reqs.push_back(ts[me]->irecv(p, k, bufs.back().data(), size(k)));
          }
        }
        for (auto& r : reqs) r->wait(after(kWaitMs));
        if (half == 1) {
          for (size_t i = 0; i < order.size(); ++i) {
            auto [p, k] = order[i];
            EXPECT_TRUE(bufs[i] == patterned(p, me, k, size(k))) << me << " from " << p;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  });
}

// Note [Posting threads progress]: a poster that finds the progress thread
// idle writes its send itself, but callbacks still run on the progress
// thread, never inside isend/irecv. A poster holding a lock that its own
// callbacks take therefore does not deadlock, and a callback may post.
TEST(TcpTransport, CallbacksRunOnTheProgressThreadWhenThePosterWrites) {
  auto ts = connectGroup(2, [o = tcpOptions("inline")](int) { return o; });
  const auto poster = std::this_thread::get_id();
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, reposted = 0;
  std::atomic<int> onPoster{0};
  std::vector<uint8_t> out = patterned(0, 1, 1, 64), in(64), echo(64), echoIn(64);
  auto onDone = [&](std::exception_ptr e) {
    EXPECT_FALSE(e);
    if (std::this_thread::get_id() == poster) {
      ++onPoster;  // taking `mu` here would deadlock: the poster holds it
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    cv.notify_all();
  };
  std::shared_ptr<Request> r1, echoSend;
  {
    std::lock_guard<std::mutex> lock(mu);
    // The receive is posted first and its message arrives on rank 1's
    // progress thread; its callback posts a send back (a post from a callback).
    r1 = ts[1]->irecv(0, 1, in.data(), in.size(), [&](std::exception_ptr e) {
      EXPECT_FALSE(e);
      echo = in;
      echoSend = ts[1]->isend(0, 2, echo.data(), echo.size());
      std::lock_guard<std::mutex> l(mu);
      ++reposted;
      cv.notify_all();
    });
    for (int k = 0; k < 50; ++k) ts[0]->isend(1, 100 + k, out.data(), out.size(), onDone);
    ts[0]->isend(1, 1, out.data(), out.size(), onDone);
  }
  auto back = ts[0]->irecv(1, 2, echoIn.data(), echoIn.size());
  back->wait(after(kWaitMs));
  EXPECT_TRUE(echoIn == out);
  std::vector<std::vector<uint8_t>> sink(50, std::vector<uint8_t>(64));
  for (int k = 0; k < 50; ++k) ts[1]->irecv(0, 100 + k, sink[k].data(), 64)->wait(after(kWaitMs));
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_EQ(onPoster.load(), 0) << "callbacks ran inside isend on the posting thread";
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::milliseconds(kWaitMs),
                          [&] { return done + onPoster == 51 && reposted == 1; }))
      << done << " of 51 send callbacks ran, " << reposted << " of 1 re-post";
  lock.unlock();
  echoSend->wait(after(kWaitMs));
  for (auto& t : ts) t->close();
}

// A size mismatch: the Transport contract (test_core_transport.cc).

// Note [A driver done leaves early data in the socket]: a driver whose
// request is done reads no unexpected payload, so the message behind it waits
// in its socket and lands in place once its receive is posted; when the op
// ends instead, the progress thread buffers it as before.
TEST(TcpTransport, ADriverDoneLeavesTheNextMessageInItsSocket) {
  auto ts = connectGroup(2, [o = tcpOptions("driver-done")](int) { return o; });
  auto* tcp = dynamic_cast<transport::tcp::TcpTransport*>(ts[0].get());
  ASSERT_NE(tcp, nullptr);
  constexpr size_t kBlob = 1 << 20;
  for (bool postsIt : {true, false}) {
    SCOPED_TRACE(postsIt ? "the driver posts its receive" : "the op ends first");
    const uint64_t tag = postsIt ? 0 : 2;
    auto out = patterned(1, 0, tag, kBlob);
    std::vector<uint8_t> in(kBlob, 0xEE);
    uint8_t small = 0;
    {
      transport::DriveScope drive(*ts[0], true);
      auto r = ts[0]->irecv(1, tag, &small, 1);
      const uint8_t one = 1;
      auto s1 = ts[1]->isend(0, tag, &one, 1);
      auto s2 = ts[1]->isend(0, tag + 1, out.data(), kBlob);
      r->waitDriven(after(kWaitMs));
      // The whole blob is in rank 0's sockets by now; nobody else reads them
      // while rank 0 drives. A drive of a request already done polls once.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      r->waitDriven(after(kWaitMs));
      EXPECT_EQ(tcp->unexpectedBytes(), 0u) << "the driver buffered the message behind its own";
      if (postsIt) {
        ts[0]->irecv(1, tag + 1, in.data(), kBlob)->waitDriven(after(kWaitMs));
        EXPECT_EQ(tcp->unexpectedBytes(), 0u);
      }
      s1->wait(after(kWaitMs));
      if (postsIt) s2->wait(after(kWaitMs));
    }
    if (!postsIt) {
      const auto until = after(kWaitMs);
      while (tcp->unexpectedBytes() < kBlob && transport::Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(tcp->unexpectedBytes(), kBlob) << "the progress thread did not take it over";
      ts[0]->irecv(1, tag + 1, in.data(), kBlob)->wait(after(kWaitMs));
    }
    EXPECT_EQ(small, 1);
    EXPECT_TRUE(in == out);
  }
}

// The decoder alone (the fuzzer, tests/fuzz, drives it with arbitrary bytes).
// Note [Waiters drive the sockets]: a request that another thread completes
// wakes the driver's poll. Here the progress thread, kicked out of epoll_wait
// by beginDrive, still handles the batch it woke with (rank 1's blob) while
// the driver posts its receive, adopts that receive and matches it with a
// message that had already arrived; the driver, which tested the request
// before that completion and then polled, must not sleep until its deadline
// (nothing else arrives), as it did before the completion woke it.
TEST(TcpTransport, ADriverWakesWhenAnotherThreadCompletesItsRequest) {
  auto ts = connectGroup(2, [o = tcpOptions("driven-elsewhere")](int) { return o; });
  constexpr int kRounds = 200;
  constexpr size_t kBlob = 256 << 10;
  std::atomic<int> sent{-1}, taken{-1};
  std::thread sender([&] {
    std::vector<uint8_t> blob(kBlob, 7);
    for (int i = 0; i < kRounds && taken.load() < kRounds; ++i) {
      uint8_t b = static_cast<uint8_t>(i);
      auto small = ts[1]->isend(0, 2 * i, &b, 1);
      auto big = ts[1]->isend(0, 2 * i + 1, blob.data(), blob.size());
      small->wait(after(kWaitMs));
      big->wait(after(kWaitMs));
      sent.store(i);
      while (taken.load() < i) std::this_thread::yield();  // rank 0 took both
    }
  });
  std::vector<uint8_t> blob(kBlob);
  int slow = 0;
  for (int i = 0; i < kRounds && !slow; ++i) {
    while (sent.load() < i) std::this_thread::yield();
    transport::DriveScope drive(*ts[0], true);
    uint8_t in = 0;
    auto r = ts[0]->irecv(1, 2 * i, &in, 1);
    const auto t0 = transport::Clock::now();
    try {
      r->waitDriven(after(kWaitMs));
      ts[0]->irecv(1, 2 * i + 1, blob.data(), blob.size())->waitDriven(after(kWaitMs));
    } catch (const Error& e) {
      ADD_FAILURE() << "round " << i << ": " << e.what();
      slow = 1;
    }
    // Woken, not at the deadline it slept to (Note [Timing bounds in tests] in
    // tests/cpp/timing.h).
    const auto took = transport::Clock::now() - t0;
    if (!testing::endedEarly(took, std::chrono::milliseconds(kWaitMs))) slow = 1;
    EXPECT_TRUE(testing::endedEarly(took, std::chrono::milliseconds(kWaitMs))) << "round " << i;
    EXPECT_EQ(in, static_cast<uint8_t>(i));
    taken.store(slow ? kRounds : i);
  }
  taken.store(kRounds);
  sender.join();
}

TEST(TcpFrame, RoundTripsAndRejectsEveryBrokenField) {
  using namespace transport::tcp;
  FrameHeader h;
  h.source = 3, h.chunk = 70000, h.tag = ~uint64_t(0), h.seq = 5, h.total = 1 << 20, h.offset = 65536;
  uint8_t b[kFrameHeaderBytes];
  encodeFrame(h, b);
  FrameHeader d;
  std::string why;
  ASSERT_EQ(decodeFrame(b, sizeof(b), &d, &why), DecodeStatus::kOk) << why;
  EXPECT_TRUE(d.source == 3 && d.chunk == 70000 && d.tag == h.tag && d.seq == 5 &&
              d.total == h.total && d.offset == 65536);
  EXPECT_EQ(decodeFrame(b, sizeof(b) - 1, &d, &why), DecodeStatus::kNeedMore);
  auto broken = [&](const std::function<void(FrameHeader&, uint8_t*)>& edit) {
    FrameHeader x = h;
    uint8_t y[kFrameHeaderBytes];
    encodeFrame(x, y);
    edit(x, y);
    encodeFrame(x, y);
    edit(x, y);  // byte edits survive the re-encode
    std::string w;
    EXPECT_EQ(decodeFrame(y, sizeof(y), &d, &w), DecodeStatus::kInvalid);
    return w;
  };
  EXPECT_NE(broken([](FrameHeader&, uint8_t* y) { y[0] ^= 1; }).find("magic"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader&, uint8_t* y) { y[4] = 2; }).find("version 2"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader&, uint8_t* y) { y[5] = 0; }).find("opcode 0"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader&, uint8_t* y) { y[6] = 1; }).find("flags"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& x, uint8_t*) { x.chunk = kMaxChunkBytes + 1; })
                .find("largest chunk"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& x, uint8_t*) { x.total = kMaxMessageBytes + 1; })
                .find("largest message"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& x, uint8_t*) { x.offset = ~uint64_t(0) - 10; })
                .find("beyond the message"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& x, uint8_t*) { x.offset = (1 << 20) - 100; })
                .find("beyond the message"), std::string::npos);
  EXPECT_NE(broken([](FrameHeader& x, uint8_t*) { x.chunk = 0; }).find("empty chunk"),
            std::string::npos);
  // Order on one socket, and a message's frames against its first one.
  SocketOrder order(3);
  EXPECT_TRUE(order.check(h, &why));
  EXPECT_FALSE(order.check(h, &why));  // the same bytes again
  EXPECT_NE(why.find("out-of-order"), std::string::npos) << why;
  uint64_t received = (1 << 20) - 1000;
  EXPECT_FALSE(checkMessage(h, h.tag, h.total, &received, &why));
  EXPECT_NE(why.find("more than its total"), std::string::npos) << why;
  received = 0;
  EXPECT_TRUE(checkMessage(h, h.tag, h.total, &received, &why));
  EXPECT_EQ(received, 70000u);
}

TEST(TcpOptions, InvalidValuesNameTheSetting) {
  auto expectError = [](transport::tcp::TcpOptions o, const char* setting) {
    try {
      o.check(2);
      ADD_FAILURE() << "no error for " << setting;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(setting), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("(rank 2)"), std::string::npos) << e.what();
    }
  };
  auto o = tcpOptions("opts");
  o.socketsPerPeer = 0;
  expectError(o, "BRAID_TCP_SOCKETS_PER_PEER");
  o = tcpOptions("opts");
  o.chunkBytes = 1000;
  expectError(o, "BRAID_TCP_CHUNK_BYTES");
  o = tcpOptions("opts");
  o.secret.clear();
  o.requireAuth = true;
  expectError(o, "BRAID_REQUIRE_AUTH");
}

TEST(TcpOptions, ListeningAddressFromTheInterfaceOrTheRouteToTheStore) {
  using transport::tcp::chooseHost;
  using transport::tcp::IfnameSyntax;
  const auto braid = IfnameSyntax::kBraid, gloo = IfnameSyntax::kGloo;
  EXPECT_EQ(chooseHost("", braid, "", false, 0), "127.0.0.1");
  EXPECT_EQ(chooseHost("lo", braid, "", false, 0), "127.0.0.1");
  EXPECT_EQ(chooseHost("=lo", braid, "", false, 0), "127.0.0.1");
  EXPECT_EQ(chooseHost("no-such-if0,lo", braid, "", false, 0), "127.0.0.1");
  EXPECT_EQ(chooseHost("lo", gloo, "", false, 0), "127.0.0.1");
  EXPECT_EQ(chooseHost("", braid, "127.0.0.1", false, 0), "127.0.0.1");
  try {
    chooseHost("no-such-if0", braid, "", false, 3);
    ADD_FAILURE() << "no error for a missing interface";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("BRAID_SOCKET_IFNAME='no-such-if0'"), std::string::npos) << m;
    EXPECT_NE(m.find("lo"), std::string::npos) << m;  // the interfaces there are
    EXPECT_NE(m.find("(rank 3)"), std::string::npos) << m;
  }
  try {
    chooseHost("l", gloo, "", false, 2);  // gloo's names are exact: "l" is not a prefix of lo
    ADD_FAILURE() << "no error for a missing interface";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GLOO_SOCKET_IFNAME='l'"), std::string::npos) << e.what();
  }
}

TEST(TcpOptions, AcrossHostsALoopbackRouteBecomesAnOutwardInterface) {
  // Note [A store on this host]: what this machine has decides the answer.
  using transport::tcp::chooseHost;
  const auto braid = transport::tcp::IfnameSyntax::kBraid;
  std::string outward;
  for (const auto& a : transport::tcp::localAddrs(0)) {
    if (outward.empty() && !a.loopback && a.ifname.rfind("docker", 0) != 0 &&
        a.ifname.rfind("virbr", 0) != 0) {
      outward = a.host;
    }
  }
  if (outward.empty()) {
    EXPECT_EQ(chooseHost("", braid, "127.0.0.1", true, 0), "127.0.0.1");
    EXPECT_THROW(chooseHost("", braid, "", true, 0), Error);
    return;
  }
  std::string got = chooseHost("", braid, "127.0.0.1", true, 0);
  EXPECT_EQ(got.rfind("127.", 0), std::string::npos) << got;  // not loopback
  EXPECT_EQ(chooseHost("", braid, "", true, 0), got);           // no store host either
  EXPECT_EQ(chooseHost("", braid, "127.0.0.1", false, 0), "127.0.0.1");  // one host: as it was
  EXPECT_EQ(chooseHost("", braid, got, true, 0), got);  // a route that is not loopback stays
}

namespace {

// A machine with loopback, two Ethernet ports (eth1 also has IPv6), eth10,
// a docker bridge and an InfiniBand port with only IPv6.
std::vector<transport::tcp::LocalAddr> someInterfaces() {
  return {{"lo", "127.0.0.1", false, true},      {"lo", "::1", true, true},
          {"docker0", "172.17.0.1", false, false}, {"eth10", "10.0.10.1", false, false},
          {"eth1", "fd00::1", true, false},       {"eth1", "10.0.1.1", false, false},
          {"eth0", "10.0.0.1", false, false},     {"ib0", "fd00::2", true, false}};
}

std::string pick(const std::string& spec, const std::string& routed = "") {
  return transport::tcp::pickAddress(spec, transport::tcp::IfnameSyntax::kBraid, someInterfaces(),
                                     routed, 0);
}

std::string pickError(const std::string& spec, transport::tcp::IfnameSyntax syntax,
                      const std::string& routed = "") {
  try {
    transport::tcp::pickAddress(spec, syntax, someInterfaces(), routed, 5);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(TcpInterfaces, NamesArePrefixesAnExactNameFirstThenTheListsOrder) {
  EXPECT_EQ(pick("eth1"), "10.0.1.1");  // eth1 before eth10; IPv4 before IPv6
  EXPECT_EQ(pick("eth"), "10.0.10.1");  // the first eth* in getifaddrs' order
  EXPECT_EQ(pick("=eth0"), "10.0.0.1");
  EXPECT_EQ(pick("ib,eth0"), "fd00::2");  // the list's order; IPv6 when that is all
  EXPECT_EQ(pick("wlan,eth0"), "10.0.0.1");
  EXPECT_EQ(pick("docker"), "172.17.0.1");
  EXPECT_EQ(pick("lo"), "127.0.0.1");
}

TEST(TcpInterfaces, ExclusionsPreferTheRouteToTheStoreAndSkipLoopback) {
  EXPECT_EQ(pick("^docker"), "10.0.10.1");
  EXPECT_EQ(pick("^docker", "10.0.0.1"), "10.0.0.1");  // the route, allowed
  EXPECT_EQ(pick("^eth0", "10.0.0.1"), "172.17.0.1");  // the route, excluded
  EXPECT_EQ(pick("^docker,eth", "127.0.0.1"), "fd00::2");
  EXPECT_EQ(pick("^=eth1,docker0"), "10.0.10.1");
  EXPECT_EQ(pick("^=eth10,docker0"), "10.0.1.1");
}

TEST(TcpInterfaces, GloosNamesAreExact) {
  const auto gloo = transport::tcp::IfnameSyntax::kGloo;
  EXPECT_EQ(transport::tcp::pickAddress("eth0,eth1", gloo, someInterfaces(), "", 0), "10.0.0.1");
  EXPECT_EQ(transport::tcp::pickAddress("eth1", gloo, someInterfaces(), "", 0), "10.0.1.1");
  std::string m = pickError("eth", gloo);
  EXPECT_NE(m.find("GLOO_SOCKET_IFNAME='eth' matches no interface"), std::string::npos) << m;
  m = pickError("^docker0", gloo);  // no exclusions in gloo's syntax: a name that is not there
  EXPECT_NE(m.find("GLOO_SOCKET_IFNAME='^docker0' matches no interface"), std::string::npos) << m;
}

TEST(TcpInterfaces, ErrorsNameTheSettingTheValueTheRankAndTheInterfaces) {
  const auto braid = transport::tcp::IfnameSyntax::kBraid;
  std::string m = pickError("wlan", braid);
  EXPECT_NE(m.find("BRAID_SOCKET_IFNAME='wlan' matches no interface"), std::string::npos) << m;
  EXPECT_NE(m.find("(rank 5)"), std::string::npos) << m;
  EXPECT_NE(m.find("interfaces with addresses: lo, docker0, eth10, eth1, eth0, ib0"),
            std::string::npos)
      << m;
  m = pickError("^docker,eth,ib", braid);
  EXPECT_NE(m.find("'^docker,eth,ib' matches no allowed non-loopback interface"),
            std::string::npos)
      << m;
  for (const char* bad : {"eth0,", ",eth0", "eth0,,ib0", "^", "=", "^="}) {
    m = pickError(bad, braid);
    EXPECT_NE(m.find(std::string("BRAID_SOCKET_IFNAME='") + bad + "' has an empty interface name"),
              std::string::npos)
        << m;
  }
}

// Note [Congestion control]: every connected socket of the group, dialled or
// accepted, runs the named algorithm (reno: always built in and allowed).
TEST(TcpOptions, CongestionControlIsSetOnEverySocketAndABadNameFailsInit) {
  auto o = tcpOptions("congestion");
  o.congestion = "reno";
  auto ts = connectGroup(2, [&](int) { return o; });
  int connected = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    char name[32] = {};
    socklen_t nlen = sizeof(name);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening) continue;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &nlen) != 0) continue;  // not TCP
    EXPECT_STREQ(name, "reno") << "fd " << fd;
    ++connected;
  }
  EXPECT_EQ(connected, 2 * 2);  // 2 sockets per peer, both ends in this process
  for (auto& t : ts) t->close();
  o = tcpOptions("congestion");
  o.congestion = "no-such-algorithm";
  try {
    o.check(4);
    ADD_FAILURE() << "no error for an unknown algorithm";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("tcp init (rank 4): BRAID_TCP_CONGESTION='no-such-algorithm': "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("(this process may pick: "), std::string::npos) << m;
  }
}

// BRAID_SECRET_FILE: read with its trailing newline dropped; one that other
// users can read warns once (ssh refuses such keys; braid only warns).
TEST(TcpOptions, SecretFileIsReadAndOneOthersCanReadWarnsOnce) {
  char path[] = "/tmp/braid-secret-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "s3cret-from-a-file\n", 19), 19);
  ::close(fd);
  ::unsetenv("BRAID_SECRET");
  ::setenv("BRAID_SECRET_FILE", path, 1);
  auto read = [] {
    ::testing::internal::CaptureStderr();
    auto o = TcpOptions::fromEnv(0, 2);
    EXPECT_EQ(o.secret, "s3cret-from-a-file");
    return ::testing::internal::GetCapturedStderr();
  };
  ASSERT_EQ(::chmod(path, 0600), 0);
  EXPECT_EQ(read(), "");
  ASSERT_EQ(::chmod(path, 0644), 0);
  std::string log = read();
  EXPECT_NE(log.find(std::string("BRAID_SECRET_FILE '") + path + "' has mode 0644: other users "
                     "can read it"), std::string::npos) << log;
  EXPECT_NE(log.find("chmod 600"), std::string::npos) << log;
  EXPECT_EQ(read(), "");  // once per file
  ASSERT_EQ(::truncate(path, 0), 0);
  try {
    TcpOptions::fromEnv(3, 4);
    ADD_FAILURE() << "no error for an empty secret file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tcp init (rank 3): BRAID_SECRET_FILE '"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("' is empty"), std::string::npos) << e.what();
  }
  ::unlink(path);
  EXPECT_THROW(TcpOptions::fromEnv(0, 2), Error);  // cannot read it
  ::unsetenv("BRAID_SECRET_FILE");
}

TEST(TcpOptions, TheSecretIsNeverShownInTheSettingsList) {
  ::setenv("BRAID_SECRET", "do-not-print-me", 1);
  bool seen = false;
  for (const auto& s : allSettings()) {
    if (std::string(s.name) != "BRAID_SECRET") continue;
    seen = true;
    EXPECT_EQ(std::string(s.type), "secret");
    EXPECT_EQ(s.currentValue().find("do-not-print-me"), std::string::npos) << s.currentValue();
  }
  ::unsetenv("BRAID_SECRET");
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace braid
