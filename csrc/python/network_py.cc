// torch_braid._C.network_info: what `python -m torch_braid.info` shows about
// the network a group across hosts would use, before any job starts: the
// interfaces, the congestion control, and the address this process would
// listen on (Notes [Choosing the interface], [A store on this host] and
// [Congestion control] in transport/tcp/).
#include <pybind11/stl.h>

#include <cstdlib>

#include "python/python_parts.h"
#include "common/error.h"
#include "transport/tcp/interfaces.h"
#include "transport/tcp/options.h"
#include "transport/tcp/socket.h"

namespace py = pybind11;

namespace braid {
namespace {

// As a group across hosts would choose it, with MASTER_ADDR as the store's
// host (a TCPStore's own host wins in a real group).
py::dict listenChoice() {
  namespace tcp = transport::tcp;
  py::dict d;
  const char* master = std::getenv("MASTER_ADDR");
  const std::string storeHost = master ? master : "";
  try {
    const auto o = tcp::TcpOptions::fromEnv(0, 2);
    const std::string host = tcp::chooseHost(o.ifname, o.ifnameSyntax, storeHost, true, 0);
    d["host"] = host;
    if (!o.ifname.empty()) {
      d["how"] = tcp::ifnameChoice(o.ifnameSyntax, o.ifname);
    } else if (storeHost.empty()) {
      d["how"] = "no MASTER_ADDR: the first outward interface";
    } else if (tcp::chooseHost("", o.ifnameSyntax, storeHost, false, 0) != host) {
      d["how"] = "MASTER_ADDR '" + storeHost + "' is this host: its first outward interface";
    } else {
      d["how"] = "the route to MASTER_ADDR '" + storeHost + "'";
    }
    d["congestion"] = o.congestion;
  } catch (const Error& e) {
    d["error"] = std::string(e.what());
  }
  return d;
}

}  // namespace
}  // namespace braid

BRAID_PY_PART(network, m) {
  m.def(
      "network_info",
      [] {
        py::dict d;
        py::list ifs;
        try {
          for (const auto& a : braid::transport::tcp::localAddrs(0)) {
            ifs.append(py::make_tuple(a.ifname, a.host, a.loopback));
          }
        } catch (const braid::Error&) {
          // getifaddrs failed: listen's "error" says so too
        }
        d["interfaces"] = ifs;
        d["system_congestion"] = braid::transport::tcp::congestionSetting("");
        d["allowed_congestion"] = braid::transport::tcp::congestionSetting("allowed_");
        d["listen"] = braid::listenChoice();
        return d;
      },
      "The interfaces, TCP congestion control and listening address a group across hosts "
      "would use here (MASTER_ADDR as the store's host).");
}
