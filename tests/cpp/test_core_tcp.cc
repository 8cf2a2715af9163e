// The TCP transport (csrc/transport/tcp) with threads as ranks over loopback:
// messages of every awkward size between every pair, striped over several
// sockets and checked byte for byte; tag matching; authentication failures;
// strangers; peers that vanish; abort; and no leaked fds or threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "tcp_group.h"

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

TEST(TcpTransport, SizeMismatchFailsTheReceiveNamingBothAndThePairGoesOn) {
  auto ts = connectGroup(2, [o = tcpOptions("mismatch")](int) { return o; });
  auto big = patterned(0, 1, 5, 200000), ok = patterned(0, 1, 6, 10);
  ts[0]->isend(1, 5, big.data(), big.size());
  ts[0]->isend(1, 6, ok.data(), ok.size());
  std::vector<uint8_t> small(100), in(10);
  try {
    ts[1]->irecv(0, 5, small.data(), small.size())->wait(after(kWaitMs));
    FAIL() << "expected a size mismatch";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("200000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("100 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 at 127.0.0.1:"), std::string::npos) << m;
  }
  ts[1]->irecv(0, 6, in.data(), in.size())->wait(after(kWaitMs));
  EXPECT_TRUE(in == ok);
}

}  // namespace
}  // namespace braid
