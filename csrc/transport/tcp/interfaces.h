// Which local address a TCP group listens on: BRAID_SOCKET_IFNAME (or gloo's
// GLOO_SOCKET_IFNAME), else the address that routes to the store's host.
#pragma once

#include <string>
#include <vector>

namespace braid {
namespace transport {
namespace tcp {

// The setting that named the interfaces, which fixes their syntax (Note
// [Choosing the interface]).
enum class IfnameSyntax {
  kBraid,  // BRAID_SOCKET_IFNAME: NCCL_SOCKET_IFNAME's prefixes, "=" and "^"
  kGloo,   // GLOO_SOCKET_IFNAME: exact names
};
const char* ifnameSetting(IfnameSyntax syntax);
// "BRAID_SOCKET_IFNAME='eth0'": the setting and its value, as logs, errors and
// torch_braid.info quote them.
std::string ifnameChoice(IfnameSyntax syntax, const std::string& value);

// One usable address of a local interface: IPv4, or IPv6 other than
// link-local (which needs a scope id no peer could know).
struct LocalAddr {
  std::string ifname;
  std::string host;  // numeric
  bool v6 = false;
  bool loopback = false;
};

// This machine's usable addresses, in getifaddrs order.
std::vector<LocalAddr> localAddrs(int rank);

// The host to listen on among `addrs` for the interface list `spec`;
// `routed` is the address that routes to the store ("" when unknown), which
// an exclusion list prefers when it allows it. Throws an Error naming "tcp
// init", `rank`, the setting, its value and the interfaces there are when
// the value is malformed or matches no address.
std::string pickAddress(const std::string& spec, IfnameSyntax syntax,
                        const std::vector<LocalAddr>& addrs, const std::string& routed, int rank);

// The host to listen on: pickAddress over this machine's addresses when
// `ifname` is set, else the local address that routes to `storeHost`, else
// loopback. When `acrossHosts` (every peer is on another host), a loopback
// answer becomes this host's first outward interface (Note [A store on this
// host]).
std::string chooseHost(const std::string& ifname, IfnameSyntax syntax,
                       const std::string& storeHost, bool acrossHosts, int rank);

}  // namespace tcp
}  // namespace transport
}  // namespace braid
