// The hierarchical collectives as an NcclApi: Note [Hierarchical CUDA
// collectives] in multi_gpu.h.
#include "cuda/shared_gpu/multi_gpu.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "cuda/on_device.h"
#include "cuda/shared_gpu/same_gpu.h"

namespace braid {
namespace cuda {
namespace {

constexpr uint64_t kMagic = 0x7265696864696172ULL;  // the unique id's mark

// Note [Hierarchical scratch arena] in multi_gpu.h.
BRAID_SETTING_INT(kScratchBytes, "BRAID_CUDA_SCRATCH_BYTES", 64 << 20,
                  "Device memory per rank reserved when a hierarchical CUDA communicator "
                  "(ranks on several GPUs, some sharing one) is created, for the steps of reduce, "
                  "allgather and reduce_scatter that must not touch the caller's buffers; never "
                  "grown during an op. A reduce larger than it runs in chunks of it; an allgather "
                  "or reduce_scatter whose leader needs more fails, naming the bytes. Must be equal "
                  "on every rank.");

// One rank's communicator: its GPU's same-GPU one, and the leaders' NCCL one
// (leaders only).
struct HierComm {
  NcclComm inner = nullptr;
  NcclComm lead = nullptr;
  Event leadDone = nullptr;  // leaders: recorded after each NCCL step
  // Device memory for the steps that must not touch the caller's buffers
  // (Note [Hierarchical reduce, allgather and reduce_scatter]): reserved at
  // init, never grown (Note [Hierarchical scratch arena]), freed at close;
  // `stream` is the last op's, which close() drains.
  void* scratch = nullptr;
  size_t scratchBytes = 0;
  Stream stream = nullptr;
  int device = 0;
  int rank = 0;
  int gpu = 0;
  int local = 0;  // this rank's place on its GPU; 0: the leader
  std::mutex mu;
  std::string lastError;
  std::map<NcclRedOp, NcclRedOp> premul;  // ours -> the inner communicator's
};

size_t typeSize(NcclDataType t) {
  switch (t) {
    case kNcclInt8:
    case kNcclUint8: return 1;
    case kNcclFloat16:
    case kNcclBfloat16: return 2;
    case kNcclInt32:
    case kNcclUint32:
    case kNcclFloat32: return 4;
    default: return 8;
  }
}

bool isFloat(NcclDataType t) {
  return t == kNcclFloat16 || t == kNcclFloat32 || t == kNcclFloat64 || t == kNcclBfloat16;
}

// The worse of two results: an error, else in progress, else success.
NcclResult worse(NcclResult a, NcclResult b) {
  if (a != kNcclSuccess && a != kNcclInProgress) return a;
  if (b != kNcclSuccess && b != kNcclInProgress) return b;
  return a == kNcclInProgress ? a : b;
}

class Hier final : public NcclApi {
 public:
  Hier(DeviceApi& dev, NcclApi& leaders, transport::Store& store, std::string prefix,
       HierLayout layout, std::chrono::milliseconds timeout)
      : dev_(dev),
        inner_(sameGpuCollectives(dev)),
        leaders_(leaders),
        store_(store),
        prefix_(std::move(prefix)),
        layout_(std::move(layout)),
        timeout_(timeout) {
    // Whether GPU g holds ranks g*k .. g*k+k-1: then the leaders' blocks,
    // in GPU order, are already in rank order (no permutation).
    const size_t k = layout_.ranksOn.empty() ? 0 : layout_.ranksOn[0].size();
    for (size_t g = 0; g < layout_.ranksOn.size(); ++g) {
      for (size_t q = 0; q < layout_.ranksOn[g].size(); ++q) {
        contiguous_ = contiguous_ && layout_.ranksOn[g][q] == static_cast<int>(g * k + q);
      }
    }
  }

