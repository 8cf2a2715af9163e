// torch_braid._C.cores_info: the cores this process may use and the spin
// policy a group of a given size would get here (Notes [Counting cores] and
// [How long to spin] in common/cpu_cores.h), for `python -m torch_braid.info`.
#include <pybind11/stl.h>

#include "python/python_parts.h"
#include "common/cpu_cores.h"
#include "common/rank_pinning.h"

namespace py = pybind11;

BRAID_PY_PART(cores, m) {
  m.def(
      "cores_info",
      [](int ranksHere) {
        const braid::UsableCores u = braid::usableCores();
        py::dict d;
        d["affinity"] = u.affinity;
        d["quota_cores"] = u.quotaCores;
        d["quota_file"] = u.quotaFile;
        d["cores"] = u.cores;
        d["describe"] = u.describe();
        // Note [Pinning ranks on a full host]
        d["bound_by_braid"] = braid::affinityBeforePinning() > 0;
        if (ranksHere > 0) {
          // As a group would choose it, without logging.
          d["policy"] = braid::chooseSpinPolicy(u.cores, ranksHere, braid::kBraidThreadsPerRank,
                                                -1, -1)
                            .describe();
          d["pinning"] = braid::choosePinHere(braid::pinModeFromSetting(-1), 0, ranksHere).why;
        }
        return d;
      },
      py::arg("ranks_here") = 0,
      "The cores this process may run on (affinity cut by the cgroup CPU quota) and, for "
      "ranks_here > 0, the automatic spin policy of a group with that many ranks on this host.");
}
