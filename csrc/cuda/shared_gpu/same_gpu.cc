// The same-GPU collectives as an NcclApi: Note [Same-GPU collectives] in
// same_gpu.h.
#include "cuda/shared_gpu/same_gpu.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/settings.h"
#include "cuda/kernels.cuh"
#include "cuda/shared_gpu/same_gpu_comm.h"

namespace braid {
namespace cuda {
namespace {

using samegpu::Comm;
using samegpu::Control;

BRAID_SETTING_INT(kSameGpuBytes, "BRAID_CUDA_SAME_GPU_BYTES", 64 << 20,
                  "Device memory per rank for the same-GPU collectives (ranks sharing a GPU), "
                  "in two halves; larger ops run in chunks of a half.");

// Note [Same-GPU small messages] in same_gpu.h; compared between the ranks
// at init (Comm::poll), as it picks the number of barriers.
BRAID_SETTING_INT(kSameGpuSmallBytes, "BRAID_CUDA_SAME_GPU_SMALL_BYTES", 64 << 10,
                  "Same-GPU allreduce and reduce of at most this many bytes (and at most half "
                  "of BRAID_CUDA_SAME_GPU_BYTES) run in one barrier and one kernel that reduces "
                  "the whole message from every rank's buffer; larger ones in two barriers per "
                  "chunk. 0: never. Must be equal on every rank.");

constexpr uint64_t kMagic = 0x7573677062726169ULL;  // the unique id's mark

DataType dataTypeOf(NcclDataType t) {
  switch (t) {
    case kNcclInt8: return DataType::kInt8;
    case kNcclUint8: return DataType::kUInt8;
    case kNcclInt32: return DataType::kInt32;
    case kNcclInt64: return DataType::kInt64;
    case kNcclFloat16: return DataType::kFloat16;
    case kNcclFloat32: return DataType::kFloat32;
    case kNcclFloat64: return DataType::kFloat64;
    case kNcclBfloat16: return DataType::kBFloat16;
    default:
      throw Error(strCat("braid: same-GPU collectives: NCCL data type ", int(t), " unsupported"));
  }
}

struct Reduction {
  ReduceOp op;
  double divisor;  // 1: none
};

class SameGpu final : public NcclApi {
 public:
  // `version` != 0: standing in for NCCL (sameGpuCollectives).
  explicit SameGpu(DeviceApi& dev, int version = 0) : dev_(dev), version_(version) {}

  std::string name() const override {
    return strCat("braid same-GPU collectives on ", dev_.name(),
                  version_ ? " (standing in for NCCL)" : "");
  }
  bool simulated() const override { return dev_.simulated(); }
  int version() override { return version_; }
  const char* getErrorString(NcclResult r) override { return ncclResultName(r); }
  std::string lastError(NcclComm comm) override {
    return comm ? static_cast<Comm*>(comm)->lastError() : std::string();
  }

  NcclResult getUniqueId(NcclUniqueId* id) override {
    std::shared_ptr<transport::shm::SharedRegion> control;
    try {
      control = transport::shm::SharedRegion::create(sizeof(Control), "same-GPU control block");
    } catch (const std::exception&) {
      return kNcclSystemError;
    }
    static_cast<Control*>(control->data())->magic = kMagic;
    const std::string h = control->handle();
    std::memset(id->internal, 0, sizeof(id->internal));
    std::memcpy(id->internal, &kMagic, sizeof(kMagic));
    std::memcpy(id->internal + sizeof(kMagic), h.data(), h.size());
    std::lock_guard<std::mutex> lock(mu_);
    made_[h] = control;  // kept open until this process's rank joins
    return kNcclSuccess;
  }

