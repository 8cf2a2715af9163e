#include "collectives/shm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "collectives/op_header.h"
#include "common/error.h"

namespace braid {
namespace collectives {

// Note [Chunk size and direct reads]
// Measured on a 2-core VM (benchmarks/collectives.py --env sweeps, quiet
// machine, fp32):
// - Chunks: with one core per rank, 256 KiB chunks beat 1 MiB ones by 1.2-1.4x
//   at 1-64 MiB (2 ranks, allreduce 64 MiB: 15.3 ms against 21.6 ms): a chunk
//   and its peer's copy stay in the 2 MiB L2. With more ranks than cores
//   (4 ranks on 2 cores), every step may cost a context switch, and 1 MiB
//   chunks win by 1.1-1.3x. So the default follows that ratio.
// - Direct reads (process_vm_readv) pin pages and copy in the kernel; they win
//   where they save a whole copy through shared memory (allgather 1 MiB at
//   2 ranks: 101 us against 157 us; alltoall at 4 ranks 64 MiB: 35 ms against
//   48 ms) and lose for allreduce (at 2 ranks 18.5 ms against 15.3 ms at
//   64 MiB; at 4 ranks 60 ms against 49 ms), broadcast and reduce, whose shm
//   paths already move each byte once per peer, in cache-sized chunks.
// Both settings are read once per group (CollectiveConfig, plan.cc) and
// compared in the op headers (Note [Settings that shape an op]).

namespace {

constexpr uint32_t kHeaderMagic = 0x62686472;  // "bhdr"
constexpr size_t kMetaOffset = 512;  // alltoall sizes follow the header
constexpr size_t kAutoChunkBytes = 256 << 10;

// Where the meta table of `size` ranks ends: three uint64 per rank (alltoall
// sizes, per-peer buffer addresses) from kMetaOffset. The tree's error text
// follows it.
size_t metaEnd(int size) { return kMetaOffset + 3 * sizeof(uint64_t) * static_cast<size_t>(size); }

size_t chooseChunkBytes(uint64_t set, size_t slotBytes, int size) {
  size_t chunk = static_cast<size_t>(set);
  if (chunk == 0) {
    // The same on every rank of a host, so the ranks agree without talking.
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    chunk = size <= cores ? kAutoChunkBytes : slotBytes;
  }
  return std::max<size_t>(64 * static_cast<size_t>(size), std::min(chunk, slotBytes));
}

// The header as it sits in shared memory. See Note [Op headers].
struct WireHeader {
  OpHeader op;  // compared by checkOpHeader (Note [Op headers])
  uint64_t maxSendBytes;
  uint64_t inAddr;
  uint64_t outAddr;
  // Note [Settings that shape an op]: the path taken and the settings that
  // chose it or shape its steps.
  uint32_t algo;
  uint32_t directOps;     // BRAID_DIRECT_OPS, bit per OpKind
  uint64_t oneShotMax;    // the op kind's one-shot threshold, 0 for kinds without one
  uint64_t directMin;     // BRAID_DIRECT_MIN_BYTES
  uint64_t chunkSetting;  // BRAID_CHUNK_BYTES as set (0: automatic)
  uint64_t chunkBytes;    // the chunk size in use (Note [Chunk size and direct reads])
  uint64_t treeRanks;     // BRAID_ALLREDUCE_TREE_RANKS (Note [Tree allreduce] in tree.h)
  uint64_t treeMaxBytes;  // BRAID_ALLREDUCE_TREE_MAX_BYTES
  uint32_t offersBuffer;  // Note [Adopting a repeated buffer]: not compared, ANDed
};
static_assert(sizeof(WireHeader) <= kMetaOffset, "header overlaps the size table");

const WireHeader* headerAt(transport::Window& w, int rank, uint64_t step) {
  return reinterpret_cast<const WireHeader*>(w.control(rank, step));
}

// Note [Settings that shape an op]: the settings that choose the path first,
// so that the error names the one that differs; then the path they chose,
// and the chunk size where the path's steps depend on it.
void checkSettings(const char* op, int rank, int peer, OpKind kind, const WireHeader& theirs,
                   const WireHeader& mine) {
  if (const char* setting = oneShotSetting(kind)) {
    if (theirs.oneShotMax != mine.oneShotMax) {
      settingDiffers(op, rank, peer, setting, std::to_string(theirs.oneShotMax),
                     std::to_string(mine.oneShotMax));
    }
  }
  if (hasTreePath(kind)) {
    if (theirs.treeRanks != mine.treeRanks) {
      settingDiffers(op, rank, peer, "BRAID_ALLREDUCE_TREE_RANKS", std::to_string(theirs.treeRanks),
                     std::to_string(mine.treeRanks));
    }
    if (kind == OpKind::kAllreduce && theirs.treeMaxBytes != mine.treeMaxBytes) {
      settingDiffers(op, rank, peer, "BRAID_ALLREDUCE_TREE_MAX_BYTES",
                     std::to_string(theirs.treeMaxBytes), std::to_string(mine.treeMaxBytes));
    }
  }
  if (hasDirectPath(kind)) {
    const bool allowed = mine.directOps & opBit(kind);
    if (allowed != bool(theirs.directOps & opBit(kind))) {
      settingDiffers(op, rank, peer, "BRAID_DIRECT_OPS", directOpsList(theirs.directOps),
                     directOpsList(mine.directOps));
    }
    if (allowed && theirs.directMin != mine.directMin) {
      settingDiffers(op, rank, peer, "BRAID_DIRECT_MIN_BYTES", std::to_string(theirs.directMin),
                     std::to_string(mine.directMin));
    }
  }
  const auto algo = static_cast<Algo>(mine.algo);
  if (theirs.algo != mine.algo) {
    BRAID_THROW(Error, op, rank, "rank ", peer, " takes the ",
                algoName(static_cast<Algo>(theirs.algo)), " path, this rank the ",
                algoName(algo), " path");
  }
  if (stepsUseChunks(kind, algo) && theirs.chunkBytes != mine.chunkBytes) {
    settingDiffers(op, rank, peer, "BRAID_CHUNK_BYTES",
                   strCat(theirs.chunkSetting, " (", theirs.chunkBytes, "-byte chunks)"),
                   strCat(mine.chunkSetting, " (", mine.chunkBytes, "-byte chunks)"));
  }
}

}  // namespace

std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim && i < kMaxDims; ++i) os << (i ? ", " : "") << dims[i];
  if (ndim > kMaxDims) os << ", ...";
  os << ']';
  return os.str();
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim && i < kMaxDims; ++i) {
    if (dims[i] != o.dims[i]) return false;
  }
  return true;
}