  std::string name() const override {
    return strCat("braid hierarchical collectives (", layout_.gpuOf.size(), " ranks on ",
                  layout_.ranksOn.size(), " GPUs; same-GPU within, ", leaders_.name(),
                  " between)");
  }
  bool simulated() const override { return dev_.simulated(); }
  int version() override { return leaders_.version(); }
  const char* getErrorString(NcclResult r) override { return ncclResultName(r); }
  std::string lastError(NcclComm comm) override {
    if (!comm) return "";
    HierComm& c = *static_cast<HierComm*>(comm);
    std::lock_guard<std::mutex> lock(c.mu);
    return c.lastError;
  }

  // Only a nonce: the sub-communicators' ids travel through the store.
  NcclResult getUniqueId(NcclUniqueId* id) override {
    std::memset(id->internal, 0, sizeof(id->internal));
    std::memcpy(id->internal, &kMagic, sizeof(kMagic));
    std::random_device rd;
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = rd();
      std::memcpy(id->internal + sizeof(kMagic) + 4 * i, &v, 4);
    }
    return kNcclSuccess;
  }

  NcclResult commInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                          bool blocking) override {
    *comm = nullptr;
    uint64_t magic = 0;
    std::memcpy(&magic, id.internal, sizeof(magic));
    if (magic != kMagic || nranks != static_cast<int>(layout_.gpuOf.size()) || rank < 0 ||
        rank >= nranks) {
      return kNcclInvalidArgument;
    }
    static const char* hex = "0123456789abcdef";
    std::string nonce;
    for (int i = 0; i < 16; ++i) {
      const auto b = static_cast<uint8_t>(id.internal[sizeof(magic) + i]);
      nonce += hex[b >> 4];
      nonce += hex[b & 15];
    }
    auto c = std::make_unique<HierComm>();
    c->device = dev_.getDevice();
    c->rank = rank;
    c->gpu = layout_.gpuOf[rank];
    const std::vector<int>& mine = layout_.ranksOn[c->gpu];
    while (mine[c->local] != rank) ++c->local;
    const bool leader = c->local == 0;
    // The same-GPU id, made by the GPU's leader; the leaders' NCCL id, made
    // by rank 0 (GPU 0's leader).
    NcclUniqueId innerId, leadId;
    NcclResult r =
        exchange(inner_, leader, strCat(prefix_, "hier/", nonce, "/gpu/", c->gpu), &innerId,
                 rank);
    if (r != kNcclSuccess) return r;
    if (leader) {
      r = exchange(leaders_, c->gpu == 0, strCat(prefix_, "hier/", nonce, "/leaders"), &leadId,
                   rank);
      if (r != kNcclSuccess) return r;
    }
    r = inner_.commInitRank(&c->inner, static_cast<int>(mine.size()), innerId, c->local, blocking);
    if (r != kNcclSuccess && r != kNcclInProgress) {
      if (c->inner) inner_.commAbort(c->inner);
      return r;
    }
    // The arena, now rather than mid-op (Note [Hierarchical scratch arena]).
    const size_t arena = static_cast<size_t>(std::max<int64_t>(0, kScratchBytes.get()));
    if (arena > 0) {
      try {
        c->scratch = dev_.deviceAlloc(c->device, arena);
        c->scratchBytes = arena;
      } catch (const std::exception& e) {
        BRAID_LOG(kError, "hier", rank) << "reserving " << arena
                                        << " bytes of scratch (BRAID_CUDA_SCRATCH_BYTES): "
                                        << e.what();
        inner_.commAbort(c->inner);
        return kNcclUnhandledCudaError;
      }
    }
    if (leader) {
      try {
        c->leadDone = dev_.eventCreate(dev_.getDevice());
      } catch (const std::exception&) {
        inner_.commAbort(c->inner);
        releaseScratch(*c);
        return kNcclUnhandledCudaError;
      }
      NcclResult l = leaders_.commInitRank(&c->lead, static_cast<int>(layout_.ranksOn.size()),
                                           leadId, c->gpu, blocking);
      if (l != kNcclSuccess && l != kNcclInProgress) {
        if (c->lead) leaders_.commAbort(c->lead);
        inner_.commAbort(c->inner);
        releaseEvent(c->leadDone);
        releaseScratch(*c);
        return l;
      }
      r = worse(r, l);
    }
    *comm = c.release();
    return r;
  }

