// What the simulated NCCL's tasks do on the stream threads (Note [Simulated
// NCCL] in nccl_sim.h): rendezvous, check, compute on host memory.
#include <cstring>
#include <vector>

#include "common/error.h"
#include "sim/nccl/nccl_sim_internal.h"
#include "math/reduce.h"

namespace braid {
namespace cuda {
namespace simnccl {

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "allReduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kAllGather:
      return "allGather";
    case Kind::kReduceScatter:
      return "reduceScatter";
    case Kind::kSend:
      return "send";
    case Kind::kRecv:
      return "recv";
  }
  return "?";
}

namespace {

DataType braidType(NcclDataType t) {
  switch (t) {
    case kNcclInt8:
      return DataType::kInt8;
    case kNcclUint8:
      return DataType::kUInt8;
    case kNcclInt32:
      return DataType::kInt32;
    case kNcclInt64:
      return DataType::kInt64;
    case kNcclFloat16:
      return DataType::kFloat16;
    case kNcclFloat32:
      return DataType::kFloat32;
    case kNcclFloat64:
      return DataType::kFloat64;
    case kNcclBfloat16:
      return DataType::kBFloat16;
    default:
      break;
  }
  throw Error("simulated NCCL: unsupported data type");  // submit() checked it
}

ReduceOp braidOp(NcclRedOp op) {
  switch (op) {
    case kNcclProd:
      return ReduceOp::kProduct;
    case kNcclMax:
      return ReduceOp::kMax;
    case kNcclMin:
      return ReduceOp::kMin;
    default:
      return ReduceOp::kSum;  // sum, avg, premul
  }
}

// What rank `me` must find equal in every rank's call.
std::string mismatch(const std::vector<Call>& calls) {
  const Call& a = calls[0];
  for (size_t r = 1; r < calls.size(); ++r) {
    const Call& b = calls[r];
    if (b.kind != a.kind) {
      return strCat("rank 0 runs ", kindName(a.kind), ", rank ", r, " ", kindName(b.kind));
    }
    if (b.count != a.count || b.type != a.type || b.root != a.root || b.premul != a.premul ||
        (!a.premul && b.op != a.op)) {
      return strCat(kindName(a.kind), ": rank 0 has count ", a.count, " type ", a.type, " op ",
                    a.op, " root ", a.root, ", rank ", r, " count ", b.count, " type ", b.type,
                    " op ", b.op, " root ", b.root);
    }
  }
  return "";
}

// This rank's result of a collective whose every call is in `calls`, into
// `out` (sized here); false when this rank writes nothing (reduce off root).
bool compute(const std::vector<Call>& calls, int me, std::vector<uint8_t>& out) {
  const Call& mine = calls[me];
  const int n = static_cast<int>(calls.size());
  const DataType t = braidType(mine.type);
  const size_t es = elementSize(t);
  const size_t bytes = mine.count * es;
  if (mine.kind == Kind::kBroadcast) {
    out.assign(static_cast<const uint8_t*>(calls[mine.root].send),
               static_cast<const uint8_t*>(calls[mine.root].send) + bytes);
    return true;
  }
  if (mine.kind == Kind::kAllGather) {
    out.resize(bytes * n);
    for (int r = 0; r < n; ++r) std::memcpy(out.data() + r * bytes, calls[r].send, bytes);
    return true;
  }
  if (mine.kind == Kind::kReduce && me != mine.root) return false;
  // A reduction: of whole buffers, or of block `me` for reduceScatter.
  const size_t offset = mine.kind == Kind::kReduceScatter ? me * bytes : 0;
  std::vector<std::vector<uint8_t>> scaled(mine.premul ? n : 0);
  std::vector<const void*> srcs(n);
  for (int r = 0; r < n; ++r) {
    srcs[r] = static_cast<const uint8_t*>(calls[r].send) + offset;
    if (mine.premul) {  // each rank's input times that rank's own factor
      scaled[r].resize(bytes);
      reduce::scale(t, scaled[r].data(), srcs[r], calls[r].scalar, mine.count);
      srcs[r] = scaled[r].data();
    }
  }
  out.resize(bytes);
  if (mine.count == 0) return true;
  reduce::reduceN(t, braidOp(mine.op), out.data(), srcs.data(), n, mine.count);
  if (mine.op == kNcclAvg) reduce::divide(t, out.data(), out.data(), n, mine.count);
  return true;
}

// Fails `comm` with `code` (e.g. a bad argument found at run time).
void failLocked(Comm& comm, NcclResult code, const std::string& text) {
  comm.error = code;
  comm.errorText = "simulated NCCL: " + text;
  comm.clique->cv.notify_all();
}

// The collective `call`; returns false when the communicator stopped.
bool collective(Comm& comm, std::unique_lock<std::mutex>& lock, const Call& call) {
  Clique& q = *comm.clique;
  const int n = q.nranks;
  Round& round = q.rounds[call.seq];
  if (round.calls.empty()) round.calls.resize(n);
  round.calls[comm.rank] = call;
  if (++round.arrived == n) {
    std::string bad = mismatch(round.calls);
    if (!bad.empty() && !q.broken) {
      q.broken = true;
      q.brokenCode = kNcclInvalidUsage;
      q.brokenWhy = "simulated NCCL: the ranks disagree: " + bad;
    }
    q.cv.notify_all();
  }
  q.cv.wait(lock, [&] { return round.arrived == n || comm.stopped(); });
  if (comm.stopped()) return false;
  std::vector<Call> calls = round.calls;  // the peers' tasks may end on an abort
  lock.unlock();
  std::vector<uint8_t> result;
  bool write = false;
  std::string error;
  try {
    write = compute(calls, comm.rank, result);
  } catch (const std::exception& e) {
    error = e.what();
  }
  lock.lock();
  if (!error.empty()) {
    failLocked(comm, kNcclInternalError, error);
    return false;
  }
  // Every rank has read every input before anyone writes an output.
  if (++round.read == n) q.cv.notify_all();
  q.cv.wait(lock, [&] { return round.read == n || comm.stopped(); });
  if (comm.stopped()) return false;
  if (write && !result.empty()) std::memcpy(call.recv, result.data(), result.size());
  if (++round.left == n) q.rounds.erase(call.seq);
  return true;
}

bool receive(Comm& comm, std::unique_lock<std::mutex>& lock, const Call& call) {
  Clique& q = *comm.clique;
  auto& queue = q.posts[{call.root, comm.rank}];
  q.cv.wait(lock, [&] { return !queue.empty() || comm.stopped(); });
  if (comm.stopped()) return false;
  std::shared_ptr<Post> post = queue.front();
  queue.pop_front();
  const size_t bytes = call.count * elementSize(braidType(call.type));
  if (post->bytes != bytes) {
    failLocked(comm, kNcclInvalidUsage,
               strCat("rank ", comm.rank, " receives ", bytes, " bytes from rank ", call.root,
                      ", which sent ", post->bytes));
    post->consumed = true;
    q.cv.notify_all();
    return false;
  }
  lock.unlock();
  if (bytes) std::memcpy(call.recv, post->buf, bytes);
  lock.lock();
  post->consumed = true;
  q.cv.notify_all();
  return true;
}

}  // namespace

void runTask(const std::shared_ptr<Comm>& commPtr, std::deque<Call>& calls) {
  Comm& comm = *commPtr;
  Clique& q = *comm.clique;
  std::unique_lock<std::mutex> lock(q.mu);
  if (comm.hang) {  // a kernel that never finishes, until aborted
    comm.hang = false;
    q.cv.wait(lock, [&] { return comm.aborted || comm.destroyed; });
    return;
  }
  if (comm.stopped()) return;
  std::vector<std::shared_ptr<Post>> sent;
  for (const Call& call : calls) {
    if (call.kind != Kind::kSend) continue;
    auto post = std::make_shared<Post>();
    post->buf = call.send;
    post->bytes = call.count * elementSize(braidType(call.type));
    q.posts[{comm.rank, call.root}].push_back(post);
    sent.push_back(post);
  }
  if (!sent.empty()) q.cv.notify_all();
  for (const Call& call : calls) {
    bool ok = true;
    if (call.kind == Kind::kRecv) {
      ok = receive(comm, lock, call);
    } else if (call.kind != Kind::kSend) {
      ok = collective(comm, lock, call);
    }
    if (!ok) return;
  }
  // A send's buffer is the sender's again once its receive has copied it.
  for (auto& post : sent) {
    q.cv.wait(lock, [&] { return post->consumed || comm.stopped(); });
    if (comm.stopped()) return;
  }
}

}  // namespace simnccl
}  // namespace cuda
}  // namespace braid
