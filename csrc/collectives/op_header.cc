#include "collectives/op_header.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"

namespace braid {
namespace collectives {

void fillOpHeader(OpHeader* h, uint32_t magic, const OpDesc& op, uint64_t seq) {
  h->magic = magic;
  h->kind = static_cast<uint32_t>(op.kind);
  h->opSeq = seq;
  h->dtype = static_cast<uint32_t>(op.dtype);
  h->redop = static_cast<uint32_t>(op.redop);
  h->root = op.root;
  h->failed = op.localError.empty() ? 0 : 1;
  h->count = op.count;
  // Field by field: a struct copy would carry the padding after ndim, stack
  // bytes of the caller's, onto the wire.
  std::memset(static_cast<void*>(&h->shape), 0, sizeof h->shape);
  h->shape.ndim = op.shape.ndim;
  std::memcpy(h->shape.dims, op.shape.dims, sizeof h->shape.dims);
  h->wire = op.narrowed() ? 1 + static_cast<uint32_t>(op.wire) : 0;
  h->wireDivisor = op.narrowed() ? op.wireDivisor : 0.f;
  const size_t n = std::min(op.localError.size(), kOpMessageBytes - 1);
  std::memcpy(h->message, op.localError.data(), n);
  h->message[n] = '\0';
}

namespace {

std::string wireName(const OpHeader& h) {
  if (h.wire == 0) return strCat("its ", toString(static_cast<DataType>(h.dtype)), " values");
  return strCat("its values divided by ", h.wireDivisor, " as ",
                toString(static_cast<DataType>(h.wire - 1)));
}

}  // namespace

void settingDiffers(const char* op, int rank, int peer, const char* setting,
                    const std::string& theirs, const std::string& ours) {
  BRAID_THROW(Error, op, rank, "rank ", peer, " runs with ", setting, "=", theirs,
              ", this rank with ", setting, "=", ours,
              " (settings that shape an op must be equal on every rank)");
}

void checkOpHeader(const char* me, int rank, int peer, const OpHeader& theirs,
                   const OpHeader& mine) {
  if (theirs.magic != mine.magic) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " sent a corrupt op header (op #", mine.opSeq,
                ", magic ", theirs.magic, ", expected ", mine.magic, ")");
  }
  if (theirs.failed) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " failed this op: ",
                std::string(theirs.message, strnlen(theirs.message, kOpMessageBytes)));
  }
  if (theirs.kind != mine.kind) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " called ",
                opName(static_cast<OpKind>(theirs.kind)), " at this point (op #", mine.opSeq,
                "), this rank ", me);
  }
  if (theirs.opSeq != mine.opSeq) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " is at op #", theirs.opSeq,
                ", this rank at op #", mine.opSeq);
  }
  if (theirs.dtype != mine.dtype || theirs.count != mine.count || !(theirs.shape == mine.shape)) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " passed shape ", theirs.shape.str(), " (",
                toString(static_cast<DataType>(theirs.dtype)), "), this rank shape ",
                mine.shape.str(), " (", toString(static_cast<DataType>(mine.dtype)), ")");
  }
  if (theirs.wire != mine.wire || theirs.wireDivisor != mine.wireDivisor) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " sends ", wireName(theirs), ", this rank ",
                wireName(mine), " (Note [Allreduce on a narrower wire]: every rank of the "
                "group must use the same compression hook)");
  }
  if (theirs.root != mine.root) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " passed root ", theirs.root,
                ", this rank root ", mine.root);
  }
  if (theirs.redop != mine.redop) {
    BRAID_THROW(Error, me, rank, "rank ", peer, " passed reduce op ",
                toString(static_cast<ReduceOp>(theirs.redop)), ", this rank ",
                toString(static_cast<ReduceOp>(mine.redop)));
  }
}

}  // namespace collectives
}  // namespace braid
