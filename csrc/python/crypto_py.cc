// torch_braid._C.crypto_info(): the libcrypto that authenticates TCP groups,
// for `python -m torch_braid.info` (Note [libcrypto at run time]).
#include <pybind11/pybind11.h>

#include "python/python_parts.h"
#include "transport/tcp/auth.h"

namespace py = pybind11;

BRAID_PY_PART(crypto, m) {
  m.def(
      "crypto_info",
      [] {
        // Loads it, as the first TCP group would: the answer is this process's.
        const auto info = braid::transport::tcp::cryptoInfo();
        py::dict d;
        d["loaded"] = info.loaded;
        d["path"] = info.path;
        d["version"] = info.version;
        d["how"] = info.how;
        d["error"] = info.error;
        return d;
      },
      "Where OpenSSL's libcrypto, which authenticates TCP groups, was loaded from, or why it "
      "could not be.");
}