  NcclResult commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          bool blocking) override {
    *comm = nullptr;
    uint64_t magic = 0;
    std::memcpy(&magic, id.internal, sizeof(magic));
    if (magic != kMagic || nranks < 1 || nranks > samegpu::kMaxRanks || rank < 0 ||
        rank >= nranks) {
      return kNcclInvalidArgument;
    }
    const std::string h(id.internal + sizeof(magic), kIpcHandleBytes);
    try {
      std::shared_ptr<transport::shm::SharedRegion> control;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = made_.find(h);
        if (it != made_.end()) control = it->second;
      }
      if (!control) control = transport::shm::SharedRegion::open(h, "same-GPU control block");
      const size_t half = std::max<size_t>(4096, static_cast<size_t>(kSameGpuBytes.get()) / 2 /
                                                     4096 * 4096);
      const size_t small = static_cast<size_t>(std::max<int64_t>(0, kSameGpuSmallBytes.get()));
      *comm = new Comm(dev_, nranks, rank, dev_.getDevice(), std::move(control), half, small);
      std::lock_guard<std::mutex> lock(mu_);
      made_.erase(h);
    } catch (const std::exception&) {
      return kNcclSystemError;
    }
    if (!blocking) return kNcclInProgress;
    NcclResult r;
    while ((r = static_cast<Comm*>(*comm)->poll()) == kNcclInProgress) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return r;
  }

  NcclResult commDestroy(NcclComm comm) override {
    delete static_cast<Comm*>(comm);
    return kNcclSuccess;
  }
  NcclResult commAbort(NcclComm comm) override {
    static_cast<Comm*>(comm)->abort();
    delete static_cast<Comm*>(comm);
    return kNcclSuccess;
  }
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* asyncError) override {
    NcclResult r = static_cast<Comm*>(comm)->poll();
    *asyncError = r;
    return kNcclSuccess;
  }
  void setTimeout(NcclComm comm, std::chrono::milliseconds t) override {
    static_cast<Comm*>(comm)->setTimeout(t);
  }

  NcclResult groupStart() override { return kNcclSuccess; }
  NcclResult groupEnd() override { return kNcclSuccess; }

