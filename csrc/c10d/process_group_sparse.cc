// allreduce of a sparse COO tensor (ReduceOp.SUM), the way gloo does it, so
// that DDP with nn.Embedding(sparse=True) and dist.all_reduce on sparse
// tensors work on braid and give gloo's bits.
//
// Note [Sparse allreduce]
// Ranks hold different numbers of nonzeros, and braid's allgather moves equal
// blocks, so the op takes two steps, both on the worker:
//   1. every rank coalesces its input and allgathers a small metadata block
//      (sparse dims, nnz). This step's op header carries the tensor's full
//      shape and value dtype, so ranks that pass different sizes or dtypes
//      fail there, all at once, with braid's usual message (Note [Op headers]);
//   2. every rank allgathers its indices and values, padded to the largest
//      nnz (gloo used to pad the same way; its allgatherv is not in braid).
// Then every rank sums the n sparse tensors in rank order and coalesces, with
// the same ATen calls as ProcessGroupGloo's AsyncSparseAllreduceWork, and
// copies the result into the input tensor, as gloo does: the Work's result and
// its future's value are that tensor (DDP's sparse path reads the future).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include "engine/engine.h"
#include "c10d/process_group.h"
#include "c10d/tensor_args.h"
#include "collectives/shm/collectives.h"
#include "common/error.h"

namespace braid {

using collectives::OpDesc;
using collectives::OpKind;

namespace {

constexpr int64_t kMagic = 0x627261696473704c;  // "braidspL": a sparse allreduce's metadata
constexpr int64_t kMetaWords = 4;              // magic, sparse dims, nnz, spare

int64_t roundUp8(int64_t v) { return (v + 7) / 8 * 8; }

// Bytes of step 1's block. Its header claims `bytes / element size` elements
// of the tensor's shape; if a dense tensor of that shape had exactly as many,
// a dense allreduce on a peer would pass the header check, so then the block
// doubles (the product is capped: sparse shapes can overflow int64).
size_t metaBytes(const at::Tensor& t) {
  const int64_t small = kMetaWords * 8, count = small / static_cast<int64_t>(t.element_size());
  const int64_t cap = count + 1;  // "more than count"; keeps the products small
  int64_t numel = 1;
  for (int64_t d : t.sizes()) numel = std::min(numel * std::min(d, cap), cap);
  return static_cast<size_t>(numel == count ? 2 * small : small);
}

// Errors of step 2 would name an allgather; the caller made an allreduce.
[[noreturn]] void rethrowInStep2() {
  const char* where = " (in the indices/values allgather of a sparse allreduce)";
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(std::string(e.what()) + where);
  } catch (const PeerLostError& e) {
    throw PeerLostError(std::string(e.what()) + where);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + where);
  }
}

