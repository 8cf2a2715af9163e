// The simulated NCCL's state (Note [Simulated NCCL] in nccl_sim.h), shared
// by nccl_sim.cc (the API) and nccl_sim_task.cc (what runs on the streams).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/nccl/nccl_api.h"

namespace braid {
namespace cuda {
namespace simnccl {

using Clock = std::chrono::steady_clock;

enum class Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv };
const char* kindName(Kind k);

struct Comm;

// One call, as its task runs it.
struct Call {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // recvCount for reduceScatter, sendCount for allGather
  NcclDataType type = kNcclInt8;
  NcclRedOp op = kNcclSum;
  bool premul = false;
  double scalar = 1.0;  // premul: this rank's factor
  int root = 0;         // the root, or the peer of a send/recv
  uint64_t seq = 0;     // collectives: the communicator's n-th collective
  std::shared_ptr<Comm> comm;
  Stream stream = nullptr;
};

// One collective across the clique (by seq).
struct Round {
  std::vector<Call> calls;  // by rank, filled on arrival
  int arrived = 0;
  int read = 0;  // ranks done reading every input
  int left = 0;  // ranks done with the round
};

// A posted send, until its receive copied it.
struct Post {
  const void* buf;
  size_t bytes;
  bool consumed = false;
};

struct Clique {
  std::string id;
  int nranks = 0;
  std::mutex mu;  // guards everything here and every member Comm's state
  std::condition_variable cv;
  std::vector<bool> joined;
  int joinedCount = 0;
  Clock::time_point readyAt = Clock::time_point::max();
  bool broken = false;  // a member aborted, or members disagreed
  NcclResult brokenCode = kNcclRemoteError;
  std::string brokenWhy;
  std::map<uint64_t, Round> rounds;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Post>>> posts;  // (src, dst)

  bool ready(Clock::time_point now) const { return joinedCount == nranks && now >= readyAt; }
};

struct Comm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  bool blocking = true;
  int device = 0;  // the creating thread's current device, as NCCL takes it
  NcclComm handle = nullptr;
  // Under clique->mu:
  NcclResult error = kNcclSuccess;  // injected
  std::string errorText;
  bool aborted = false;
  bool destroyed = false;
  bool hang = false;   // the next task blocks until aborted
  int inProgress = 0;  // deferred enqueues not yet made
  uint64_t nextSeq = 0;
  std::map<NcclRedOp, double> premulOps;  // created ops and their factors
  NcclRedOp nextOp = 5;                   // ncclNumOps: the first custom op

  // Whether this communicator's tasks must end now (under clique->mu).
  bool stopped() const { return aborted || destroyed || error != kNcclSuccess || clique->broken; }
};

// Runs `calls` (one communicator's, in order) on the calling stream thread.
void runTask(const std::shared_ptr<Comm>& comm, std::deque<Call>& calls);

}  // namespace simnccl
}  // namespace cuda
}  // namespace braid
