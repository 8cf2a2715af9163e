// Helpers for the TCP transport tests: groups of threads as ranks over
// loopback, byte patterns, leak counters, and a hand-driven peer that speaks
// the protocol itself (to send broken frames or vanish mid-message).
#pragma once

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "memory_store.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/transport.h"

namespace braid {
namespace testing {

using transport::Clock;
using transport::Transport;
using transport::tcp::TcpOptions;

inline TcpOptions tcpOptions(const std::string& group, int sockets = 2) {
  static std::atomic<int> serial{0};
  TcpOptions o;
  o.groupId = group + "/" + std::to_string(serial++);
  o.socketsPerPeer = sockets;
  o.chunkBytes = 64 << 10;  // the smallest: more chunks, more striping
  o.secret = "test-secret-0123456789";
  o.timeout = std::chrono::milliseconds(5000);
  return o;
}

// Connects `size` ranks on threads; opts(rank) gives each rank's options.
inline std::vector<std::unique_ptr<Transport>> connectGroup(
    int size, const std::function<TcpOptions(int)>& opts, MemoryStore* store = nullptr) {
  MemoryStore local;
  if (!store) store = &local;
  std::vector<std::unique_ptr<Transport>> ts(size);
  runRanks(size, [&](int r) { ts[r] = transport::tcp::connect(*store, r, size, opts(r)); });
  return ts;
}

inline uint8_t pattern(int src, int dst, uint64_t tag, size_t i) {
  return static_cast<uint8_t>(src * 131 + dst * 31 + tag * 17 + i * 7 + (i >> 9));
}

inline std::vector<uint8_t> patterned(int src, int dst, uint64_t tag, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(src, dst, tag, i);
  return v;
}

inline Clock::time_point after(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

inline int countFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

inline int countThreadsNamed(const std::string& name) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    std::getline(f, comm);
    if (comm == name) ++n;
  }
  closedir(d);
  return n;
}

// A raw TCP connection to `addr` ("host:port").
inline int rawConnect(const std::string& addr) {
  auto a = transport::tcp::parseAddr(addr, -1);
  int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a.ss), a.len) != 0) {
    ::close(fd);
    throw Error("rawConnect to " + addr + " failed");
  }
  return fd;
}

// Whether the other end closed `fd` (EOF or reset) within `ms`.
inline bool closedByPeer(int fd, int ms) {
  auto deadline = after(ms);
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

// Plays rank `rank` of a group by hand: dials `peer` (socket 0 of 1) and
// authenticates with the library's own Handshake, then writes raw bytes.
class FakePeer {
 public:
  FakePeer(const TcpOptions& o, int rank, int size, int peer, const std::string& peerAddr) {
    id_.group = o.groupId;
    id_.secret = o.secret;
    id_.rank = rank;
    id_.size = size;
    id_.socketsPerPeer = o.socketsPerPeer;
    fd_ = rawConnect(peerAddr);
    transport::tcp::Handshake hs(id_, peer, 0);
    auto deadline = after(5000);
    for (;;) {
      auto s = hs.advance(fd_);  // blocking socket: each call finishes a step
      if (s == transport::tcp::Handshake::Step::kDone) break;
      if (s == transport::tcp::Handshake::Step::kFailed || Clock::now() > deadline) {
        closeNow();
        throw Error("FakePeer handshake failed: " + hs.why());
      }
    }
  }
  ~FakePeer() { closeNow(); }
  void frame(const transport::tcp::FrameHeader& h) {
    uint8_t b[transport::tcp::kFrameHeaderBytes];
    transport::tcp::encodeFrame(h, b);
    write(b, sizeof(b));
  }
  void write(const void* p, size_t n) {
    if (::send(fd_, p, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) throw Error("FakePeer: short send");
  }
  // Closes with a reset (SO_LINGER 0) or a plain FIN.
  void closeNow(bool reset = false) {
    if (fd_ < 0) return;
    if (reset) {
      linger l{1, 0};
      setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    ::close(fd_);
    fd_ = -1;
  }

 private:
  transport::tcp::HandshakeIdentity id_;
  int fd_ = -1;
};

}  // namespace testing
}  // namespace braid
