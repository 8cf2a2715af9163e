#include "collectives/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/settings.h"

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
// Chunk size and the direct choice shape the steps of an op, so they travel
// in every op header and are compared like the shape (Note [Op headers]).
BRAID_SETTING_INT(kDirectMin, "BRAID_DIRECT_MIN_BYTES", 256 << 10,
                  "Smallest op (bytes per rank) that reads peers' memory directly instead of "
                  "copying through shared memory; needs direct reads (BRAID_SHM_CMA).");
BRAID_SETTING_STRING(kDirectOps, "BRAID_DIRECT_OPS",
                     "allgather,gather,scatter,reduce_scatter,alltoall",
                     "Ops that may read peers' memory directly (comma list of allreduce, "
                     "broadcast, reduce, allgather, gather, scatter, reduce_scatter, alltoall).");
BRAID_SETTING_INT(kChunkBytes, "BRAID_CHUNK_BYTES", 0,
                  "Chunk size (bytes) of pipelined collectives, at most BRAID_SHM_SLOT_BYTES; "
                  "0 = 256 KiB when every rank has a core, else the slot size.");

namespace {

constexpr uint32_t kHeaderMagic = 0x62686472;  // "bhdr"
constexpr size_t kMessageBytes = 256;
constexpr size_t kMetaOffset = 512;  // alltoall sizes follow the header
constexpr size_t kAutoChunkBytes = 256 << 10;

uint32_t parseDirectOps(const std::string& list, int rank) {
  uint32_t mask = 0;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    bool found = false;
    std::string known;
    for (uint32_t k = static_cast<uint32_t>(OpKind::kAllreduce);
         k <= static_cast<uint32_t>(OpKind::kAlltoall); ++k) {
      const char* name = opName(static_cast<OpKind>(k));
      known += known.empty() ? name : std::string(", ") + name;
      if (item == name) {
        mask |= 1u << k;
        found = true;
      }
    }
    BRAID_ENFORCE(found, "init", rank, "BRAID_DIRECT_OPS names an unknown op '", item,
                  "' (known: ", known, ")");
  }
  return mask;
}

size_t chooseChunkBytes(size_t slotBytes, int size, int rank) {
  int64_t set = kChunkBytes.get();
  BRAID_ENFORCE(set >= 0 && set % 64 == 0, "init", rank,
                "BRAID_CHUNK_BYTES must be 0 or a positive multiple of 64, got ", set);
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
  uint32_t magic;
  uint32_t kind;
  uint64_t opSeq;
  uint32_t dtype;
  uint32_t redop;
  int32_t root;
  int32_t failed;
  uint64_t count;
  uint64_t maxSendBytes;
  uint64_t inAddr;
  uint64_t outAddr;
  uint64_t chunkBytes;  // Note [Chunk size and direct reads]
  uint32_t direct;
  uint32_t pad;
  Shape shape;
  char message[kMessageBytes];
};
static_assert(sizeof(WireHeader) <= kMetaOffset, "header overlaps the size table");

const WireHeader* headerAt(transport::Window& w, int rank, uint64_t step) {
  return reinterpret_cast<const WireHeader*>(w.control(rank, step));
}

}  // namespace

const char* opName(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown op";
}

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

Communicator::Communicator(std::unique_ptr<transport::Window> window)
    : window_(std::move(window)),
      rank_(window_->rank()),
      size_(window_->size()),
      scratch_(2 * window_->slotBytes()),
      directMin_(static_cast<size_t>(kDirectMin.get())),
      directOps_(parseDirectOps(kDirectOps.get(), rank_)),
      chunkBytes_(chooseChunkBytes(window_->slotBytes(), size_, rank_)) {}

bool Communicator::useDirect(OpKind kind, size_t bytes) const {
  return window_->canReadPeers() && bytes >= directMin_ &&
         (directOps_ & (1u << static_cast<uint32_t>(kind)));
}

uint64_t Communicator::inAddr(int rank, uint64_t step) { return headerAt(*window_, rank, step)->inAddr; }
uint64_t Communicator::outAddr(int rank, uint64_t step) {
  return headerAt(*window_, rank, step)->outAddr;
}
uint64_t Communicator::peerAddr(int rank, uint64_t step, int which) {
  return reinterpret_cast<const uint64_t*>(window_->control(rank, step) + kMetaOffset)[2 * size_ + which];
}

