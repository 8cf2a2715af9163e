#include "c10d/flight_recorder.h"

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"

namespace braid {

// Note [Flight-recorder dumps]
// A dump is written (as `${BRAID_FR_DUMP_FILE}<rank>`, the rank in the
// process's first group, as torch's TORCH_FR_DUMP_TEMP_FILE):
// - on demand: torch_braid.fr.dump() (or its signal handler);
// - at exit, with BRAID_FR_DUMP_ON_EXIT (torch_braid registers it);
// - when an op fails with a timeout or a lost peer (BRAID_FR_DUMP_ON_TIMEOUT,
//   on by default: it writes only where BRAID_FR_DUMP_FILE names a place, so
//   one variable turns dumps on, and runs that did not ask get no files). That
//   rank also sets the group's store key fr/dump, and the others dump when
//   they see it. They look at two moments, with no thread of their own: when
//   one of their ops on the group fails (the ranks waiting with the failing
//   one time out themselves; one that is ahead gets a mismatch), and when the
//   group is shut down or destroyed, which is where a rank that never arrived
//   usually goes next. A rank hung in Python for good writes nothing: the
//   others' dumps still name it (python -m torch_braid.fr).
// Each group dumps at most once on failure; a dump never throws into an op.
BRAID_SETTING_BOOL(kDumpOnTimeout, "BRAID_FR_DUMP_ON_TIMEOUT", true,
                   "Write the flight recorder's dump when an op times out or loses a peer, and "
                   "ask the group's other ranks to dump too (needs BRAID_FR_DUMP_FILE).");
BRAID_SETTING_STRING(kDumpFile, "BRAID_FR_DUMP_FILE", "",
                     "Path prefix of flight-recorder dumps; each rank writes <prefix><rank> "
                     "(e.g. /tmp/braid_fr_ gives /tmp/braid_fr_0). Empty: no dumps on failure "
                     "or exit.");
// Read by torch_braid's import, which registers the dump with atexit.
BRAID_SETTING_BOOL(kDumpOnExit, "BRAID_FR_DUMP_ON_EXIT", false,
                   "Write the flight recorder's dump when the Python process exits (needs "
                   "BRAID_FR_DUMP_FILE).");
// Off by default: reading the frames takes the GIL on the caller's thread,
// which costs far more than the rest of the record (microseconds, and a wait
// whenever another thread holds the GIL).
BRAID_SETTING_BOOL(kStacks, "BRAID_FR_STACKS", false,
                   "Record the Python stack of each op in the flight recorder (takes the GIL "
                   "per op; off by default).");

namespace {
std::atomic<StackCapture> stackCapture{nullptr};
std::atomic<int> groupsMade{0};

const char* opName(c10d::OpType t) {
  switch (t) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "_all_gather_base";
    case c10d::OpType::ALLGATHER_COALESCED: return "ALLGATHER_coalesced";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE: return "all_to_all_single";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::SEND: return "send";
    case c10d::OpType::RECV: return "recv";
    case c10d::OpType::RECVANYSOURCE: return "recv";
    case c10d::OpType::BARRIER: return "barrier";
    default: return "unknown";
  }
}

template <typename Add>
void addTensors(c10::ArrayRef<at::Tensor> ts, Add add) {
  for (const at::Tensor& t : ts) {
    if (!t.defined()) continue;
    auto sizes = t.sizes();
    if (!add(c10::toString(t.scalar_type()), sizes.data(), static_cast<int>(sizes.size()))) return;
  }
}

bool isCommFailure(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError&) {
    return true;
  } catch (const PeerLostError&) {
    return true;
  } catch (...) {
    return false;
  }
}
}  // namespace

void setStackCapture(StackCapture f) { stackCapture.store(f); }

bool dumpOnExit() { return kDumpOnExit.get(); }

GroupRecorder::GroupRecorder(c10::intrusive_ptr<c10d::Store> store, std::string storePrefix,
                             int rank, int size)
    : rank_(rank), store_(std::move(store)), key_(std::move(storePrefix) + "fr/dump") {
  fr::Recorder& r = fr::Recorder::global();
  if (!r.enabled()) return;
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  group_ = r.addGroup(std::to_string(groupsMade.fetch_add(1)), "undefined", ranks, rank);
  rec_ = &r;
  dumpFile_ = kDumpFile.get();
  dumpOnTimeout_ = kDumpOnTimeout.get();
  stacks_ = kStacks.get();
}

void GroupRecorder::describe(const std::string& name, const std::string& desc,
                             const std::vector<int>& ranks) {
  if (!rec_) return;
  rec_->setGroupName(group_, name, desc);
  if (!ranks.empty()) rec_->setGroupRanks(group_, ranks);
}

uint64_t GroupRecorder::record(c10d::OpType type, c10::ArrayRef<at::Tensor> inputs,
                               c10::ArrayRef<at::Tensor> outputs, int64_t timeoutMs, int peer) {
  if (!rec_) return 0;
  fr::Op op;
  op.group = group_;
  op.name = opName(type);
  op.isP2P = peer != -2;
  op.peer = peer;
  op.timeoutMs = timeoutMs;
  addTensors(inputs.empty() ? outputs : inputs,
             [&op](const char* d, const int64_t* s, int n) { return op.addInput(d, s, n); });
  addTensors(outputs,
             [&op](const char* d, const int64_t* s, int n) { return op.addOutput(d, s, n); });
  if (stacks_) {
    if (auto capture = stackCapture.load()) op.frames = capture();
  }
  return rec_->record(op);
}

void GroupRecorder::finished(uint64_t id, const std::exception_ptr& error) {
  if (!rec_) return;
  const bool comm = error && isCommFailure(error);
  if (id) rec_->finished(id, comm);
  if (!error) return;
  if (comm) {
    dumpOnFailure("a timeout or lost peer");
  } else {
    dumpIfAsked();
  }
}

void GroupRecorder::dumpOnFailure(const std::string& why) {
  if (!dumpOnTimeout_ || dumpFile_.empty() || dumped_.load()) return;
  try {
    std::string me = std::to_string(rank_);
    store_->set(key_, std::vector<uint8_t>(me.begin(), me.end()));
  } catch (const std::exception& e) {
    BRAID_LOG(kWarn, "fr", rank_) << "could not ask the other ranks to dump: " << e.what();
  }
  dump(why);
}

void GroupRecorder::dumpIfAsked() {
  if (!rec_ || !dumpOnTimeout_ || dumpFile_.empty() || dumped_.load()) return;
  try {
    if (!store_->check({key_})) return;
    auto v = store_->get(key_);
    dump("rank " + std::string(v.begin(), v.end()) + " asked for it");
  } catch (const std::exception& e) {
    BRAID_LOG(kInfo, "fr", rank_) << "could not look for a dump request: " << e.what();
  }
}

void GroupRecorder::dump(const std::string& why) {
  if (dumped_.exchange(true)) return;
  try {
    std::string path = dumpFlightRecorder(dumpFile_);
    BRAID_LOG(kWarn, "fr", rank_) << "flight recorder dumped to " << path << " (" << why << ")";
  } catch (const std::exception& e) {
    BRAID_LOG(kError, "fr", rank_) << e.what();
  }
}

std::string dumpFlightRecorder(const std::string& prefix) {
  fr::Recorder& r = fr::Recorder::global();
  std::string path = prefix + std::to_string(r.processRank());
  std::string error;
  if (!r.dumpToFile(path, &error)) throw Error("braid flight recorder: " + error);
  return path;
}

}  // namespace braid
