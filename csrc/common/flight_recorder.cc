#include "common/flight_recorder.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/pickle_writer.h"
#include "common/settings.h"

namespace braid {
namespace fr {

// See Note [Flight recorder]. torch's NCCL recorder is off by default
// (TORCH_NCCL_TRACE_BUFFER_SIZE=0) because its entries cost CUDA events;
// braid's cost no allocation and well under 2% of the smallest op
// (benchmarks/results/fr-overhead.txt), so it is on, as torch's default
// became in later releases (2000 entries).
BRAID_SETTING_INT(kBufferSize, "BRAID_FR_BUFFER_SIZE", 2000,
                  "Ops the flight recorder keeps per process (a ring buffer); 0 turns it off. "
                  "Dumps: torch_braid.fr.dump(), BRAID_FR_DUMP_FILE.");

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t ticks() {
#if defined(__x86_64__)
  return static_cast<int64_t>(__rdtsc());
#else
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
#endif
}

namespace {
bool addTensor(Op& op, uint8_t* count, uint8_t* dimsOf, const char** types, const char* dtype,
               const int64_t* shape, int ndim) {
  if (*count >= kMaxTensors || op.nDims + ndim > kMaxDims || ndim < 0) return false;
  dimsOf[*count] = static_cast<uint8_t>(ndim);
  types[*count] = dtype;
  ++*count;
  for (int i = 0; i < ndim; ++i) op.dims[op.nDims++] = shape[i];
  return true;
}

struct ThreadInfo {
  char name[16] = {};
  int64_t id = 0;
};

const ThreadInfo& thisThread() {
  thread_local ThreadInfo info = [] {
    ThreadInfo t;
    pthread_getname_np(pthread_self(), t.name, sizeof t.name);
    t.id = static_cast<int64_t>(::syscall(SYS_gettid));
    return t;
  }();
  return info;
}
}  // namespace

bool Op::addInput(const char* dtype, const int64_t* shape, int ndim) {
  // Inputs come first in dims[]; outputs must be added after all inputs.
  return nOut == 0 && addTensor(*this, &nIn, inDims, inTypes, dtype, shape, ndim);
}

bool Op::addOutput(const char* dtype, const int64_t* shape, int ndim) {
  return addTensor(*this, &nOut, outDims, outTypes, dtype, shape, ndim);
}

Recorder::Recorder(size_t capacity) : tick0_(ticks()), wall0_(nowNs()), ring_(capacity) {}

Recorder& Recorder::global() {
  // Never destroyed: ops may finish on other threads during exit.
  static Recorder* r = new Recorder(static_cast<size_t>(std::max<int64_t>(0, kBufferSize.get())));
  return *r;
}

uint32_t Recorder::addGroup(const std::string& name, const std::string& desc,
                            std::vector<int> ranks, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  Group g;
  g.name = name;
  g.desc = desc;
  g.ranks = std::move(ranks);
  g.rank = rank;
  if (processRank_ < 0) {
    processRank_ = rank >= 0 && static_cast<size_t>(rank) < g.ranks.size() ? g.ranks[rank] : rank;
    rankFromGroup_ = groups_.empty();
  }
  groups_.push_back(std::move(g));
  return static_cast<uint32_t>(groups_.size() - 1);
}

void Recorder::setGroupName(uint32_t group, const std::string& name, const std::string& desc) {
  std::lock_guard<std::mutex> lock(mu_);
  if (group >= groups_.size()) return;
  if (!name.empty()) groups_[group].name = name;
  if (!desc.empty()) groups_[group].desc = desc;
}

void Recorder::setGroupRanks(uint32_t group, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (group >= groups_.size()) return;
  Group& g = groups_[group];
  g.ranks = std::move(ranks);
  if (group == 0 && rankFromGroup_ && g.rank >= 0 && static_cast<size_t>(g.rank) < g.ranks.size()) {
    processRank_ = g.ranks[g.rank];
  }
}

void Recorder::setProcessRank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  processRank_ = rank;
  rankFromGroup_ = false;
}

int Recorder::processRank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return processRank_ < 0 ? 0 : processRank_;
}

