// The flight recorder: a per-process ring buffer of the last
// BRAID_FR_BUFFER_SIZE ops of every braid group, dumped in the pickle layout
// of PyTorch's flight recorder (torch/csrc/distributed/c10d/FlightRecorder*)
// so that torch's tools and `python -m torch_braid.fr` can read it.
// Torch-free: the backend fills an fr::Op per op; tests drive it directly.
//
// Note [Flight recorder]
// Each op is recorded three times: scheduled (on the caller's thread, at
// launch), started (on the thread that runs it: the worker or a waiting
// caller) and completed (same thread). An op that failed with a timeout or a
// lost peer stays "started" (and retired), as in torch, where the watchdog
// never sees such a kernel finish: a rank that is behind then shows as the
// one without an entry for that sequence number. An op dropped at shutdown
// stays "scheduled".
//
// Cost (measured on 4-byte allreduce, benchmarks/results/fr-overhead.txt):
// no heap allocation per op. An entry is a fixed-size struct (tensor shapes
// are copied into a small fixed array; dtype names are static strings), the
// ring is allocated once, and each of the three updates takes one
// uncontended mutex for a copy or a store. BRAID_FR_BUFFER_SIZE=0 turns the
// recorder into a single predictable branch per update.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace braid {
namespace fr {

constexpr int kMaxTensors = 8;  // per side; longer lists keep the first 8
constexpr int kMaxDims = 32;    // dims of all recorded tensors of one op

struct Frame {
  std::string name, filename;
  int64_t line = 0;
};
using Frames = std::shared_ptr<const std::vector<Frame>>;

// What the backend knows about an op when it launches it.
struct Op {
  uint32_t group = 0;        // from Recorder::addGroup
  const char* name = "";     // static: "all_reduce", "send", ...
  bool isP2P = false;
  int peer = -1;             // p2p: the peer's group rank (-1: any source)
  int64_t timeoutMs = 0;
  uint8_t nIn = 0, nOut = 0;
  uint8_t nDims = 0;         // used entries of dims[]
  // Only the first nIn / nOut / nDims entries are set: the arrays are left
  // uninitialized, and record() copies the used part only.
  uint8_t inDims[kMaxTensors], outDims[kMaxTensors];
  const char* inTypes[kMaxTensors];   // static: "Float", "BFloat16", ...
  const char* outTypes[kMaxTensors];
  int64_t dims[kMaxDims];
  Frames frames;             // only when Python stacks are recorded

  // Adds one tensor's dtype and shape; false when the op's arrays are full.
  bool addInput(const char* dtype, const int64_t* shape, int ndim);
  bool addOutput(const char* dtype, const int64_t* shape, int ndim);
};

// A recorded op, as dumps show it.
struct Entry {
  uint64_t id = 0;           // record_id + 1 (0: empty slot)
  uint64_t collectiveSeq = 0, p2pSeq = 0, opId = 0;
  // ticks() values (Note [Flight-recorder clock]); 0: not yet.
  int64_t createdNs = 0, startedNs = 0, completedNs = 0;
  bool retired = false;
  char threadName[16] = {};
  int64_t threadId = 0;
  Op op;
};

struct GroupStatus {
  uint64_t lastEnqueued = 0, lastStarted = 0, lastCompleted = 0;
};

class Recorder {
 public:
  explicit Recorder(size_t capacity);

  // The process's recorder; its size comes from BRAID_FR_BUFFER_SIZE (read
  // once, on first use).
  static Recorder& global();

  bool enabled() const { return !ring_.empty(); }
  // Benchmarks only (benchmarks/fr_overhead.py): while paused, record()
  // returns 0 as when the recorder is off, so one process can time both.
  void setPaused(bool p) { paused_.store(p, std::memory_order_relaxed); }
  size_t capacity() const { return ring_.size(); }

  // A group and this process's rank in it. `ranks` are the members' global
  // ranks when known (torch 2.x tells), else 0..size-1. The first group
  // registered sets the process's rank for dump file names, unless
  // setProcessRank() was called.
  uint32_t addGroup(const std::string& name, const std::string& desc, std::vector<int> ranks,
                    int rank);
  void setGroupName(uint32_t group, const std::string& name, const std::string& desc);
  void setGroupRanks(uint32_t group, std::vector<int> ranks);
  void setProcessRank(int rank);
  int processRank() const;

  // Records a scheduled op; returns its id for started()/finished(), 0 when
  // the recorder is off. Assigns the group's sequence numbers: collectives
  // count collective_seq_id from 1, p2p ops p2p_seq_id from 1 (each also
  // shows the other counter's current value, as torch's does).
  uint64_t record(const Op& op);
  void started(uint64_t id);
  // timedOut: a timeout or a lost peer; the entry stays "started".
  void finished(uint64_t id, bool timedOut);

  std::vector<Entry> entries() const;  // oldest first
  GroupStatus status(uint32_t group) const;

  // The dump, in torch's pickle layout (version "2.10"). The frames key is
  // present only where stacks were recorded.
  std::string dumpPickle() const;
  // Writes the dump to `path` (through a temporary file and a rename, so a
  // reader never sees half a dump). Returns false, with `error`, on failure.
  bool dumpToFile(const std::string& path, std::string* error = nullptr) const;

 private:
  struct Group {
    std::string name, desc;
    std::vector<int> ranks;
    int rank = 0;
    uint64_t collectiveSeq = 0, p2pSeq = 0, ops = 0;
    GroupStatus status;
  };
  Entry* find(uint64_t id);  // with mu_ held

  mutable std::mutex mu_;
  std::atomic<bool> paused_{false};
  int64_t tick0_, wall0_;  // Note [Flight-recorder clock]
  std::vector<Entry> ring_;
  uint64_t next_ = 0;  // records so far
  std::vector<Group> groups_;
  int processRank_ = -1;
  bool rankFromGroup_ = false;  // processRank_ came from group 0's ranks
};

// Wall-clock nanoseconds since the epoch, as torch's c10::getTime().
int64_t nowNs();

// Note [Flight-recorder clock]
// Entries take their times from the CPU's time-stamp counter where there is
// one (x86-64; elsewhere steady_clock's nanoseconds), which costs half of a
// clock_gettime here (14-17 ns against 29-37 ns in this VM, three times per
// op). Dumps convert ticks to wall-clock nanoseconds with the rate between
// two (ticks, wall clock) pairs: one taken when the recorder was made and one
// at the dump, at least a millisecond apart. torch's profiler does the same
// (c10::getApproximateTime). Linux exposes the TSC only where it is
// invariant (constant_tsc, nonstop_tsc) for its own clock source; elsewhere
// the conversion is still monotonic, merely less exact.
int64_t ticks();

}  // namespace fr
}  // namespace braid
