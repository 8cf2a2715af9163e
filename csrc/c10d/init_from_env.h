// Process-group setup from the variables torchrun sets, for C++ programs:
//
//   auto env = braid::init_from_env();   // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   braid::DistributedDataParallel ddp(net, env.process_group);
#pragma once

#include <chrono>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace braid {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // LOCAL_RANK, or 0 when unset
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;  // braid
};

// Reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (required) and
// LOCAL_RANK, connects to the TCPStore (rank 0 hosts it, unless torchrun's
// agent already does: TORCHELASTIC_USE_AGENT_STORE=True) and creates a braid
// process group. Throws braid::Error naming a missing or malformed variable.
DistEnv init_from_env(std::chrono::milliseconds timeout = std::chrono::minutes(30));

}  // namespace braid