uint64_t Recorder::record(const Op& op) {
  if (ring_.empty() || paused_.load(std::memory_order_relaxed)) return 0;
  const int64_t now = ticks();
  const ThreadInfo& t = thisThread();
  std::lock_guard<std::mutex> lock(mu_);
  if (op.group >= groups_.size()) return 0;
  Group& g = groups_[op.group];
  Entry& e = ring_[next_ % ring_.size()];
  e.id = ++next_;
  if (op.isP2P) {
    ++g.p2pSeq;
  } else {
    ++g.collectiveSeq;
    g.status.lastEnqueued = g.collectiveSeq;
  }
  e.collectiveSeq = g.collectiveSeq;
  e.p2pSeq = g.p2pSeq;
  e.opId = ++g.ops;
  e.createdNs = now;
  e.startedNs = e.completedNs = 0;
  e.retired = false;
  std::memcpy(e.threadName, t.name, sizeof e.threadName);
  e.threadId = t.id;
  // The used part only: an entry spans ~8 cache lines, a small op uses ~2.
  Op& d = e.op;
  d.group = op.group;
  d.name = op.name;
  d.isP2P = op.isP2P;
  d.peer = op.peer;
  d.timeoutMs = op.timeoutMs;
  d.nIn = op.nIn;
  d.nOut = op.nOut;
  d.nDims = op.nDims;
  std::memcpy(d.inDims, op.inDims, op.nIn);
  std::memcpy(d.outDims, op.outDims, op.nOut);
  std::memcpy(d.inTypes, op.inTypes, op.nIn * sizeof(const char*));
  std::memcpy(d.outTypes, op.outTypes, op.nOut * sizeof(const char*));
  std::memcpy(d.dims, op.dims, op.nDims * sizeof(int64_t));
  if (d.frames || op.frames) d.frames = op.frames;
  return e.id;
}

Entry* Recorder::find(uint64_t id) {
  if (id == 0 || ring_.empty()) return nullptr;
  Entry& e = ring_[(id - 1) % ring_.size()];
  return e.id == id ? &e : nullptr;  // else overwritten by a newer op
}

void Recorder::started(uint64_t id) {
  if (id == 0) return;
  const int64_t now = ticks();
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = find(id);
  if (!e) return;
  e->startedNs = now;
  if (!e->op.isP2P && e->op.group < groups_.size()) {
    auto& s = groups_[e->op.group].status;
    s.lastStarted = std::max(s.lastStarted, e->collectiveSeq);
  }
}

void Recorder::finished(uint64_t id, bool timedOut) {
  if (id == 0) return;
  const int64_t now = ticks();
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = find(id);
  if (!e) return;
  e->retired = true;
  if (timedOut) return;  // see Note [Flight recorder]
  if (!e->startedNs) e->startedNs = now;
  e->completedNs = now;
  if (!e->op.isP2P && e->op.group < groups_.size()) {
    auto& s = groups_[e->op.group].status;
    s.lastCompleted = std::max(s.lastCompleted, e->collectiveSeq);
  }
}

std::vector<Entry> Recorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  const size_t n = std::min<uint64_t>(next_, ring_.size());
  out.reserve(n);
  for (uint64_t id = next_ - n + 1; id <= next_; ++id) out.push_back(ring_[(id - 1) % ring_.size()]);
  return out;
}

GroupStatus Recorder::status(uint32_t group) const {
  std::lock_guard<std::mutex> lock(mu_);
  return group < groups_.size() ? groups_[group].status : GroupStatus{};
}