Communicator::Communicator(std::unique_ptr<transport::Window> window,
                           std::optional<CollectiveConfig> cfg)
    : window_(std::move(window)),
      rank_(window_->rank()),
      size_(window_->size()),
      scratch_(2 * window_->slotBytes()),
      cfg_(cfg ? *cfg : CollectiveConfig::fromEnv(rank_)),
      chunkBytes_(chooseChunkBytes(cfg_.chunkBytes, window_->slotBytes(), size_)),
      regions_(std::make_shared<RegionTable>(rank_)) {
  cfg_.check(rank_);
  BRAID_ENFORCE(window_->controlBytes() >= controlBytesFor(size_), "init", rank_,
                "the window's control area has ", window_->controlBytes(),
                " bytes per slot; the collectives of ", size_, " ranks need ",
                controlBytesFor(size_), " (WindowOptions::controlBytes)");
}

// The op header, then three uint64 per rank (alltoall sizes, per-peer buffer
// addresses) at kMetaOffset, then the tree's error text (Note [Tree allreduce]).
size_t Communicator::controlBytesFor(int size) {
  return metaEnd(size) + kTreeErrorBytes;
}

char* Communicator::treeErrorText(int rank, uint64_t step) {
  return reinterpret_cast<char*>(window_->control(rank, step) + metaEnd(size_));
}

Algo Communicator::algoIn(int rank, uint64_t step) {
  return static_cast<Algo>(headerAt(*window_, rank, step)->algo);
}