Communicator::~Communicator() = default;

void Communicator::beginOp(const OpDesc& op) {
  ++opSeq_;
  ctx_.op = opName(op.kind);
  ctx_.opSeq = opSeq_;
  ctx_.deadline = op.deadline;
  ctx_.timeout = op.timeout;
  if (!broken_.empty()) {
    BRAID_THROW(Error, ctx_.op, rank_, "the group is unusable after an earlier error: ", broken_);
  }
}

uint64_t Communicator::headerStep(const OpDesc& op) {
  beginOp(op);
  uint64_t s = nextStep();
  writeHeader(op, s);
  exchange(op, s);
  return s;
}

uint64_t Communicator::nextStep() {
  uint64_t s = ++step_;
  // See Note [Step protocol]: the slot of step s was last used at s - kSlots.
  if (s > transport::Window::kSlots) window_->waitAll(s - transport::Window::kSlots + 1, ctx_);
  return s;
}

void Communicator::writeHeader(const OpDesc& op, uint64_t step) {
  auto* h = reinterpret_cast<WireHeader*>(window_->control(rank_, step));
  h->magic = kHeaderMagic;
  h->kind = static_cast<uint32_t>(op.kind);
  h->opSeq = opSeq_;
  h->dtype = static_cast<uint32_t>(op.dtype);
  h->redop = static_cast<uint32_t>(op.redop);
  h->root = op.root;
  h->count = op.count;
  h->shape = op.shape;
  h->chunkBytes = chunkBytes_;
  h->direct = useDirect(op.kind, op.bytes()) ? 1 : 0;
  h->failed = op.localError.empty() ? 0 : 1;
  size_t n = std::min(op.localError.size(), kMessageBytes - 1);
  std::memcpy(h->message, op.localError.data(), n);
  h->message[n] = '\0';
  h->maxSendBytes = 0;
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
  if (!op.localError.empty()) throw Error(op.localError);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) checkPeer(op, peer, step);
  }
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
  const char* me = opName(op.kind);
  if (h->magic != kHeaderMagic) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " sent a corrupt op header (op #", opSeq_, ")");
  }
  if (h->failed) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " failed this op: ", h->message);
  }
  if (h->kind != static_cast<uint32_t>(op.kind)) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " called ",
                opName(static_cast<OpKind>(h->kind)), " at this point (op #", opSeq_,
                "), this rank ", me);
  }
  if (h->opSeq != opSeq_) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " is at op #", h->opSeq, ", this rank at op #",
                opSeq_);
  }
  auto peerType = static_cast<DataType>(h->dtype);
  if (h->dtype != static_cast<uint32_t>(op.dtype) || h->count != op.count ||
      !(h->shape == op.shape)) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " passed shape ", h->shape.str(), " (",
                toString(peerType), "), this rank shape ", op.shape.str(), " (",
                toString(op.dtype), ")");
  }
  // Compared with what this rank wrote into its own header for this step.
  const WireHeader* mine = headerAt(*window_, rank_, step);
  if (h->chunkBytes != mine->chunkBytes || h->direct != mine->direct) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " runs this op with ", h->chunkBytes,
                "-byte chunks and direct reads ", h->direct ? "on" : "off", ", this rank with ",
                mine->chunkBytes, "-byte chunks and direct reads ", mine->direct ? "on" : "off",
                " (BRAID_CHUNK_BYTES, BRAID_SHM_SLOT_BYTES, BRAID_DIRECT_OPS and "
                "BRAID_DIRECT_MIN_BYTES must be equal on every rank)");
  }
  if (h->root != op.root) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " passed root ", h->root, ", this rank root ",
                op.root);
  }
  if (h->redop != static_cast<uint32_t>(op.redop)) {
    BRAID_THROW(Error, me, rank_, "rank ", peer, " passed reduce op ",
                toString(static_cast<ReduceOp>(h->redop)), ", this rank ", toString(op.redop));
  }
}

uint64_t Communicator::maxAnnouncedBytes(uint64_t step) {
  uint64_t m = 0;
  for (int r = 0; r < size_; ++r) m = std::max(m, headerAt(*window_, r, step)->maxSendBytes);
  return m;
}

void Communicator::markBroken(const std::string& why) {
  if (broken_.empty()) broken_ = why;
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
