#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.h"

namespace braid {
namespace transport {
namespace tcp {
std::string numericHost(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool resolveHost(const std::string& host, const char* port, int flags, SockAddr* out) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  if (getaddrinfo(host.c_str(), port, &hints, &res) != 0 || !res) return false;
  std::memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
  out->len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

std::string SockAddr::str() const {
  const auto* sa = reinterpret_cast<const sockaddr*>(&ss);
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  std::string h = numericHost(sa);
  if (sa->sa_family == AF_INET6) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

SockAddr parseAddr(const std::string& s, int rank) {
  auto colon = s.rfind(':');
  BRAID_ENFORCE(colon != std::string::npos, "tcp connect", rank, "bad address '", s, "'");
  std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  SockAddr a;
  BRAID_ENFORCE(resolveHost(host, port.c_str(), AI_NUMERICHOST | AI_NUMERICSERV, &a), "tcp connect",
                rank, "bad address '", s, "'");
  return a;
}

int listenOn(const std::string& host, int rank, SockAddr* bound) {
  SockAddr a;
  BRAID_ENFORCE(resolveHost(host, "0", AI_NUMERICHOST | AI_PASSIVE, &a), "tcp listen", rank,
                "bad host '", host, "'");
  int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  BRAID_ENFORCE(fd >= 0, "tcp listen", rank, "socket: ", std::strerror(errno));
  bound->len = sizeof(bound->ss);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a.ss), a.len) != 0 || ::listen(fd, 512) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound->ss), &bound->len) != 0) {
    int err = errno;
    ::close(fd);
    BRAID_THROW(Error, "tcp listen", rank, "on ", host, ": ", std::strerror(err));
  }
  return fd;
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Note [Congestion control]
// Each socket takes the system's congestion control unless
// BRAID_TCP_CONGESTION names another. The choice matters to bulk transfers
// between hosts: on this project's 2-core VM, whose default is bbr (paced by
// the kernel's timers, as its qdisc is not fq), a 2 hosts x 1 rank allreduce
// of 64 MiB over veth took 29-34 ms with reno against 44-65 ms with bbr
// (medians of 4 alternating runs of 60 ops, benchmarks/results/hosts-congestion.txt).
// braid does not override the system by default: the administrator chose it
// for the network (bbr copes better with shallow-buffered, lossy paths), so
// the setting is for the job that knows its fabric. The kernel lets an
// unprivileged process pick only what tcp_allowed_congestion_control lists.
bool setCongestion(int fd, const std::string& name) {
  return name.empty() || setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                                    static_cast<socklen_t>(name.size())) == 0;
}

std::string congestionSetting(const char* which) {
  std::ifstream f(std::string("/proc/sys/net/ipv4/tcp_") + which + "congestion_control");
  std::string line;
  return f && std::getline(f, line) ? line : "unknown";
}

void checkCongestion(const std::string& name, int rank) {
  if (name.empty()) return;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  BRAID_ENFORCE(fd >= 0, "tcp init", rank, "socket: ", std::strerror(errno));
  const bool ok = setCongestion(fd, name);
  const int err = errno;
  ::close(fd);
  if (ok) return;
  BRAID_THROW(Error, "tcp init", rank, "BRAID_TCP_CONGESTION='", name, "': ", std::strerror(err),
              " (this process may pick: ", congestionSetting("allowed_"), ")");
}

int dialStart(const SockAddr& to, int rank) {
  int fd = ::socket(to.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  BRAID_ENFORCE(fd >= 0, "tcp connect", rank, "socket: ", std::strerror(errno));
  setNoDelay(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to.ss), to.len) != 0 && errno != EINPROGRESS) {
    int err = errno;
    ::close(fd);
    BRAID_THROW(Error, "tcp connect", rank, "to ", to.str(), ": ", std::strerror(err));
  }
  return fd;
}

std::string dialResult(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  return err ? std::strerror(err) : "";
}

std::string peerAddress(int fd) {
  SockAddr a;
  a.len = sizeof(a.ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0) return "?";
  return a.str();
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
