#include "transport/tcp/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "transport/tcp/socket.h"

namespace braid {
namespace transport {
namespace tcp {

// Note [Choosing the interface]
// A group listens on one address per rank, which its peers dial.
// BRAID_SOCKET_IFNAME takes NCCL_SOCKET_IFNAME's syntax, so that a
// cluster's existing value carries over:
//   - "eth,ib": a comma-separated list of name prefixes (eth0, eth1, ib0...);
//   - "=eth0": exact names;
//   - "^docker,lo": any interface except these prefixes ("^=docker0": except
//     these exact names).
// With a list, the first entry that matches an interface with a usable
// address wins, in the list's order; within an entry an exact name comes
// before the longer names it prefixes ("eth1" picks eth1 over eth10), then
// getifaddrs' order. With exclusions, the interface that routes to the
// store's host wins when it is allowed (it is what braid picks with no
// setting), else the first allowed one that is not loopback. Either way an
// interface's IPv4 address comes before its IPv6 one.
// GLOO_SOCKET_IFNAME (comma-separated exact names) applies when
// BRAID_SOCKET_IFNAME is unset: a script that ran on gloo keeps its network
// when it switches to braid.

// Note [A store on this host]
// Without a setting, a rank listens on the address that routes to the store's
// host, which its peers on other hosts can reach when the store is elsewhere.
// On the store's own host that route can be loopback: Debian and Ubuntu map a
// machine's own name to 127.0.1.1 in /etc/hosts, and torchrun's c10d
// rendezvous hands its workers the master's hostname, so the ranks there
// would listen on 127.0.0.1, which no other host can dial (gloo fails so:
// "connect [127.0.1.1]:6032: Connection refused"). A group that spans hosts (every
// TCP group braid makes: the hierarchy's) therefore takes such a loopback
// route, or no store host at all (a FileStore), as "this host": it listens
// on the first interface with a usable address that is neither loopback nor
// a container or VM bridge (docker*, virbr*), as NCCL does by default, and
// logs which. With no such interface it keeps loopback (one machine alone),
// or, with no store host, fails asking for BRAID_SOCKET_IFNAME.

namespace {

std::vector<std::string> splitNames(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string interfaceNames(const std::vector<LocalAddr>& addrs) {
  std::string names;
  for (size_t i = 0; i < addrs.size(); ++i) {
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen = seen || addrs[j].ifname == addrs[i].ifname;
    if (!seen) names += (names.empty() ? "" : ", ") + addrs[i].ifname;
  }
  return names.empty() ? "none" : names;
}

// The interface's IPv4 address, else its first IPv6 one; "" when none.
std::string addressOf(const std::vector<LocalAddr>& addrs, const std::string& ifname) {
  std::string v6;
  for (const auto& a : addrs) {
    if (a.ifname != ifname) continue;
    if (!a.v6) return a.host;
    if (v6.empty()) v6 = a.host;
  }
  return v6;
}

// The local address of a route to `storeHost`: connect() a UDP socket (which
// sends nothing) and read its local address. "" with `why` set on failure.
std::string routeTo(const std::string& storeHost, std::string* why) {
  SockAddr to;
  if (!resolveHost(storeHost, "9", 0, &to)) {
    *why = "cannot resolve the store's host '" + storeHost + "'";
    return "";
  }
  int fd = ::socket(to.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return "";
  }
  SockAddr local;
  local.len = sizeof(local.ss);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&to.ss), to.len) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&local.ss), &local.len) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) {
    *why = "no route to the store's host '" + storeHost + "': " + std::strerror(err);
    return "";
  }
  return numericHost(reinterpret_cast<sockaddr*>(&local.ss));
}

