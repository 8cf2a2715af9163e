#include "c10d/tensor_args.h"

#include "c10d/cuda/cuda_op.h"
#include "common/error.h"
#include "math/reduce.h"

namespace braid {
namespace args {

namespace {
// torch's Python spelling, which is what users see.
const char* pythonName(at::ScalarType t) {
  switch (t) {
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kComplexHalf: return "complex32";
    case at::kQInt8: return "qint8";
    case at::kQUInt8: return "quint8";
    case at::kQInt32: return "qint32";
    default: return at::toString(t);
  }
}
}  // namespace

DataType dtypeOf(const at::Tensor& t, const char* op, int rank) {
  switch (t.scalar_type()) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kBool: return DataType::kBool;
    default:
      BRAID_THROW(Error, op, rank, "unsupported dtype ", pythonName(t.scalar_type()),
                  " (supported: float32, float64, float16, bfloat16, int8, uint8, int16, int32, "
                  "int64, bool)");
  }
}

void checkTensor(const at::Tensor& t, const char* op, int rank) {
  BRAID_ENFORCE(t.defined(), op, rank, "got an undefined tensor");
  BRAID_ENFORCE(t.layout() == at::kStrided, op, rank, "sparse tensors are not supported (layout ",
                t.layout(), ")");
  if (OpScope* scope = OpScope::current()) {
    scope->noteDevice(t, op);
  } else {
    BRAID_ENFORCE(t.device().is_cpu(), op, rank, "tensors must be on the CPU here, got ",
                  t.device().str());
  }
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op, int rank) {
  BRAID_ENFORCE(ts.size() == 1, op, rank, "expects one tensor per call, got ", ts.size());
  checkTensor(ts[0], op, rank);
  return ts[0];
}

void checkRank(int r, int size, const char* what, const char* op, int rank) {
  BRAID_ENFORCE(r >= 0 && r < size, op, rank, what, " ", r, " is not a rank of this group (size ",
                size, ")");
}

void checkSame(const std::vector<at::Tensor>& ts, DataType dtype, int64_t numel, const char* what,
               const char* op, int rank) {
  for (size_t i = 0; i < ts.size(); ++i) {
    checkTensor(ts[i], op, rank);
    DataType d = dtypeOf(ts[i], op, rank);
    BRAID_ENFORCE(d == dtype && ts[i].numel() == numel, op, rank, what, "[", i, "] has ",
                  ts[i].numel(), " elements of ", toString(d), ", expected ", numel, " of ",
                  toString(dtype));
  }
}

collectives::Shape shapeOf(const at::Tensor& t) {
  collectives::Shape s;
  s.ndim = static_cast<int32_t>(t.dim());
  for (int i = 0; i < t.dim() && i < collectives::kMaxDims; ++i) s.dims[i] = t.size(i);
  return s;
}

ReduceOp reduceOpOf(const c10d::ReduceOp& op, DataType dtype, const char* opName, int rank,
                    double* factor) {
  ReduceOp r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r = ReduceOp::kSum; break;
    case c10d::ReduceOp::PRODUCT: r = ReduceOp::kProduct; break;
    case c10d::ReduceOp::MIN: r = ReduceOp::kMin; break;
    case c10d::ReduceOp::MAX: r = ReduceOp::kMax; break;
    case c10d::ReduceOp::BAND: r = ReduceOp::kBand; break;
    case c10d::ReduceOp::BOR: r = ReduceOp::kBor; break;
    case c10d::ReduceOp::BXOR: r = ReduceOp::kBxor; break;
    case c10d::ReduceOp::AVG: r = ReduceOp::kAvg; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      BRAID_ENFORCE(compat::premulSumFactor(op, factor), opName, rank,
                    "PREMUL_SUM without a factor");
      r = ReduceOp::kPremulSum;
      break;
    }
    default:
      BRAID_THROW(Error, opName, rank, "unsupported reduce op ", static_cast<int>(op.op_));
  }
  ReduceOp kernel = (r == ReduceOp::kAvg || r == ReduceOp::kPremulSum) ? ReduceOp::kSum : r;
  bool ok = reduce::supported(dtype, kernel);
  if (r == ReduceOp::kPremulSum || (r == ReduceOp::kAvg && dtype == DataType::kBool)) {
    ok = ok && isFloating(dtype);
  }
  BRAID_ENFORCE(ok, opName, rank, "reduce op ", toString(r), " is not supported for ",
                toString(dtype));
  return r;
}

namespace {
std::shared_ptr<CudaOp> cudaOpFor(const at::Tensor& t) {
  OpScope* scope = OpScope::current();
  BRAID_ENFORCE(scope, "op", -1, "a CUDA tensor outside of an op (internal error)");
  return scope->cuda(t);
}
}  // namespace

Staged Staged::in(const at::Tensor& t) {
  if (t.is_cuda()) {
    auto op = cudaOpFor(t);
    return Staged{t, op->stageIn(t), op};
  }
  return Staged{t, t.is_contiguous() ? t : t.contiguous(), nullptr};
}

Staged Staged::out(const at::Tensor& t) {
  if (t.is_cuda()) {
    auto op = cudaOpFor(t);
    return Staged{t, op->stageOut(t), op};
  }
  return Staged{t, t.is_contiguous() ? t : at::empty(t.sizes(), t.options()), nullptr};
}

void Staged::copyBack() const {
  if (cuda) {
    cuda->copyBack(user, buf);
  } else if (!buf.is_same(user)) {
    user.copy_(buf);
  }
}

}  // namespace args
}  // namespace braid