uint64_t Communicator::treeSteps() {
  const uint64_t s = ++step_;
  // Note [Tree slots] (tree.h): right after this group's own tree op that
  // ended well nobody still reads either slot; after any other op the flat
  // rule (Note [Step protocol]) holds.
  if (s != afterTree_ + 1 && s > transport::Window::kSlots) {
    window_->waitAll(s - transport::Window::kSlots + 1, ctx_);
  }
  ++step_;  // the release
  afterTree_ = 0;
  return s;
}

uint64_t Communicator::inAddr(int rank, uint64_t step) { return headerAt(*window_, rank, step)->inAddr; }
uint64_t Communicator::outAddr(int rank, uint64_t step) {
  return headerAt(*window_, rank, step)->outAddr;
}
uint64_t Communicator::peerAddr(int rank, uint64_t step, int which) {
  return reinterpret_cast<const uint64_t*>(window_->control(rank, step) + kMetaOffset)[2 * size_ + which];
}

// Peers' regions stay mapped while the group lives or until released; a
// tensor that outlives the group keeps only its own region.
Communicator::~Communicator() { regions_->clear(); }

void Communicator::beginOp(const OpDesc& op) {
  ++opSeq_;
  everyRankOffered_ = false;
  ctx_.op = opName(op.kind);
  ctx_.opSeq = opSeq_;
  ctx_.deadline = op.deadline;
  ctx_.timeout = op.timeout;
  if (!broken_.empty()) {
    BRAID_THROW(Error, ctx_.op, rank_, "the group is unusable after an earlier error: ", broken_);
  }
}

uint64_t Communicator::headerStep(const OpDesc& op, Algo algo) {
  beginOp(op);
  uint64_t s = nextStep();
  writeHeader(op, s, algo);
  exchange(op, s);
  return s;
}

uint64_t Communicator::nextStep() {
  uint64_t s = ++step_;
  // See Note [Step protocol]: the slot of step s was last used at s - kSlots.
  if (s > transport::Window::kSlots) window_->waitAll(s - transport::Window::kSlots + 1, ctx_);
  return s;
}

void Communicator::writeHeader(const OpDesc& op, uint64_t step, Algo algo) {
  auto* h = reinterpret_cast<WireHeader*>(window_->control(rank_, step));
  fillOpHeader(&h->op, kHeaderMagic, op, opSeq_);
  h->algo = static_cast<uint32_t>(algo);
  h->directOps = cfg_.directOps;
  h->oneShotMax = oneShotMax(op.kind, cfg_);
  h->directMin = cfg_.directMinBytes;
  h->chunkSetting = cfg_.chunkBytes;
  h->chunkBytes = chunkBytes_;
  h->treeRanks = cfg_.treeRanks;
  h->treeMaxBytes = cfg_.treeMaxBytes;
  h->maxSendBytes = 0;
  h->offersBuffer = op.offersBuffer ? 1 : 0;
  h->inAddr = op.inAddr;
  h->outAddr = op.outAddr;
  if (!op.peerAddrs.empty()) {
    auto* meta = reinterpret_cast<uint64_t*>(window_->control(rank_, step) + kMetaOffset);
    for (int j = 0; j < size_; ++j) meta[2 * size_ + j] = op.peerAddrs[j];
  }
  if (op.kind == OpKind::kAlltoall && op.sendBytes) {
    auto* meta = reinterpret_cast<uint64_t*>(window_->control(rank_, step) + kMetaOffset);
    for (int j = 0; j < size_; ++j) {
      meta[j] = op.sendBytes[j];
      meta[size_ + j] = op.recvBytes[j];
      h->maxSendBytes = std::max<uint64_t>(h->maxSendBytes, op.sendBytes[j]);
    }
  }
}