// The worker's part; `meta` is step 1's OpDesc, `t` the caller's tensor.
void runSparse(collectives::Group& comm, const OpDesc& meta, const at::Tensor& t) {
  const int rank = comm.rank(), n = comm.size();
  // As gloo: the ATen calls below must not record autograd history.
  at::AutoDispatchBelowAutograd guard;
  at::Tensor in = t.coalesce();
  const int64_t sparseDim = in.sparse_dim(), nnz = in._nnz();

  // Step 1: metadata. Rows of `all` are the ranks' blocks (words past
  // kMetaWords, present when the block doubled, are unused).
  const int64_t words = static_cast<int64_t>(meta.bytes() / 8);
  at::Tensor mine = at::zeros({words}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  m[0] = kMagic;
  m[1] = sparseDim;
  m[2] = nnz;
  at::Tensor all = at::empty({n, words}, at::kLong);
  std::vector<void*> rows(n);
  for (int r = 0; r < n; ++r) rows[r] = all[r].data_ptr();
  try {
    comm.allgather(meta, mine.data_ptr(), rows.data());
  } catch (const TimeoutError&) {
    throw;
  } catch (const PeerLostError&) {
    throw;
  } catch (const Error& e) {
    // A peer's dense tensor of this shape and dtype fails the header on its
    // element count, which the message does not show: say why here.
    const std::string same = strCat(meta.shape.str(), " (", toString(meta.dtype), ")");
    const std::string what = e.what();
    const std::string ambiguous = "passed shape " + same + ", this rank shape " + same;
    if (what.size() < ambiguous.size() ||
        what.compare(what.size() - ambiguous.size(), ambiguous.size(), ambiguous) != 0) {
      throw;
    }
    throw Error(what + " (this rank's tensor is sparse, the peer's is not)");
  }

  // Every rank checks every rank's block, so all of them fail together.
  int64_t maxNnz = 0;
  std::vector<int64_t> nnzOf(n);
  for (int r = 0; r < n; ++r) {
    const int64_t* p = all[r].data_ptr<int64_t>();
    BRAID_ENFORCE(p[0] == kMagic, "allreduce", rank, "rank ", r,
                  " did not call allreduce with a sparse tensor at this point; this rank did");
    BRAID_ENFORCE(p[1] == sparseDim, "allreduce", rank, "rank ", r, " passed a sparse tensor with ",
                  p[1], " sparse dims, this rank ", sparseDim, " (shape ", meta.shape.str(), ")");
    nnzOf[r] = p[2];
    maxNnz = std::max(maxNnz, p[2]);
  }

  // Step 2: indices then values, each rank's block padded to maxNnz. Blocks
  // are 8-byte multiples so that every view below is aligned for int64.
  const std::vector<int64_t> valueDims(t.sizes().begin() + sparseDim, t.sizes().end());
  int64_t denseNumel = 1;
  for (int64_t d : valueDims) denseNumel *= d;
  const int64_t esize = static_cast<int64_t>(t.element_size());
  const int64_t idxBytes = sparseDim * maxNnz * 8;
  const int64_t block = roundUp8(idxBytes + maxNnz * denseNumel * esize);
  at::Tensor send = at::empty({block}, at::kByte);
  at::Tensor recv = at::empty({n * block}, at::kByte);
  auto indicesOf = [&](const at::Tensor& b, int64_t k) {
    return b.narrow(0, 0, sparseDim * k * 8).view(at::kLong).view({sparseDim, k});
  };
  auto valuesOf = [&](const at::Tensor& b, int64_t k) {
    std::vector<int64_t> shape{k};
    shape.insert(shape.end(), valueDims.begin(), valueDims.end());
    return b.narrow(0, idxBytes, k * denseNumel * esize).view(t.scalar_type()).view(shape);
  };
  indicesOf(send, nnz).copy_(in._indices());
  valuesOf(send, nnz).copy_(in._values());
  OpDesc d = meta;
  d.kind = OpKind::kAllgather;  // large blocks take direct reads (Note [Direct transfers])
  d.dtype = DataType::kUInt8;
  d.count = static_cast<size_t>(block);
  d.shape = collectives::Shape();
  d.shape.ndim = 1;
  d.shape.dims[0] = block;
  std::vector<void*> outs(n);
  for (int r = 0; r < n; ++r) outs[r] = static_cast<uint8_t*>(recv.data_ptr()) + r * block;
  try {
    comm.allgather(d, send.data_ptr(), outs.data());
  } catch (...) {
    rethrowInStep2();
  }

  // gloo's reduction, call for call, so that the sums round identically.
  // Every rank sums the same data, so where ATen lacks a kernel for the
  // dtype (float16 on torch 1.13), all ranks fail here alike.
  try {
    at::Tensor output;
    for (int r = 0; r < n; ++r) {
      at::Tensor b = recv.narrow(0, r * block, block);
      at::Tensor part = at::sparse_coo_tensor(indicesOf(b, nnzOf[r]), valuesOf(b, nnzOf[r]),
                                              in.sizes(), in.options());
      if (r == 0) {
        output = part;
      } else {
        output += part;
      }
    }
    t.copy_(output.coalesce());
  } catch (const c10::Error& e) {
    BRAID_THROW(Error, "allreduce", rank, "summing sparse ", toString(meta.dtype),
                " tensors failed: ", e.what_without_backtrace());
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduceSparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return guarded(OpKind::kAllreduce, [&] {
    const int rank = getRank();
    BRAID_ENFORCE(tensors.size() == 1, "allreduce", rank, "expects one tensor per call, got ",
                  tensors.size());
    const at::Tensor& t = tensors[0];
    BRAID_ENFORCE(t.device().is_cpu(), "allreduce", rank, "tensors must be on the CPU, got ",
                  t.device().str());
    OpDesc meta = desc(OpKind::kAllreduce, opts.timeout);
    meta.dtype = args::dtypeOf(t, "allreduce", rank);
    double factor = 1.0;
    ReduceOp op = args::reduceOpOf(opts.reduceOp, meta.dtype, "allreduce", rank, &factor);
    BRAID_ENFORCE(op == ReduceOp::kSum, "allreduce", rank,
                  "sparse tensors support only reduce op SUM, got ", toString(op));
    BRAID_ENFORCE(t.dim() <= collectives::kMaxDims, "allreduce", rank, "sparse tensors of up to ",
                  collectives::kMaxDims, " dims are supported, got ", t.dim());
    meta.shape = args::shapeOf(t);
    meta.count = metaBytes(t) / t.element_size();
    Engine* e = engine_.get();
    at::Tensor target = t;
    return launch(meta, c10d::OpType::ALLREDUCE, "braid:sparse_allreduce", tensors,
                  [e, meta, target] { runSparse(e->group(), meta, target); });
  });
}

}  // namespace braid