  NcclResult allReduce(const void* send, void* recv, size_t count, NcclDataType type,
                       NcclRedOp op, NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { allReduceOn(c, send, recv, count, type, op, s, -1); });
  }
  NcclResult reduce(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                    int root, NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { allReduceOn(c, send, recv, count, type, op, s, root); });
  }
  NcclResult broadcast(const void* send, void* recv, size_t count, NcclDataType type, int root,
                       NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { broadcastOn(c, send, recv, count, type, root, s); });
  }
  NcclResult allGather(const void* send, void* recv, size_t sendCount, NcclDataType type,
                       NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { allGatherOn(c, send, recv, sendCount, type, s); });
  }
  NcclResult reduceScatter(const void* send, void* recv, size_t recvCount, NcclDataType type,
                           NcclRedOp op, NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { reduceScatterOn(c, send, recv, recvCount, type, op, s); });
  }
  // AVG divides in the kernel, which takes float types only.
  bool reduces(NcclDataType t, NcclRedOp op) const override {
    return op != kNcclAvg || t == kNcclFloat16 || t == kNcclFloat32 || t == kNcclFloat64 ||
           t == kNcclBfloat16;
  }
  // Note [Collectives NCCL lacks] in nccl_api.h: all three, here.
  bool supports(Extra) const override { return true; }
  NcclResult gather(const void* send, void* const* recvs, size_t count, NcclDataType type,
                    int root, NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { gatherOn(c, send, recvs, count, type, root, s); });
  }
  NcclResult scatter(const void* const* sends, void* recv, size_t count, NcclDataType type,
                     int root, NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { scatterOn(c, sends, recv, count, type, root, s); });
  }
  NcclResult allToAll(const void* send, void* recv, size_t count, NcclDataType type,
                      NcclComm comm, Stream s) override {
    return run(comm, [&](Comm& c) { allToAllOn(c, send, recv, count, type, s); });
  }
  NcclResult send(const void*, size_t, NcclDataType, int, NcclComm comm, Stream) override {
    return unsupported(comm, "send");
  }
  NcclResult recv(void*, size_t, NcclDataType, int, NcclComm comm, Stream) override {
    return unsupported(comm, "recv");
  }

  // PREMUL_SUM: the factor scales this rank's input as it is copied in.
  NcclResult redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType type,
                                  NcclComm comm) override {
    double f = 0;
    switch (type) {
      case kNcclFloat32: {
        float v;
        std::memcpy(&v, scalar, sizeof(v));
        f = v;
        break;
      }
      case kNcclFloat64:
        std::memcpy(&f, scalar, sizeof(f));
        break;
      case kNcclFloat16:
      case kNcclBfloat16: {
        uint16_t bits;
        std::memcpy(&bits, scalar, sizeof(bits));
        f = type == kNcclFloat16 ? kernels::halfToFloat(bits) : kernels::bf16ToFloat(bits);
        break;
      }
      default:
        return unsupported(comm, "PREMUL_SUM on an integer type");
    }
    std::lock_guard<std::mutex> lock(mu_);
    *op = nextPremul_++;
    premul_[*op] = f;
    return kNcclSuccess;
  }
  NcclResult redOpDestroy(NcclRedOp op, NcclComm) override {
    std::lock_guard<std::mutex> lock(mu_);
    premul_.erase(op);
    return kNcclSuccess;
  }

 private:
  // Runs an op's enqueue; an error thrown on the way becomes the result.
  template <class F>
  NcclResult run(NcclComm comm, F fn) {
    Comm& c = *static_cast<Comm*>(comm);
    try {
      fn(c);
      return kNcclSuccess;
    } catch (const ResultError& e) {
      return e.result;
    } catch (const std::exception& e) {
      return c.fail(kNcclInternalError, e.what());
    }
  }
  struct ResultError {
    NcclResult result;
  };
  static void check(NcclResult r) {
    if (r != kNcclSuccess) throw ResultError{r};
  }
  NcclResult unsupported(NcclComm comm, const char* what) {
    if (comm) static_cast<Comm*>(comm)->fail(kNcclInvalidUsage, strCat(what, " is not one of "
                                             "braid's same-GPU collectives"));
    return kNcclInvalidUsage;
  }

  Reduction reductionOf(NcclRedOp op, DataType t, int n, double* premul) {
    *premul = 0;
    switch (op) {
      case kNcclSum: return {ReduceOp::kSum, 1.0};
      case kNcclProd: return {ReduceOp::kProduct, 1.0};
      case kNcclMax: return {ReduceOp::kMax, 1.0};
      case kNcclMin: return {ReduceOp::kMin, 1.0};
      case kNcclAvg:
        if (!isFloating(t)) throw Error("braid: same-GPU collectives: AVG needs a float type");
        return {ReduceOp::kSum, static_cast<double>(n)};
      default: {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = premul_.find(op);
        if (it == premul_.end()) throw Error(strCat("braid: same-GPU collectives: op ", op));
        *premul = it->second;
        return {ReduceOp::kSum, 1.0};
      }
    }
  }

  // dst <- `count` elements at `src`, scaled by `premul` (0: not), in stream order.
  void copyIn(const Comm& c, DataType t, void* dst, const void* src, size_t count, double premul,
              Stream s) {
    if (count == 0) return;
    if (premul != 0) {
      const void* srcs[] = {src};
      // `s` is the caller's (torch's) stream: its device is the comm's (Note
      // [A stream's device] in cuda/cuda_runtime.cc).
      dev_.reduceMultiAsyncOn(c.device(), t, ReduceOp::kSum, dst, srcs, 1, 1.0 / premul, count,
                              s);
    } else {
      dev_.memcpyAsync(dst, src, count * elementSize(t), s);
    }
  }

  // allreduce, or reduce to `root` (>= 0).
  void allReduceOn(Comm& c, const void* send, void* recv, size_t count, NcclDataType nt,
                   NcclRedOp nop, Stream s, int root) {
    const DataType t = dataTypeOf(nt);
    const size_t es = elementSize(t);
    const int n = c.size(), r = c.rank();
    double premul;
    const Reduction red = reductionOf(nop, t, n, &premul);
    if (count > 0 && count * es <= std::min(c.smallBytes(), c.halfBytes())) {
      // Note [Same-GPU small messages]: one barrier, one kernel over the
      // whole message from every rank's half, in rank order (the bits of
      // the sliced path: the same kernel body over the same sources).
      copyIn(c, t, c.half(r), send, count, premul, s);
      check(c.barrier(s));
      if (root < 0 || root == r) {
        std::vector<const void*> srcs(n);
        for (int q = 0; q < n; ++q) srcs[q] = c.half(q);
        dev_.reduceMultiAsyncOn(c.device(), t, red.op, recv, srcs.data(), n, red.divisor, count,
                                s);
      }
      c.nextHalf();
      return;
    }
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      const size_t per = (len + n - 1) / n;
      auto slice = [&](int q, size_t* b) {
        *b = std::min(len, q * per);
        return std::min(len, (q + 1) * per) - *b;
      };
      copyIn(c, t, c.half(r), static_cast<const char*>(send) + off * es, len, premul, s);
      check(c.barrier(s));
      size_t b;
      const size_t mine = slice(r, &b);
      if (mine > 0) {
        std::vector<const void*> srcs(n);
        for (int q = 0; q < n; ++q) srcs[q] = c.half(q) + b * es;
        dev_.reduceMultiAsyncOn(c.device(), t, red.op, c.half(r) + b * es, srcs.data(), n,
                                red.divisor, mine, s);
      }
      check(c.barrier(s));
      if (root < 0 || root == r) {
        for (int q = 0; q < n; ++q) {
          const size_t m = slice(q, &b);
          if (m > 0) dev_.memcpyAsync(static_cast<char*>(recv) + (off + b) * es,
                                      c.half(q) + b * es, m * es, s);
        }
      }
      c.nextHalf();
    }
  }

  void broadcastOn(Comm& c, const void* send, void* recv, size_t count, NcclDataType nt, int root,
                   Stream s) {
    const size_t es = elementSize(dataTypeOf(nt));
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      if (c.rank() == root) {
        dev_.memcpyAsync(c.half(root), static_cast<const char*>(send) + off * es, len * es, s);
      }
      check(c.barrier(s));
      if (c.rank() != root || send != recv) {
        dev_.memcpyAsync(static_cast<char*>(recv) + off * es, c.half(root), len * es, s);
      }
      c.nextHalf();
    }
  }

  void allGatherOn(Comm& c, const void* send, void* recv, size_t count, NcclDataType nt,
                   Stream s) {
    const size_t es = elementSize(dataTypeOf(nt));
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      dev_.memcpyAsync(c.half(c.rank()), static_cast<const char*>(send) + off * es, len * es, s);
      check(c.barrier(s));
      for (int q = 0; q < c.size(); ++q) {
        dev_.memcpyAsync(static_cast<char*>(recv) + (q * count + off) * es, c.half(q), len * es, s);
      }
      c.nextHalf();
    }
  }

  // Note [Same-GPU gather, scatter and alltoall]
  // As allgather and broadcast: per chunk, the ranks that hold data copy it
  // into their own half, one barrier, the ranks it is for copy it out of the
  // peers' halves; halves alternate, so one barrier per chunk suffices (a
  // rank writes a half again only after the next chunk's barrier, which its
  // peers reach only after they enqueued their reads of it).
  // - gather: every rank but the root copies its chunk in; only the root
  //   reads. The root's own block goes straight from its input to its output
  //   (stream order), never through the half.
  // - scatter: only the root copies in, the chunk of every peer's block (a
  //   chunk is a half / nranks elements per block); rank q reads its block.
  //   The root's own block goes straight to its output.
  // - alltoall (equal splits): every rank copies the chunk of each of its n
  //   blocks in (a half / nranks elements per block); rank r then reads block
  //   r of every rank's half (its own included: one copy path for all). In
  //   place works: chunk k of every block is in the half before any of
  //   chunk k of the output is written, and later chunks touch other bytes.
  // The loops run the same number of barriers on every rank: it depends only
  // on count, nranks and the half size, which the ranks agree on (the op
  // header and the control block's check).
  void gatherOn(Comm& c, const void* send, void* const* recvs, size_t count, NcclDataType nt,
                int root, Stream s) {
    const size_t es = elementSize(dataTypeOf(nt));
    const int r = c.rank();
    if (r == root && count > 0 && recvs[root] != send) {
      dev_.memcpyAsync(recvs[root], send, count * es, s);
    }
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      if (r != root) {
        dev_.memcpyAsync(c.half(r), static_cast<const char*>(send) + off * es, len * es, s);
      }
      check(c.barrier(s));
      if (r == root) {
        for (int q = 0; q < c.size(); ++q) {
          if (q != root) {
            dev_.memcpyAsync(static_cast<char*>(recvs[q]) + off * es, c.half(q), len * es, s);
          }
        }
      }
      c.nextHalf();
    }
  }

  void scatterOn(Comm& c, const void* const* sends, void* recv, size_t count, NcclDataType nt,
                 int root, Stream s) {
    const size_t es = elementSize(dataTypeOf(nt));
    const int n = c.size(), r = c.rank();
    if (r == root && count > 0 && sends[root] != recv) {
      dev_.memcpyAsync(recv, sends[root], count * es, s);
    }
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es / n);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      if (r == root) {
        for (int q = 0; q < n; ++q) {
          if (q != root) {
            dev_.memcpyAsync(c.half(root) + q * len * es,
                             static_cast<const char*>(sends[q]) + off * es, len * es, s);
          }
        }
      }
      check(c.barrier(s));
      if (r != root) {
        dev_.memcpyAsync(static_cast<char*>(recv) + off * es, c.half(root) + r * len * es,
                         len * es, s);
      }
      c.nextHalf();
    }
  }

  void allToAllOn(Comm& c, const void* send, void* recv, size_t count, NcclDataType nt,
                  Stream s) {
    const size_t es = elementSize(dataTypeOf(nt));
    const int n = c.size(), r = c.rank();
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es / n);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      for (int q = 0; q < n; ++q) {
        dev_.memcpyAsync(c.half(r) + q * len * es,
                         static_cast<const char*>(send) + (q * count + off) * es, len * es, s);
      }
      check(c.barrier(s));
      for (int q = 0; q < n; ++q) {
        dev_.memcpyAsync(static_cast<char*>(recv) + (q * count + off) * es,
                         c.half(q) + r * len * es, len * es, s);
      }
      c.nextHalf();
    }
  }

  void reduceScatterOn(Comm& c, const void* send, void* recv, size_t count, NcclDataType nt,
                       NcclRedOp nop, Stream s) {
    const DataType t = dataTypeOf(nt);
    const size_t es = elementSize(t);
    const int n = c.size(), r = c.rank();
    double premul;
    const Reduction red = reductionOf(nop, t, n, &premul);
    // Each chunk holds every rank's block of `len` elements.
    const size_t chunk = std::max<size_t>(1, c.halfBytes() / es / n);
    std::vector<const void*> srcs(n);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      for (int q = 0; q < n; ++q) {
        copyIn(c, t, c.half(r) + q * len * es,
               static_cast<const char*>(send) + (q * count + off) * es, len, premul, s);
      }
      check(c.barrier(s));
      for (int q = 0; q < n; ++q) srcs[q] = c.half(q) + r * len * es;
      dev_.reduceMultiAsyncOn(c.device(), t, red.op, static_cast<char*>(recv) + off * es,
                              srcs.data(), n, red.divisor, len, s);
      c.nextHalf();
    }
  }

  DeviceApi& dev_;
  const int version_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<transport::shm::SharedRegion>> made_;
  std::map<NcclRedOp, double> premul_;
  NcclRedOp nextPremul_ = 1000;
};

}  // namespace

NcclApi& sameGpuCollectives(DeviceApi& dev, int reportedVersion) {
  static std::mutex mu;
  static auto* all = new std::map<std::pair<DeviceApi*, int>, SameGpu*>();  // process lifetime
  std::lock_guard<std::mutex> lock(mu);
  SameGpu*& api = (*all)[{&dev, reportedVersion}];
  if (!api) api = new SameGpu(dev, reportedVersion);
  return *api;
}

}  // namespace cuda
}  // namespace braid
