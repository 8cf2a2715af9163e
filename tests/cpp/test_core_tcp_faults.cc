// The TCP transport when things go wrong: wrong or missing secrets,
// strangers on the port, peers that vanish or send broken frames, abort.
// Every failure must name the peer (rank and address), come within the
// timeout, and leave no fd or thread behind (checked after every test).
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "tcp_group.h"
#include "timing.h"

namespace braid {
namespace {

using testing::after;
using testing::connectGroup;
using testing::FakePeer;
using testing::tcpOptions;
using transport::tcp::FrameHeader;
using transport::tcp::Opcode;
using transport::tcp::kMaxGoodbyeBytes;
using transport::tcp::TcpOptions;

class TcpFaults : public ::testing::Test {
 protected:
  void SetUp() override { fds_ = testing::countFds(); }
  void TearDown() override {
    EXPECT_EQ(testing::countFds(), fds_) << "leaked file descriptors";
    // A joined thread can still be listed in /proc for a moment: pthread_join
    // returns when the kernel clears the thread's tid, before it is reaped
    // (a moment that a loaded machine can stretch: the wait ends when they go).
    auto deadline = after(10000);
    while (testing::countThreadsNamed("braid-tcp") != 0 && transport::Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(testing::countThreadsNamed("braid-tcp"), 0) << "progress threads left running";
  }
  int fds_ = 0;
};

std::string addressOf(const transport::Transport& t, int rank) {
  std::string n = t.peerName(rank);
  return n.substr(n.find(" at ") + 4);
}

// Runs `fn` on each rank's connect() and returns each rank's error ("" = none).
std::vector<std::string> connectErrors(int size, const std::function<TcpOptions(int)>& opts) {
  testing::MemoryStore store;
  std::vector<std::string> errors(size);
  testing::runRanks(size, [&](int r) {
    try {
      transport::tcp::connect(store, r, size, opts(r));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

std::string waitError(const std::shared_ptr<transport::Request>& r, int ms = 5000) {
  try {
    r->wait(after(ms));
  } catch (const TimeoutError& e) {
    return std::string("TIMEOUT ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(TcpFaults, WrongSecretIsRefusedNamingThePeerWithinTheTimeout) {
  auto base = tcpOptions("wrong-secret");
  base.timeout = std::chrono::milliseconds(20000);
  ::testing::internal::CaptureStderr();
  const auto start = transport::Clock::now();
  auto errors = connectErrors(2, [&](int r) {
    auto o = base;
    if (r == 1) o.secret = "another-secret";
    return o;
  });
  const auto took = transport::Clock::now() - start;
  std::string log = ::testing::internal::GetCapturedStderr();
  // The dialer finds the acceptor's proof wrong; the acceptor refuses the
  // dialer (logged with its address) and, told by the store that rank 1 gave
  // up (Note [A rank that cannot connect]), fails quoting it, long before its
  // timeout.
  EXPECT_HAS(errors[1], "rank 0 at 127.0.0.1:");
  EXPECT_HAS(errors[1], "failed authentication");
  EXPECT_HAS(errors[0], "tcp connect (rank 0): a peer could not connect: braid tcp connect "
                        "(rank 1): rank 0 at 127.0.0.1:");
  EXPECT_HAS(errors[0], "failed authentication");
  EXPECT_HAS(errors[0], "refused a connection from 127.0.0.1:");
  EXPECT_HAS(errors[0], "claiming rank 1");
  EXPECT_HAS(log, "refused a connection from 127.0.0.1:");
  // Note [Timing bounds in tests] in tests/cpp/timing.h
  EXPECT_TRUE(testing::endedEarly(took, base.timeout));
}

TEST_F(TcpFaults, AcceptorsQuoteThePeerThatGaveUpAndWhatTheyRefused) {
  // Ranks 0 and 1 share a secret, rank 2 has another: rank 2 fails the
  // handshakes it dials, and the acceptors fail with their own refusals of it
  // and the first news they had: rank 2's reason from the store, or (for one
  // of them, when the other read the store first) the other's departure.
  auto base = tcpOptions("quote-refusals");
  auto errors = connectErrors(3, [&](int r) {
    auto o = base;
    if (r == 2) o.secret = "another-secret";
    return o;
  });
  EXPECT_HAS(errors[2], "failed authentication");
  const std::string quoted = "a peer could not connect: braid tcp connect (rank 2)";
  const std::string left = "closed its connections (it left: destroyed the group, exited or "
                           "gave up); tcp accept";
  int quoting = 0;
  for (int r : {0, 1}) {
    const bool quotes = errors[r].find(quoted) != std::string::npos;
    quoting += quotes;
    if (!quotes) {
      EXPECT_HAS(errors[r], "rank " + std::to_string(1 - r) + " at 127.0.0.1:");
      EXPECT_HAS(errors[r], left);
    }
    EXPECT_HAS(errors[r], "(claiming rank 2): closed the connection after this rank's challenge");
  }
  EXPECT_GE(quoting, 1) << errors[0] << "\n" << errors[1];
}

TEST_F(TcpFaults, ARankThatCannotStartFailsItsPeersAtOnce) {
  // Rank 1 has no interface to listen on, so it never publishes an address:
  // its peers read why instead of waiting for the whole timeout.
  auto base = tcpOptions("cannot-start");
  base.timeout = std::chrono::milliseconds(20000);
  const auto start = transport::Clock::now();
  auto errors = connectErrors(3, [&](int r) {
    auto o = base;
    if (r == 1) o.ifname = "no-such-if0";
    return o;
  });
  const auto took = transport::Clock::now() - start;
  EXPECT_HAS(errors[1], "tcp init (rank 1): BRAID_SOCKET_IFNAME='no-such-if0' matches no");
  for (int r : {0, 2}) {
    EXPECT_HAS(errors[r], "tcp connect (rank " + std::to_string(r) + "): rank 1 could not "
                          "connect: braid tcp init (rank 1): BRAID_SOCKET_IFNAME='no-such-if0'");
  }
  EXPECT_TRUE(testing::endedEarly(took, base.timeout));
}

TEST_F(TcpFaults, SecretOnOneSideOnlyIsRefusedSayingSo) {
  auto base = tcpOptions("one-secret");
  // The refusal comes at once; a short timeout could fire first on a loaded machine.
  base.timeout = std::chrono::milliseconds(20000);
  auto errors = connectErrors(2, [&](int r) {
    auto o = base;
    if (r == 0) o.secret.clear();
    return o;
  });
  EXPECT_HAS(errors[1], "rank 0 at 127.0.0.1:");
  EXPECT_HAS(errors[1], "one rank has a secret and the other has none");
  EXPECT_HAS(errors[0], "it has a secret and this rank has none");
}

TEST_F(TcpFaults, RequireAuthWithoutASecretFailsNamingTheSetting) {
  auto o = tcpOptions("require");
  o.secret.clear();
  o.requireAuth = true;
  testing::MemoryStore store;
  try {
    transport::tcp::connect(store, 0, 1, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_HAS(m, "BRAID_REQUIRE_AUTH=1");
    EXPECT_HAS(m, "BRAID_SECRET_FILE");
    EXPECT_HAS(m, "(rank 0)");
  }
}

TEST_F(TcpFaults, APeerThatNeverComesTimesOutNamingIt) {
  auto o = tcpOptions("absent");
  o.timeout = std::chrono::milliseconds(300);
  testing::MemoryStore store;
  try {
    transport::tcp::connect(store, 0, 2, o);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_HAS(std::string(e.what()), "tcp connect (rank 0): rank 1 published no address");
  }
}

TEST_F(TcpFaults, StrangersAreRefusedAndLoggedAndTheGroupWorks) {
  auto o = tcpOptions("stranger");
  o.timeout = std::chrono::milliseconds(20000);  // a stranger's handshake deadline too
  auto ts = connectGroup(2, [&](int) { return o; });
  const std::string addr0 = addressOf(*ts[0], 0);
  ::testing::internal::CaptureStderr();
  int garbage = testing::rawConnect(addr0);
  std::string junk(200, 'x');
  junk.replace(0, 16, "GET / HTTP/1.1\r\n");
  ASSERT_EQ(::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL), ssize_t(junk.size()));
  // At once, not at the stranger's handshake deadline (o.timeout).
  EXPECT_TRUE(testing::closedByPeer(garbage, int(testing::earlyBound(o.timeout).count())));
  int silent = testing::rawConnect(addr0);  // says nothing; must not block anyone
  // A stranger that speaks the protocol but does not know the secret.
  auto guess = o;
  guess.secret = "guessed";
  EXPECT_THROW(FakePeer(guess, 1, 2, 0, addr0), Error);
  // The group still works, both ways.
  auto a = testing::patterned(0, 1, 1, 100000), b = testing::patterned(1, 0, 2, 3);
  std::vector<uint8_t> ina(a.size()), inb(b.size());
  auto r1 = ts[1]->irecv(0, 1, ina.data(), ina.size());
  auto r0 = ts[0]->irecv(1, 2, inb.data(), inb.size());
  ts[0]->isend(1, 1, a.data(), a.size())->wait(after(5000));
  ts[1]->isend(0, 2, b.data(), b.size())->wait(after(5000));
  r1->wait(after(5000));
  r0->wait(after(5000));
  EXPECT_TRUE(ina == a && inb == b);
  ::close(garbage);
  ::close(silent);
  ts.clear();
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_HAS(log, "refused a connection from 127.0.0.1:");
  EXPECT_HAS(log, "not a braid handshake message");
  EXPECT_HAS(log, "(claiming rank 1): closed the connection after this rank's challenge");
}

// Rank 0 is real; rank 1 is played by hand over one authenticated socket.
struct FakeGroup {
  explicit FakeGroup(const char* name) : o(tcpOptions(name, 1)) {
    store.set("braid/tcp/" + o.groupId + "/addr/1", {'1', '2', '7', '.', '0', '.', '0', '.', '1', ':', '9'});
    std::thread t([&] { real = transport::tcp::connect(store, 0, 2, o); });
    auto v = store.get("braid/tcp/" + o.groupId + "/addr/0", std::chrono::milliseconds(5000));
    fake = std::make_unique<FakePeer>(o, 1, 2, 0, std::string(v.begin(), v.end()));
    t.join();
  }
  TcpOptions o;
  testing::MemoryStore store;
  std::unique_ptr<transport::Transport> real;
  std::unique_ptr<FakePeer> fake;
};

FrameHeader frame(uint64_t seq, uint64_t total, uint64_t offset, uint32_t chunk, uint64_t tag = 3) {
  FrameHeader h;
  h.source = 1;
  h.seq = seq;
  h.total = total;
  h.offset = offset;
  h.chunk = chunk;
  h.tag = tag;
  return h;
}

// A goodbye frame's header from rank 1 (Note [Saying why on the way out]).
FrameHeader goodbye(uint32_t chunk, uint64_t seq = 0) {
  FrameHeader h;
  h.opcode = Opcode::kGoodbye;
  h.source = 1;
  h.chunk = chunk;
  h.seq = seq;
  return h;
}

// Rank 0 posts a 1 MiB receive (tag 3) and a small one (tag 4) from rank 1,
// which sends the 1 MiB message's first frame header and `part` bytes of it.
struct MidMessage {
  MidMessage(FakeGroup& g, size_t part) {
    r1 = g.real->irecv(1, 3, big.data(), big.size());
    r2 = g.real->irecv(1, 4, small.data(), small.size());
    g.fake->frame(frame(0, big.size(), 0, 65536));
    std::vector<uint8_t> bytes(part, 7);
    g.fake->write(bytes.data(), bytes.size());
  }
  std::vector<uint8_t> big = std::vector<uint8_t>(1 << 20), small = std::vector<uint8_t>(10);
  std::shared_ptr<transport::Request> r1, r2;
};

TEST_F(TcpFaults, PeerThatClosesOrResetsMidMessageFailsEveryPendingOp) {
  for (bool reset : {false, true}) {
    SCOPED_TRACE(reset ? "reset" : "close");
    FakeGroup g(reset ? "reset" : "close");
    MidMessage m(g, 1000);
    g.fake->closeNow(reset);
    for (auto& r : {m.r1, m.r2}) {
      std::string e = waitError(r);
      EXPECT_HAS(e, "rank 1 at 127.0.0.1:9");
      EXPECT_EQ(e.find("TIMEOUT"), std::string::npos) << e;
    }
    if (!reset) {
      EXPECT_HAS(waitError(m.r1), "in the middle of a message");
    }
    // Later ops with that peer fail at once, naming it.
    EXPECT_HAS(waitError(g.real->isend(1, 5, m.small.data(), m.small.size()), 1000), "rank 1 at");
  }
}

// Note [Messages that outlive their sender]: a peer sends and closes at once;
// receives posted afterwards still get what it sent, in send order per tag,
// and only a receive with nothing left fails, naming the peer.
TEST_F(TcpFaults, MessagesThatArrivedBeforeThePeerClosedStillMeetTheirReceives) {
  auto ts = connectGroup(2, [o = tcpOptions("outlive", 3)](int) { return o; });
  const std::string left = "closed its connections (it left";
  const std::vector<size_t> sizes = {4, 0, 1, (64 << 10) + 1, (1 << 20) + 3, 7};
  std::vector<uint8_t> none(8);
  auto early = ts[1]->irecv(0, 99, none.data(), none.size());  // never sent
  std::vector<std::vector<uint8_t>> out;
  std::vector<std::shared_ptr<transport::Request>> sends;
  for (size_t k = 0; k < sizes.size(); ++k) {
    out.push_back(testing::patterned(0, 1, k % 3, sizes[k]));  // tags 0, 1, 2 twice each
    sends.push_back(ts[0]->isend(1, k % 3, out[k].data(), sizes[k]));
  }
  for (auto& s : sends) s->wait(after(5000));
  ts[0]->close();
  std::string e = waitError(early);
  EXPECT_HAS(e, "rank 0 at 127.0.0.1:");
  EXPECT_HAS(e, left);
  EXPECT_EQ(e.find("TIMEOUT"), std::string::npos) << e;
  // Tag 2 first, tag 0 last; within a tag, the first receive gets the first send.
  for (int tag : {2, 1, 0}) {
    for (size_t k : {size_t(tag), size_t(tag) + 3}) {
      std::vector<uint8_t> in(sizes[k], 0xEE);
      EXPECT_EQ(waitError(ts[1]->irecv(0, tag, in.data(), in.size()), 1000), "") << "message " << k;
      EXPECT_TRUE(in == out[k]) << "message " << k << " of " << sizes[k] << " bytes";
    }
  }
  std::vector<uint8_t> in(4);
  EXPECT_HAS(waitError(ts[1]->irecv(0, 0, in.data(), in.size()), 1000), left);
  EXPECT_HAS(waitError(ts[1]->isend(0, 0, in.data(), in.size()), 1000), left);
}

TEST_F(TcpFaults, BrokenFramesCloseTheConnectionNamingThePeer) {
  struct Case {
    const char* name;
    std::vector<FrameHeader> frames;
    const char* expect;
  };
  FrameHeader unknown = frame(0, 100, 0, 100);
  unknown.opcode = static_cast<Opcode>(9);
  std::vector<Case> cases = {
      {"opcode", {unknown}, "unknown frame opcode 9"},
      {"overflow", {frame(0, 100, ~uint64_t(0) - 5, 10)}, "ends beyond the message"},
      {"backwards", {frame(0, 200000, 65536, 65536), frame(0, 200000, 0, 65536)}, "out-of-order"},
      {"tag", {frame(0, 200000, 0, 65536, 3), frame(0, 200000, 65536, 65536, 8)}, "tag 8"},
      {"source", {[] { auto h = frame(0, 10, 0, 10); h.source = 0; return h; }()}, "claims source"},
      // Note [Saying why on the way out]: a goodbye fails the pair with its
      // reason, control bytes shown as '?'; a malformed one is a broken frame.
      {"goodbye", {goodbye(0)}, "it left (no reason given)"},
      {"goodbye fields", {goodbye(0, 2)}, "goodbye frame of 0 bytes with non-zero message fields"},
      {"goodbye length", {goodbye(kMaxGoodbyeBytes + 1)}, "longer than 1024"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    FakeGroup g(c.name);
    std::vector<uint8_t> buf(200000);
    auto r = g.real->irecv(1, 3, buf.data(), 200000);
    for (auto& h : c.frames) {
      g.fake->frame(h);
      std::vector<uint8_t> payload(h.chunk < 70000 ? h.chunk : 0);
      g.fake->write(payload.data(), payload.size());
    }
    std::string e = waitError(r);
    EXPECT_HAS(e, c.expect);
    EXPECT_HAS(e, "rank 1 at 127.0.0.1:9");
  }
}

TEST_F(TcpFaults, AbortFromAnotherThreadFailsPendingAndLaterOps) {
  auto ts = connectGroup(2, [o = tcpOptions("abort")](int) { return o; });
  std::vector<uint8_t> buf(100);
  auto mine = ts[0]->irecv(1, 1, buf.data(), buf.size());
  auto theirs = ts[1]->irecv(0, 1, buf.data(), buf.size());
  std::thread([&] { ts[0]->abort("test abort"); }).join();
  EXPECT_HAS(waitError(mine), "aborted: test abort");
  EXPECT_HAS(waitError(ts[0]->isend(1, 2, buf.data(), 1), 1000), "aborted: test abort");
  std::string e = waitError(theirs);  // the peer sees rank 0 leave, and why
  EXPECT_HAS(e, "rank 0 at 127.0.0.1:");
  EXPECT_HAS(e, "it left: test abort");  // Note [Saying why on the way out]
  EXPECT_EQ(e.find("TIMEOUT"), std::string::npos) << e;
}

TEST_F(TcpFaults, AGoodbyeMidStreamFailsThePairWithItsReason) {
  FakeGroup g("goodbye");
  MidMessage m(g, 65536);
  const std::string why = "braid allreduce (rank 1): lost rank 3 on host 'h1'\n";
  g.fake->frame(goodbye(static_cast<uint32_t>(why.size())));
  g.fake->write(why.data(), why.size());
  for (auto& r : {m.r1, m.r2}) {
    std::string e = waitError(r);
    EXPECT_HAS(e, "rank 1 at 127.0.0.1:9");
    EXPECT_HAS(e, "it left: braid allreduce (rank 1): lost rank 3 on host 'h1'?");
  }
}

TEST_F(TcpFaults, ThreadsAndSocketsExistOnlyWhileTheGroupDoes) {
  auto ts = connectGroup(3, [o = tcpOptions("leaks", 3)](int) { return o; });
  EXPECT_EQ(testing::countThreadsNamed("braid-tcp"), 3);
  // Per rank: listener, epoll, eventfd, 2 peers x 3 sockets.
  EXPECT_EQ(testing::countFds() - fds_, 3 * (3 + 2 * 3));
  ts.clear();
}

}  // namespace
}  // namespace braid