void Communicator::exchange(const OpDesc& op, uint64_t step) {
  window_->publish(step);
  window_->waitAll(step, ctx_);
  // Note [Flat ranks among tree ranks] (tree.h)
  if (algoIn(rank_, step) != Algo::kTree) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_ && algoIn(peer, step) == Algo::kTree) {
        followTree(op, step);
        break;
      }
    }
  }
  if (!op.localError.empty()) throw Error(op.localError);
  // Every rank reads every header, so all of them reach the same answer on
  // the offer (Note [Adopting a repeated buffer]).
  bool all = op.offersBuffer;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    checkPeer(op, peer, step);
    all = all && headerAt(*window_, peer, step)->offersBuffer != 0;
  }
  everyRankOffered_ = all;
  if (op.kind != OpKind::kAlltoall) return;
  // Every rank checks the whole size matrix, so that all of them agree on
  // whether the op goes ahead (see Note [Op headers]).
  for (int i = 0; i < size_; ++i) {
    auto* mi = reinterpret_cast<const uint64_t*>(window_->control(i, step) + kMetaOffset);
    for (int j = 0; j < size_; ++j) {
      auto* mj = reinterpret_cast<const uint64_t*>(window_->control(j, step) + kMetaOffset);
      if (mi[j] != mj[size_ + i]) {
        BRAID_THROW(Error, ctx_.op, rank_, "rank ", i, " sends ", mi[j], " bytes to rank ", j,
                    ", which expects ", mj[size_ + i], " bytes from it");
      }
    }
  }
}

void Communicator::checkPeer(const OpDesc& op, int peer, uint64_t step) {
  const WireHeader* h = headerAt(*window_, peer, step);
  const WireHeader* mine = headerAt(*window_, rank_, step);
  const char* me = opName(op.kind);
  checkOpHeader(me, rank_, peer, h->op, mine->op);
  // Compared with what this rank wrote into its own header for this step.
  checkSettings(me, rank_, peer, op.kind, *h, *mine);
}

void Communicator::followTree(const OpDesc& op, uint64_t step) {
  std::string why = op.localError;
  for (int peer = 0; peer < size_ && why.empty(); ++peer) {
    if (peer == rank_) continue;
    try {
      checkPeer(op, peer, step);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (why.empty()) {  // not reached: the path differs, which checkPeer compares
    why = strCat("rank ", rank_, " takes the ", algoName(algoIn(rank_, step)), " path");
  }
  ++step_;
  afterTree_ = 0;
  // What this rank says comes from the headers read above, never after the
  // publish below: from then on a tree rank may start its next op and write
  // its header again.
  if (rank_ == 0) {
    // This rank holds the tree root's place: its release tells the tree
    // ranks that the op failed, here, and why (a header says tree, this
    // rank's does not: some check above threw).
    treeRelease(step + 1, 1, why);
  } else {
    window_->publish(step + 1);
  }
  throw Error(op.localError.empty() ? why : op.localError);
}

void Communicator::setTreeError(uint64_t step, const std::string& why) {
  const size_t n = std::min(why.size(), kTreeErrorBytes - 1);
  char* text = treeErrorText(rank_, step);
  std::memcpy(text, why.data(), n);
  text[n] = '\0';
}

void Communicator::treeRelease(uint64_t step, uint64_t status, const std::string& why) {
  if (status == static_cast<uint64_t>(rank_) + 1) setTreeError(step - 1, why);
  std::memcpy(window_->lineBytes(rank_), &status, sizeof(status));
  window_->publish(step);
}

uint64_t Communicator::maxAnnouncedBytes(uint64_t step) {
  uint64_t m = 0;
  for (int r = 0; r < size_; ++r) m = std::max(m, headerAt(*window_, r, step)->maxSendBytes);
  return m;
}

void Communicator::markBroken(const std::string& why) {
  if (!broken_.empty()) return;
  broken_ = why;
  window_->giveUp(why);  // Note [A rank that gives up]
}

std::vector<uint64_t> addressesOf(const void* const* ptrs, int n) {
  std::vector<uint64_t> a(n);
  for (int r = 0; r < n; ++r) a[r] = reinterpret_cast<uint64_t>(ptrs[r]);
  return a;
}

void partition(size_t count, int parts, int i, size_t align, size_t* begin, size_t* end) {
  size_t per = (count + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  *begin = std::min(count, per * i);
  *end = std::min(count, per * (i + 1));
}

}  // namespace collectives
}  // namespace braid