bool isLoopbackHost(const std::string& host) {
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

// Note [A store on this host]: the first interface that is not loopback nor
// a bridge; "" when there is none.
std::string outwardAddress(int rank) {
  try {
    return pickAddress("^docker,virbr", IfnameSyntax::kBraid, localAddrs(rank), "", rank);
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

const char* ifnameSetting(IfnameSyntax syntax) {
  return syntax == IfnameSyntax::kGloo ? "GLOO_SOCKET_IFNAME" : "BRAID_SOCKET_IFNAME";
}

std::string ifnameChoice(IfnameSyntax syntax, const std::string& value) {
  return std::string(ifnameSetting(syntax)) + "='" + value + "'";
}

std::vector<LocalAddr> localAddrs(int rank) {
  ifaddrs* ifs = nullptr;
  BRAID_ENFORCE(getifaddrs(&ifs) == 0, "tcp init", rank, "getifaddrs: ", std::strerror(errno));
  std::vector<LocalAddr> out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
      continue;
    }
    out.push_back({i->ifa_name, numericHost(i->ifa_addr), family == AF_INET6,
                   (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(ifs);
  return out;
}

std::string pickAddress(const std::string& spec, IfnameSyntax syntax,
                        const std::vector<LocalAddr>& addrs, const std::string& routed, int rank) {
  std::string rest = spec;
  bool exclude = false, exact = syntax == IfnameSyntax::kGloo;
  if (!exact && !rest.empty() && rest[0] == '^') {
    exclude = true;
    rest.erase(0, 1);
  }
  if (!exact && !rest.empty() && rest[0] == '=') {
    exact = true;
    rest.erase(0, 1);
  }
  const std::vector<std::string> names = splitNames(rest);
  const std::string choice = ifnameChoice(syntax, spec);
  for (const auto& n : names) {
    BRAID_ENFORCE(!n.empty(), "tcp init", rank, choice,
                  " has an empty interface name; expected e.g. eth0, eth (any eth*), "
                  "=eth0 (exactly eth0), eth0,ib0 (the first that exists), ^docker,lo (any "
                  "but those)");
  }
  auto matches = [&](const std::string& pattern, const std::string& name) {
    return exact ? name == pattern : name.compare(0, pattern.size(), pattern) == 0;
  };
  if (!exclude) {
    for (const auto& pattern : names) {
      std::string host = addressOf(addrs, pattern);  // the exact name first
      for (size_t i = 0; host.empty() && i < addrs.size(); ++i) {
        if (matches(pattern, addrs[i].ifname)) host = addressOf(addrs, addrs[i].ifname);
      }
      if (!host.empty()) return host;
    }
  } else {
    auto allowed = [&](const LocalAddr& a) {
      if (a.loopback) return false;
      for (const auto& pattern : names) {
        if (matches(pattern, a.ifname)) return false;
      }
      return true;
    };
    for (const auto& a : addrs) {
      if (!routed.empty() && a.host == routed && allowed(a)) return a.host;
    }
    for (const auto& a : addrs) {
      if (allowed(a)) return addressOf(addrs, a.ifname);
    }
  }
  BRAID_THROW(Error, "tcp init", rank, choice, " matches no ",
              exclude ? "allowed non-loopback " : "", "interface with a usable address; ",
              "interfaces with addresses: ", interfaceNames(addrs));
}

std::string chooseHost(const std::string& ifname, IfnameSyntax syntax,
                       const std::string& storeHost, bool acrossHosts, int rank) {
  std::string why;
  if (!ifname.empty()) {
    const bool excludes = syntax == IfnameSyntax::kBraid && ifname[0] == '^';
    const std::string routed = excludes && !storeHost.empty() ? routeTo(storeHost, &why) : "";
    return pickAddress(ifname, syntax, localAddrs(rank), routed, rank);
  }
  std::string host = "127.0.0.1";
  if (!storeHost.empty()) {
    host = routeTo(storeHost, &why);
    BRAID_ENFORCE(!host.empty(), "tcp init", rank, why, " (set BRAID_SOCKET_IFNAME)");
  }
  if (!acrossHosts || !isLoopbackHost(host)) return host;
  // Note [A store on this host]
  const std::string outward = outwardAddress(rank);
  BRAID_ENFORCE(!outward.empty() || !storeHost.empty(), "tcp init", rank,
                "the group spans hosts, the store has no host to route to (not a TCPStore, "
                "and MASTER_ADDR is unset), and this host has no interface with an address "
                "other than loopback or a bridge; set BRAID_SOCKET_IFNAME");
  if (outward.empty()) return host;
  BRAID_LOG(kInfo, "tcp", rank)
      << (storeHost.empty() ? std::string("no store host to route to")
                            : "the store's host '" + storeHost + "' is this host (through " +
                                  host + ")")
      << ": listening on " << outward << " so that the other hosts can reach this rank";
  return outward;
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