namespace {
std::string ranksText(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s + "]";
}

void writeSizes(PickleWriter& w, const Op& op, const uint8_t* dimsOf, int n, int* at) {
  w.beginList();
  for (int i = 0; i < n; ++i) {
    w.beginList();
    for (int d = 0; d < dimsOf[i]; ++d) w.integer(op.dims[(*at)++]);
    w.end();
  }
  w.end();
}

void writeTypes(PickleWriter& w, const char* const* types, int n) {
  w.beginList();
  for (int i = 0; i < n; ++i) w.str(types[i]);
  w.end();
}

// torch's p2p names carry the ranks: "send 0->1", "recv 1<-0" (group ranks).
std::string profilingName(const Op& op, int rank) {
  std::string name = std::string("braid:") + op.name;
  if (!op.isP2P) return name;
  const bool send = std::strcmp(op.name, "send") == 0;
  return name + " " + std::to_string(rank) + (send ? "->" : "<-") + std::to_string(op.peer);
}

// Note [Flight-recorder clock]: ticks to wall-clock ns.
struct TickConverter {
  int64_t tick0, wall0;
  double nsPerTick;
  int64_t operator()(int64_t t) const {
    return wall0 + static_cast<int64_t>(static_cast<double>(t - tick0) * nsPerTick);
  }
};

void writeEntry(PickleWriter& w, const Entry& e, const std::string& groupName,
                const std::string& groupDesc, int rank, const TickConverter& wall) {
  const Op& op = e.op;
  w.beginDict();
  if (op.frames) {
    w.str("frames");
    w.beginList();
    for (const Frame& f : *op.frames) {
      w.beginDict();
      w.str("name"); w.str(f.name);
      w.str("filename"); w.str(f.filename);
      w.str("line"); w.integer(f.line);
      w.end();
    }
    w.end();
  }
  w.str("record_id"); w.integer(static_cast<int64_t>(e.id - 1));
  w.str("pg_id"); w.integer(op.group);
  w.str("process_group");
  w.beginTuple(); w.str(groupName); w.str(groupDesc); w.end();
  w.str("thread_name"); w.str(std::string(e.threadName, strnlen(e.threadName, sizeof e.threadName)));
  w.str("thread_id"); w.str(std::to_string(e.threadId));
  w.str("collective_seq_id"); w.integer(static_cast<int64_t>(e.collectiveSeq));
  w.str("p2p_seq_id"); w.integer(static_cast<int64_t>(e.p2pSeq));
  w.str("op_id"); w.integer(static_cast<int64_t>(e.opId));
  w.str("profiling_name"); w.str(profilingName(op, rank));
  w.str("time_created_ns"); w.integer(wall(e.createdNs));
  if (e.startedNs && e.completedNs) {
    w.str("duration_ms");
    w.real(static_cast<double>(wall(e.completedNs) - wall(e.startedNs)) / 1e6);
  }
  int at = 0;
  w.str("input_sizes"); writeSizes(w, op, op.inDims, op.nIn, &at);
  w.str("input_dtypes"); writeTypes(w, op.inTypes, op.nIn);
  w.str("output_sizes"); writeSizes(w, op, op.outDims, op.nOut, &at);
  w.str("output_dtypes"); writeTypes(w, op.outTypes, op.nOut);
  w.str("state");
  w.str(e.completedNs ? "completed" : e.startedNs ? "started" : "scheduled");
  w.str("time_discovered_started_ns");
  if (e.startedNs) w.integer(wall(e.startedNs)); else w.none();
  w.str("time_discovered_completed_ns");
  if (e.completedNs) w.integer(wall(e.completedNs)); else w.none();
  w.str("retired"); w.boolean(e.retired);
  w.str("timeout_ms"); w.integer(op.timeoutMs);
  w.str("is_p2p"); w.boolean(op.isP2P);
  w.end();
}
}  // namespace

std::string Recorder::dumpPickle() const {
  // The second (ticks, wall clock) pair, at least 1 ms after the first.
  int64_t wall1 = nowNs();
  while (wall1 - wall0_ < 1000000) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    wall1 = nowNs();
  }
  const int64_t tick1 = ticks();
  const TickConverter wall{tick0_, wall0_,
                           tick1 > tick0_ ? static_cast<double>(wall1 - wall0_) /
                                                static_cast<double>(tick1 - tick0_)
                                          : 1.0};
  std::vector<Entry> es = entries();
  std::vector<Group> groups;
  int processRank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups = groups_;
    processRank = processRank_ < 0 ? 0 : processRank_;
  }
  PickleWriter w;
  w.beginDict();
  w.str("version"); w.str("2.10");
  w.str("comm_lib_version"); w.str("braid");
  w.str("rank"); w.integer(processRank);
  w.str("pg_config");
  w.beginDict();
  for (const Group& g : groups) {
    w.str(g.name);
    w.beginDict();
    w.str("name"); w.str(g.name);
    w.str("desc"); w.str(g.desc);
    w.str("ranks"); w.str(ranksText(g.ranks));
    w.end();
  }
  w.end();
  w.str("pg_status");
  w.beginDict();
  for (size_t i = 0; i < groups.size(); ++i) {
    w.str(std::to_string(i));
    w.beginDict();
    w.str("last_enqueued_collective"); w.integer(static_cast<int64_t>(groups[i].status.lastEnqueued));
    w.str("last_started_collective"); w.integer(static_cast<int64_t>(groups[i].status.lastStarted));
    w.str("last_completed_collective");
    w.integer(static_cast<int64_t>(groups[i].status.lastCompleted));
    w.end();
  }
  w.end();
  w.str("entries");
  w.beginList();
  for (const Entry& e : es) {
    const Group* g = e.op.group < groups.size() ? &groups[e.op.group] : nullptr;
    writeEntry(w, e, g ? g->name : "?", g ? g->desc : "undefined", g ? g->rank : 0, wall);
  }
  w.end();
  w.end();
  return w.finish();
}

bool Recorder::dumpToFile(const std::string& path, std::string* error) const {
  std::string bytes = dumpPickle();
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  bool ok = f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f) ok = (std::fclose(f) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    if (error) *error = std::string("cannot write ") + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
  }
  return ok;
}

}  // namespace fr
}  // namespace braid
