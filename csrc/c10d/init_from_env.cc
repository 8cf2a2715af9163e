#include "c10d/init_from_env.h"

#include <cerrno>
#include <cstdlib>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "c10d/process_group.h"
#include "common/error.h"
#include "common/logging.h"

namespace braid {
namespace {

const char* kWhy =
    " (set by torchrun; for a manual launch set RANK, WORLD_SIZE, MASTER_ADDR "
    "and MASTER_PORT)";

std::string requireEnv(const char* name) {
  const char* v = std::getenv(name);
  BRAID_ENFORCE(v && *v, "init_from_env", -1, "environment variable ", name, " is not set", kWhy);
  return v;
}

int64_t parseInt(const char* name, const std::string& value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(value.c_str(), &end, 10);
  BRAID_ENFORCE(errno == 0 && end != value.c_str() && *end == '\0' && x >= lo && x <= hi,
                "init_from_env", -1, "environment variable ", name, "='", value,
                "' is not an integer in [", lo, ", ", hi, "]");
  return x;
}

}  // namespace

DistEnv init_from_env(std::chrono::milliseconds timeout) {
  DistEnv env;
  env.world_size = static_cast<int>(parseInt("WORLD_SIZE", requireEnv("WORLD_SIZE"), 1, 1 << 20));
  env.rank = static_cast<int>(parseInt("RANK", requireEnv("RANK"), 0, env.world_size - 1));
  const std::string addr = requireEnv("MASTER_ADDR");
  const auto port =
      static_cast<uint16_t>(parseInt("MASTER_PORT", requireEnv("MASTER_PORT"), 1, 65535));
  const char* localRank = std::getenv("LOCAL_RANK");
  if (localRank && *localRank) {
    env.local_rank = static_cast<int>(parseInt("LOCAL_RANK", localRank, 0, 1 << 20));
  }
  // torchrun's agent hosts a store on MASTER_PORT already: every worker is a
  // client then, under the per-attempt prefix torch.distributed uses.
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agentStore = agent && std::string(agent) == "True";
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = !agentStore && env.rank == 0;
  opts.numWorkers = static_cast<size_t>(env.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  opts.multiTenant = !agentStore;
  compat::applyLibuvSetting(&opts);
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
  if (agentStore) {
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    store = c10::make_intrusive<c10d::PrefixStore>(
        std::string("/worker/attempt_") + (attempt && *attempt ? attempt : "0"), store);
  }
  env.store = c10::make_intrusive<c10d::PrefixStore>("braid_default_pg", store);
  env.process_group = createProcessGroup(env.store, env.rank, env.world_size, timeout);
  BRAID_LOG(kInfo, "init", env.rank) << "joined " << env.world_size << " ranks via " << addr << ':'
                                     << port << (agentStore ? " (agent store)" : "");
  return env;
}

}  // namespace braid
