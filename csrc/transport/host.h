// Host identity, to decide per group which ranks share memory.
#pragma once

#include <string>

namespace braid {
namespace transport {

// hostname + boot id + pid namespace + the /dev/shm mount: two processes with
// the same identity can map each other's shared memory and see each other's
// pids. The hostname comes first (errors name a host by it).
// BRAID_HOST_ID_OVERRIDE replaces it (tests simulate several hosts with it).
std::string hostIdentity();

}  // namespace transport
}  // namespace braid