  NcclResult commDestroy(NcclComm comm) override { return close(comm, &NcclApi::commDestroy); }
  NcclResult commAbort(NcclComm comm) override { return close(comm, &NcclApi::commAbort); }
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* asyncError) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    NcclResult in = kNcclSuccess, lead = kNcclSuccess;
    NcclResult r = inner_.commGetAsyncError(c.inner, &in);
    if (r != kNcclSuccess) in = r;
    if (in != kNcclSuccess && in != kNcclInProgress) {
      note(c, strCat("within ", gpuText(c.gpu), ": ", inner_.lastError(c.inner)));
    } else if (c.lead) {
      r = leaders_.commGetAsyncError(c.lead, &lead);
      if (r != kNcclSuccess) lead = r;
      if (lead != kNcclSuccess && lead != kNcclInProgress) {
        note(c, strCat("between the GPUs' leaders ", leadersText(), ": ",
                       leaders_.lastError(c.lead)));
      }
    }
    *asyncError = worse(in, lead);
    return kNcclSuccess;
  }
  void setTimeout(NcclComm comm, std::chrono::milliseconds t) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    inner_.setTimeout(c.inner, t);
    if (c.lead) leaders_.setTimeout(c.lead, t);
  }

  // Not passed on (Note [Hierarchical CUDA collectives]).
  NcclResult groupStart() override { return kNcclSuccess; }
  NcclResult groupEnd() override { return kNcclSuccess; }

  NcclResult allReduce(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                       NcclComm comm, Stream s) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    NcclRedOp innerOp, leadOp;
    NcclResult r = levelOps(c, op, type, &innerOp, &leadOp);
    if (r != kNcclSuccess || count == 0) return r;
    r = step(c, inner_.reduce(send, recv, count, type, innerOp, 0, c.inner, s),
                        "reducing within", c.inner, inner_);
    if (r != kNcclSuccess) return r;
    if (c.lead) {
      r = step(c, leaders_.allReduce(recv, recv, count, type, leadOp, c.lead, s),
               "allreducing between the GPUs' leaders, from", c.lead, leaders_);
      if (r == kNcclSuccess) r = confirm(c, s, "allreducing between the GPUs' leaders, from");
      if (r != kNcclSuccess) return r;
    }
    return step(c, inner_.broadcast(recv, recv, count, type, 0, c.inner, s),
                "broadcasting within", c.inner, inner_);
  }

  NcclResult broadcast(const void* send, void* recv, size_t count, NcclDataType type, int root,
                       NcclComm comm, Stream s) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    if (root < 0 || root >= static_cast<int>(layout_.gpuOf.size())) return kNcclInvalidArgument;
    if (count == 0) return kNcclSuccess;
    const int rootGpu = layout_.gpuOf[root];
    NcclResult r;
    if (c.gpu == rootGpu) {
      const std::vector<int>& mine = layout_.ranksOn[c.gpu];
      int rootLocal = 0;
      while (mine[rootLocal] != root) ++rootLocal;
      r = step(c, inner_.broadcast(send, recv, count, type, rootLocal, c.inner, s),
               "broadcasting within the root's", c.inner, inner_);
      if (r != kNcclSuccess) return r;
    }
    if (c.lead) {
      r = step(c, leaders_.broadcast(recv, recv, count, type, rootGpu, c.lead, s),
               "broadcasting between the GPUs' leaders, from", c.lead, leaders_);
      // The root's GPU has its data already; the others read the leader's.
      if (r == kNcclSuccess && c.gpu != rootGpu) {
        r = confirm(c, s, "broadcasting between the GPUs' leaders, from");
      }
      if (r != kNcclSuccess) return r;
    }
    if (c.gpu != rootGpu) {
      return step(c, inner_.broadcast(recv, recv, count, type, 0, c.inner, s),
                  "broadcasting within", c.inner, inner_);
    }
    return kNcclSuccess;
  }

  // As the same-GPU collectives': no AVG of integers (the backend stages it).
  bool reduces(NcclDataType t, NcclRedOp op) const override { return op != kNcclAvg || isFloat(t); }
  // Note [Hierarchical reduce, allgather and reduce_scatter] in multi_gpu.h.
  bool hasCore(Core core) const override { return core != Core::kSendRecv; }

  NcclResult reduce(const void* send, void* recv, size_t count, NcclDataType type, NcclRedOp op,
                    int root, NcclComm comm, Stream s) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    if (root < 0 || root >= static_cast<int>(layout_.gpuOf.size())) return kNcclInvalidArgument;
    NcclRedOp innerOp, leadOp;
    NcclResult r = levelOps(c, op, type, &innerOp, &leadOp);
    if (r != kNcclSuccess || count == 0) return r;
    // Elementwise: chunks of the arena (the same on every rank, as the
    // setting is), each a whole reduce (Note [Hierarchical scratch arena]).
    const size_t ts = typeSize(type);
    const size_t chunk = std::max<size_t>(1, c.scratchBytes / ts);
    for (size_t off = 0; off < count && r == kNcclSuccess; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      r = reduceChunk(c, static_cast<const char*>(send) + off * ts,
                      recv ? static_cast<char*>(recv) + off * ts : nullptr, n, type, innerOp,
                      leadOp, root, s);
    }
    return r;
  }

  NcclResult reduceChunk(HierComm& c, const void* send, void* recv, size_t count,
                         NcclDataType type, NcclRedOp innerOp, NcclRedOp leadOp, int root,
                         Stream s) {
    NcclResult r;
    const size_t bytes = count * typeSize(type);
    const int rootGpu = layout_.gpuOf[root];
    const int rootLocal = localOf(root);
    const bool leader = c.lead != nullptr;
    const bool amRoot = layout_.ranksOn[c.gpu][c.local] == root;
    // The leader's partial and the leaders' result: the root's output when
    // the leader is the root, else scratch (a non-root's buffer is its input).
    char* part = nullptr;
    if (leader) {
      part = amRoot ? static_cast<char*>(recv) : scratch(c, bytes, s, "reduce: reducing within");
      if (!part) return kNcclInvalidUsage;
    }
    r = step(c, inner_.reduce(send, leader ? part : recv, count, type, innerOp, 0, c.inner, s),
             "reducing within", c.inner, inner_);
    if (r != kNcclSuccess) return r;
    if (leader) {
      r = step(c, leaders_.reduce(part, part, count, type, leadOp, rootGpu, c.lead, s),
               "reducing between the GPUs' leaders, from", c.lead, leaders_);
      // The root's GPU holds the result: its leader waits for it, as
      // allreduce's leaders do (an aborted NCCL kernel ends without an
      // error on the stream); the other leaders' part ends here.
      if (r == kNcclSuccess && c.gpu == rootGpu) {
        r = confirm(c, s, "reducing between the GPUs' leaders, from");
      }
      if (r != kNcclSuccess) return r;
    }
    if (c.gpu != rootGpu || rootLocal == 0) return kNcclSuccess;
    // The leader's result to the root: a broadcast within the root's GPU,
    // which the GPU's other ranks receive into their scratch.
    char* to = amRoot ? static_cast<char*>(recv) : part;
    if (!to) to = scratch(c, bytes, s, "reduce: moving the result within");
    if (!to) return kNcclInvalidUsage;
    return step(c, inner_.broadcast(leader ? part : to, to, count, type, 0, c.inner, s),
                "moving the result to the root within", c.inner, inner_);
  }

  NcclResult allGather(const void* send, void* recv, size_t count, NcclDataType type,
                       NcclComm comm, Stream s) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    if (count == 0) return kNcclSuccess;
    const size_t block = count * typeSize(type);
    const int gpus = static_cast<int>(layout_.ranksOn.size());
    const int k = static_cast<int>(layout_.ranksOn[c.gpu].size());
    const size_t n = layout_.gpuOf.size();
    char* out = static_cast<char*>(recv);
    // The leader stages the blocks in GPU order (g * k + local): the output
    // itself where that is rank order, else scratch.
    char* stage = out;
    if (c.lead && !contiguous_) {
      stage = scratch(c, n * block, s, "allgather: gathering within");
      if (!stage) return kNcclInvalidUsage;
    }
    std::vector<void*> into(k);
    for (int q = 0; q < k; ++q) into[q] = stage + (static_cast<size_t>(c.gpu) * k + q) * block;
    NcclResult r = step(c, inner_.gather(send, into.data(), count, type, 0, c.inner, s),
                        "gathering within", c.inner, inner_);
    if (r != kNcclSuccess) return r;
    if (c.lead) {
      r = step(c, leaders_.allGather(into[0], stage, k * count, type, c.lead, s),
               "allgathering between the GPUs' leaders, from", c.lead, leaders_);
      if (r == kNcclSuccess) r = confirm(c, s, "allgathering between the GPUs' leaders, from");
      if (r != kNcclSuccess) return r;
      if (!contiguous_) {
        try {
          for (int g = 0; g < gpus; ++g) {
            for (int q = 0; q < k; ++q) {
              dev_.memcpyAsync(out + layout_.ranksOn[g][q] * block,
                               stage + (static_cast<size_t>(g) * k + q) * block, block, s);
            }
          }
        } catch (const std::exception& e) {
          return fail(c, kNcclUnhandledCudaError,
                      strCat("allgather: ordering the blocks by rank on ", gpuText(c.gpu), ": ",
                             e.what()));
        }
      }
    }
    return step(c, inner_.broadcast(out, out, n * count, type, 0, c.inner, s),
                "broadcasting the gathered blocks within", c.inner, inner_);
  }

  NcclResult reduceScatter(const void* send, void* recv, size_t count, NcclDataType type,
                           NcclRedOp op, NcclComm comm, Stream s) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    NcclRedOp innerOp, leadOp;
    NcclResult r = levelOps(c, op, type, &innerOp, &leadOp);
    if (r != kNcclSuccess || count == 0) return r;
    const size_t block = count * typeSize(type);
    const int gpus = static_cast<int>(layout_.ranksOn.size());
    const int k = static_cast<int>(layout_.ranksOn[c.gpu].size());
    const size_t n = layout_.gpuOf.size();
    // The leader: the GPU's partial of all n blocks in rank order (`part`),
    // then in GPU order (`byGpu`; the same buffer where those agree).
    char* part = nullptr;
    char* byGpu = nullptr;
    if (c.lead) {
      part = scratch(c, (contiguous_ ? 1 : 2) * n * block, s, "reduce_scatter: reducing within");
      if (!part) return kNcclInvalidUsage;
      byGpu = contiguous_ ? part : part + n * block;
    }
    r = step(c, inner_.reduce(send, c.lead ? part : recv, n * count, type, innerOp, 0, c.inner, s),
             "reducing within", c.inner, inner_);
    if (r != kNcclSuccess) return r;
    std::vector<const void*> from(k, nullptr);
    if (c.lead) {
      try {
        for (int g = 0; g < gpus && !contiguous_; ++g) {
          for (int q = 0; q < k; ++q) {
            dev_.memcpyAsync(byGpu + (static_cast<size_t>(g) * k + q) * block,
                             part + layout_.ranksOn[g][q] * block, block, s);
          }
        }
      } catch (const std::exception& e) {
        return fail(c, kNcclUnhandledCudaError,
                    strCat("reduce_scatter: ordering the blocks by GPU on ", gpuText(c.gpu), ": ",
                           e.what()));
      }
      char* mine = byGpu + static_cast<size_t>(c.gpu) * k * block;
      r = step(c, leaders_.reduceScatter(byGpu, mine, k * count, type, leadOp, c.lead, s),
               "reduce-scattering between the GPUs' leaders, from", c.lead, leaders_);
      if (r == kNcclSuccess) {
        r = confirm(c, s, "reduce-scattering between the GPUs' leaders, from");
      }
      if (r != kNcclSuccess) return r;
      for (int q = 0; q < k; ++q) from[q] = mine + q * block;
    }
    return step(c, inner_.scatter(from.data(), recv, count, type, 0, c.inner, s),
                "scattering the reduced blocks within", c.inner, inner_);
  }
  NcclResult send(const void*, size_t, NcclDataType, int, NcclComm comm, Stream) override {
    return unsupported(comm, "send");
  }
  NcclResult recv(void*, size_t, NcclDataType, int, NcclComm comm, Stream) override {
    return unsupported(comm, "recv");
  }

  // PREMUL_SUM: this rank's factor within its GPU (the same-GPU collectives
  // scale the input as they copy it in), SUM among the leaders.
  NcclResult redOpCreatePreMulSum(NcclRedOp* op, const void* scalar, NcclDataType type,
                                  NcclComm comm) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    NcclRedOp innerOp;
    NcclResult r = inner_.redOpCreatePreMulSum(&innerOp, scalar, type, c.inner);
    if (r != kNcclSuccess) return r;
    std::lock_guard<std::mutex> lock(c.mu);
    *op = nextPremul_.fetch_add(1);
    c.premul[*op] = innerOp;
    return kNcclSuccess;
  }
  NcclResult redOpDestroy(NcclRedOp op, NcclComm comm) override {
    HierComm& c = *static_cast<HierComm*>(comm);
    NcclRedOp innerOp;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.premul.find(op);
      if (it == c.premul.end()) return kNcclInvalidArgument;
      innerOp = it->second;
      c.premul.erase(it);
    }
    return inner_.redOpDestroy(innerOp, c.inner);
  }

 private:
  // Publishes (`make`) or fetches the id of one sub-communicator. The
  // communicator does not exist yet, so a failure is logged here (the
  // executor reports only the code).
  NcclResult exchange(NcclApi& api, bool make, const std::string& key, NcclUniqueId* id,
                      int rank) {
    if (make) {
      NcclResult r = api.getUniqueId(id);
      if (r != kNcclSuccess) return r;
      try {
        store_.set(key, std::vector<uint8_t>(id->internal, id->internal + sizeof(id->internal)));
      } catch (const std::exception& e) {
        BRAID_LOG(kError, "hier", rank) << "publishing store key '" << key << "': " << e.what();
        return kNcclSystemError;
      }
      return kNcclSuccess;
    }
    std::vector<uint8_t> bytes;
    try {
      bytes = store_.get(key, timeout_);
    } catch (const std::exception& e) {
      // A GPU's leader (or rank 0, for the leaders' id) never came.
      BRAID_LOG(kError, "hier", rank) << "waiting for store key '" << key << "' (published by "
                                      << (key.find("/leaders") != std::string::npos
                                              ? "rank 0"
                                              : "this GPU's leader")
                                      << "): " << e.what();
      return kNcclSystemError;
    }
    if (bytes.size() != sizeof(id->internal)) return kNcclInternalError;
    std::memcpy(id->internal, bytes.data(), bytes.size());
    return kNcclSuccess;
  }

  // "GPU 1 (ranks 2, 3 as its local ranks 0, 1)": the same-GPU level's
  // messages name local ranks.
  std::string gpuText(int g) const {
    std::string ranks, locals;
    for (size_t q = 0; q < layout_.ranksOn[g].size(); ++q) {
      ranks += strCat(q ? ", " : "", layout_.ranksOn[g][q]);
      locals += strCat(q ? ", " : "", q);
    }
    return strCat("GPU ", g, " (ranks ", ranks, " as its local ranks ", locals, ")");
  }
  // "(ranks 0, 2 as its NCCL ranks 0, 1)": NCCL's messages name GPUs.
  std::string leadersText() const {
    std::string ranks, locals;
    for (size_t g = 0; g < layout_.ranksOn.size(); ++g) {
      ranks += strCat(g ? ", " : "", layout_.ranksOn[g][0]);
      locals += strCat(g ? ", " : "", g);
    }
    return strCat("(ranks ", ranks, " as its NCCL ranks ", locals, ")");
  }
  void note(HierComm& c, std::string text) {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.lastError.empty()) c.lastError = std::move(text);
  }
  NcclResult fail(HierComm& c, NcclResult r, std::string text) {
    note(c, std::move(text));
    return r;
  }
  // One level's call: an error keeps that level's text.
  NcclResult step(HierComm& c, NcclResult r, const char* what, NcclComm sub, NcclApi& api) {
    if (r == kNcclSuccess) return r;
    if (r == kNcclInProgress) {
      // A non-blocking NCCL that enqueues later: the next step must follow it.
      NcclResult e = kNcclInProgress;
      auto sleep = std::chrono::microseconds(20);
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (api.commGetAsyncError(sub, &e) == kNcclSuccess && e == kNcclInProgress) {
        if (std::chrono::steady_clock::now() > deadline) {
          return fail(c, kNcclSystemError, strCat(what, " ", gpuText(c.gpu), ": still in progress after ",
                                                  timeout_.count(), " ms"));
        }
        std::this_thread::sleep_for(sleep);
        if (sleep < std::chrono::microseconds(1000)) sleep *= 2;
      }
      if (e == kNcclSuccess) return e;
      r = e;
    }
    return fail(c, r, strCat(what, " ", gpuText(c.gpu), ": ", api.lastError(sub)));
  }
  // Leaders: waits on the host until the NCCL step just enqueued on `s` has
  // run, and fails when NCCL reported an error (Note [Hierarchical CUDA
  // collectives]: an aborted NCCL kernel returns without an error on the
  // stream, so the GPU's peers must not be let read the leader's buffer
  // before its NCCL step is known good).
  NcclResult confirm(HierComm& c, Stream s, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto sleep = std::chrono::microseconds(5);
    RelaxedCaptureMode relaxed(dev_);  // Note [Graph capture] in cuda/device_api.h
    try {
      dev_.eventRecord(c.leadDone, s);
      for (;;) {
        const bool done = dev_.eventQuery(c.leadDone);
        NcclResult e = kNcclSuccess;
        NcclResult r = leaders_.commGetAsyncError(c.lead, &e);
        if (r != kNcclSuccess) e = r;
        if (e != kNcclSuccess && e != kNcclInProgress) {
          return fail(c, e, strCat(what, " ", gpuText(c.gpu), ", between the leaders ",
                                   leadersText(), ": ", leaders_.lastError(c.lead)));
        }
        if (done) return kNcclSuccess;
        if (std::chrono::steady_clock::now() > deadline) {
          return fail(c, kNcclSystemError,
                      strCat(what, " ", gpuText(c.gpu), ": not done after ", timeout_.count(),
                             " ms (a GPU's leader did not join?)"));
        }
        std::this_thread::sleep_for(sleep);
        if (sleep < std::chrono::microseconds(500)) sleep *= 2;
      }
    } catch (const std::exception& e) {
      return fail(c, kNcclUnhandledCudaError, strCat(what, " ", gpuText(c.gpu), ": ", e.what()));
    }
  }
  // The op at each level (Note [Hierarchical CUDA collectives]): AVG at both
  // (floats only), PREMUL_SUM as this rank's factor within its GPU and SUM
  // among the leaders.
  NcclResult levelOps(HierComm& c, NcclRedOp op, NcclDataType type, NcclRedOp* innerOp,
                      NcclRedOp* leadOp) {
    *innerOp = *leadOp = op;
    if (op == kNcclAvg && !isFloat(type)) {
      return fail(c, kNcclInvalidUsage, "AVG of integers is not one of braid's hierarchical "
                                        "collectives");
    }
    if (op > kNcclAvg) {  // a PREMUL_SUM made here
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.premul.find(op);
      if (it == c.premul.end()) return kNcclInvalidArgument;
      *innerOp = it->second;
      *leadOp = kNcclSum;
    }
    return kNcclSuccess;
  }
  // Rank `rank`'s place on its GPU.
  int localOf(int rank) const {
    const std::vector<int>& on = layout_.ranksOn[layout_.gpuOf[rank]];
    int q = 0;
    while (on[q] != rank) ++q;
    return q;
  }
  // This rank's scratch arena, when it holds `bytes`; else null, with the
  // error noted: the arena is never grown mid-op (Note [Hierarchical
  // scratch arena]).
  char* scratch(HierComm& c, size_t bytes, Stream s, const char* what) {
    c.stream = s;
    if (bytes > c.scratchBytes) {
      fail(c, kNcclInvalidUsage,
           strCat(what, " ", gpuText(c.gpu), " (rank ", c.rank, "): needs ", bytes,
                  " bytes of scratch, and the arena reserved at the communicator's creation "
                  "has ", c.scratchBytes, " (BRAID_CUDA_SCRATCH_BYTES)"));
      return nullptr;
    }
    return static_cast<char*>(c.scratch);
  }
  // As the same-GPU communicator's close: the stream drains (bounded)
  // before the scratch is freed; past the bound it stays (a leak, logged)
  // rather than being pulled from under a kernel.
  void releaseScratch(HierComm& c) {
    if (!c.scratch) return;
    RelaxedCaptureMode relaxed(dev_);  // Note [Graph capture] in cuda/device_api.h
    bool idle = true;
    if (c.stream) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      try {
        while (!(idle = dev_.streamQuery(c.stream)) && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      } catch (const std::exception&) {
        idle = true;  // a sticky error: the stream runs nothing more
      }
    }
    if (!idle) {
      BRAID_LOG(kError, "hier", c.rank) << "the stream is still busy after 10 s: " << c.scratchBytes
                                    << " bytes of scratch stay allocated";
      return;
    }
    try {
      dev_.deviceFree(c.scratch);
    } catch (const std::exception& e) {
      BRAID_LOG(kWarn, "hier", c.rank) << "freeing the scratch: " << e.what();
    }
    c.scratch = nullptr;
  }
  void releaseEvent(Event e) {
    if (!e) return;
    try {
      dev_.eventDestroy(e);
    } catch (...) {
    }
  }
  // Destroys or aborts both levels (`how`), then frees the communicator.
  NcclResult close(NcclComm comm, NcclResult (NcclApi::*how)(NcclComm)) {
    HierComm* c = static_cast<HierComm*>(comm);
    NcclResult r = kNcclSuccess;
    if (c->lead) r = (leaders_.*how)(c->lead);
    if (c->inner) r = worse((inner_.*how)(c->inner), r);
    releaseScratch(*c);
    releaseEvent(c->leadDone);
    delete c;
    return r;
  }
  NcclResult unsupported(NcclComm comm, const char* what) {
    if (comm) {
      fail(*static_cast<HierComm*>(comm), kNcclInvalidUsage,
           strCat(what, " is not one of braid's hierarchical collectives"));
    }
    return kNcclInvalidUsage;
  }

  DeviceApi& dev_;
  NcclApi& inner_;
  NcclApi& leaders_;
  transport::Store& store_;
  const std::string prefix_;
  const HierLayout layout_;
  const std::chrono::milliseconds timeout_;
  bool contiguous_ = true;  // GPU g holds ranks g*k .. g*k+k-1
  std::atomic<NcclRedOp> nextPremul_{2000};
};

}  // namespace

std::unique_ptr<NcclApi> hierarchicalCollectives(DeviceApi& dev, NcclApi& leaders,
                                                 transport::Store& store, std::string storePrefix,
                                                 HierLayout layout,
                                                 std::chrono::milliseconds timeout) {
  return std::make_unique<Hier>(dev, leaders, store, std::move(storePrefix), std::move(layout),
                                timeout);
}

}  // namespace cuda
}  // namespace braid
