#include "cuda/nccl/nccl_api.h"

#include <cstring>

#include "common/error.h"
#include "math/half.h"

namespace braid {
namespace cuda {

const char* ncclResultName(NcclResult r) {
  switch (r) {
    case kNcclSuccess:
      return "ncclSuccess";
    case kNcclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case kNcclSystemError:
      return "ncclSystemError";
    case kNcclInternalError:
      return "ncclInternalError";
    case kNcclInvalidArgument:
      return "ncclInvalidArgument";
    case kNcclInvalidUsage:
      return "ncclInvalidUsage";
    case kNcclRemoteError:
      return "ncclRemoteError";
    case kNcclInProgress:
      return "ncclInProgress";
  }
  return "ncclResult (unknown value)";
}

// Note [NCCL types and ops]
// NCCL has no int16, no bool and no bitwise reductions. So:
// - Ops that only move data (broadcast, allgather, send, recv) run every
//   DataType: a type NCCL lacks travels as its bytes (ncclInt8, count times
//   the element size); bool travels as ncclUint8.
// - float32/64, float16, bfloat16: SUM, PRODUCT, MIN, MAX; AVG as ncclAvg
//   (NCCL sums, then divides once, as braid's CPU path does); PREMUL_SUM as
//   a ncclRedOpCreatePreMulSum op made per call from the factor.
// - int8, uint8, int32, int64: SUM, PRODUCT, MIN, MAX, AVG (ncclAvg divides
//   the integer sum, truncating, as braid's reduce::divide and torch's NCCL).
// - bool (0/1 bytes as ncclUint8): braid's logical rules (Note
//   [Reduced-precision accumulation]): SUM, MAX, BOR are "or", which MAX of
//   0/1 is; PRODUCT, MIN, BAND are "and", which MIN is.
// - Everything else is a braid::Error naming the op, dtype and reduce op
//   before anything is enqueued: BAND/BOR/BXOR on integers, BXOR/AVG/
//   PREMUL_SUM on bool, PREMUL_SUM on integers, and every reduction of
//   int16 (cast to int32 first). Nothing is emulated: an emulation would
//   need its own kernels and a second pass, and these pairs are rare in
//   training (torch's NCCL backend refuses them too).
namespace {

bool nativeType(DataType t, NcclDataType* out) {
  switch (t) {
    case DataType::kFloat32:
      *out = kNcclFloat32;
      return true;
    case DataType::kFloat64:
      *out = kNcclFloat64;
      return true;
    case DataType::kFloat16:
      *out = kNcclFloat16;
      return true;
    case DataType::kBFloat16:
      *out = kNcclBfloat16;
      return true;
    case DataType::kInt8:
      *out = kNcclInt8;
      return true;
    case DataType::kUInt8:
      *out = kNcclUint8;
      return true;
    case DataType::kInt32:
      *out = kNcclInt32;
      return true;
    case DataType::kInt64:
      *out = kNcclInt64;
      return true;
    case DataType::kBool:
      *out = kNcclUint8;
      return true;
    case DataType::kInt16:
      return false;
  }
  return false;
}

// The NCCL op for (type, op), or -1 with *why set.
NcclRedOp reductionOp(DataType type, ReduceOp op, bool* premul, const char** why) {
  *premul = false;
  if (type == DataType::kInt16) {
    *why = "NCCL has no int16 type (cast to int32 for reductions)";
    return -1;
  }
  if (type == DataType::kBool) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
        return kNcclMax;
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return kNcclMin;
      default:
        *why = "NCCL runs bool reductions as or/and only (SUM, PRODUCT, MIN, MAX, BAND, BOR)";
        return -1;
    }
  }
  switch (op) {
    case ReduceOp::kSum:
      return kNcclSum;
    case ReduceOp::kProduct:
      return kNcclProd;
    case ReduceOp::kMin:
      return kNcclMin;
    case ReduceOp::kMax:
      return kNcclMax;
    case ReduceOp::kAvg:
      return kNcclAvg;
    case ReduceOp::kPremulSum:
      if (!isFloating(type)) {
        *why = "PREMUL_SUM needs a float type";
        return -1;
      }
      *premul = true;
      return kNcclSum;  // replaced by the op made from the factor
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      *why = "NCCL has no bitwise reductions";
      return -1;
  }
  *why = "unknown reduce op";
  return -1;
}

}  // namespace

NcclTypeOp ncclBytesTypeFor(DataType type, size_t count) {
  NcclTypeOp r{kNcclInt8, count * elementSize(type), kNcclSum, false};
  if (nativeType(type, &r.type)) r.count = count;
  return r;
}

bool ncclSupports(DataType type, ReduceOp op) {
  bool premul;
  const char* why;
  return reductionOp(type, op, &premul, &why) >= 0;
}

NcclTypeOp ncclReductionFor(DataType type, ReduceOp op, size_t count, const char* opName,
                            int rank) {
  NcclTypeOp r{kNcclInt8, count, kNcclSum, false};
  const char* why = "";
  r.op = reductionOp(type, op, &r.premulSum, &why);
  BRAID_ENFORCE(r.op >= 0 && nativeType(type, &r.type), opName, rank, "reduce op ", toString(op),
                " on ", toString(type), " cannot run on NCCL: ", why);
  return r;
}

void ncclScalarOf(DataType type, double factor, void* out) {
  switch (type) {
    case DataType::kFloat64:
      std::memcpy(out, &factor, 8);
      return;
    case DataType::kFloat32: {
      float f = static_cast<float>(factor);
      std::memcpy(out, &f, 4);
      return;
    }
    case DataType::kFloat16: {
      uint16_t h = reduce::floatToHalf(static_cast<float>(factor));
      std::memcpy(out, &h, 2);
      return;
    }
    case DataType::kBFloat16: {
      uint16_t b = reduce::floatToBf16(static_cast<float>(factor));
      std::memcpy(out, &b, 2);
      return;
    }
    default:
      throw Error(strCat("braid ncclScalarOf: PREMUL_SUM factor for ", toString(type),
                         ", which is not a float type"));
  }
}

}  // namespace cuda
}  // namespace braid
