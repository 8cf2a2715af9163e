// Socket helpers for the TCP transport: addresses, the listening socket,
// non-blocking dials. Every error names the op, the rank and the address.
#pragma once

#include <sys/socket.h>

#include <string>

namespace braid {
namespace transport {
namespace tcp {

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string str() const;  // "10.0.0.2:41234", "[fe80::1]:41234"
};

// The numeric host of an AF_INET or AF_INET6 address ("?" for others).
std::string numericHost(const sockaddr* sa);
// getaddrinfo's first answer for host:port; false when there is none.
bool resolveHost(const std::string& host, const char* port, int flags, SockAddr* out);

// Parses SockAddr::str() (numeric hosts only).
SockAddr parseAddr(const std::string& s, int rank);

// A non-blocking listening socket on `host`, port chosen by the kernel.
int listenOn(const std::string& host, int rank, SockAddr* bound);

// Starts a non-blocking connect (TCP_NODELAY set); completion shows as writable.
int dialStart(const SockAddr& to, int rank);
// After the socket became writable: "" when connected, else why not.
std::string dialResult(int fd);

// The address of the other end of a connected socket ("?" when unknown).
std::string peerAddress(int fd);
void setNoDelay(int fd);

// Note [Congestion control]: the socket's congestion control, by name ("" =
// the system's); false, with errno, when the kernel refuses it (the
// transport's sockets ignore that: checkCongestion has vetted the name).
// checkCongestion throws an Error naming "tcp init", the rank,
// BRAID_TCP_CONGESTION, the name, why and what the kernel allows.
bool setCongestion(int fd, const std::string& name);
void checkCongestion(const std::string& name, int rank);
// /proc/sys/net/ipv4/tcp_<which>congestion_control's line ("" = the
// system's default, "allowed_", "available_"); "unknown" when unreadable.
std::string congestionSetting(const char* which);

}  // namespace tcp
}  // namespace transport
}  // namespace braid
