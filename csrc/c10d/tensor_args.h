// Argument checks and conversions between at::Tensor and the raw-byte layers.
// All run on the caller's thread and throw braid::Error naming op and rank.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "c10d/compat.h"
#include "collectives/shm/communicator.h"
#include "common/types.h"

namespace braid {
class CudaOp;
namespace args {

// The element type, or throws "unsupported dtype ...".
DataType dtypeOf(const at::Tensor& t, const char* op, int rank);
// Dense and defined; on the CPU, or (inside an op, OpScope) on the group's
// CUDA device and contiguous, with every tensor of the call on one device.
void checkTensor(const at::Tensor& t, const char* op, int rank);
// One tensor per call (c10d's multi-tensor-per-process form is not supported).
const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op, int rank);
void checkRank(int r, int size, const char* what, const char* op, int rank);
// All tensors have `dtype` and `numel` elements.
void checkSame(const std::vector<at::Tensor>& ts, DataType dtype, int64_t numel, const char* what,
               const char* op, int rank);

collectives::Shape shapeOf(const at::Tensor& t);

// The braid op for a c10d op on `dtype`; throws when unsupported. For
// PREMUL_SUM sets *factor and returns kPremulSum.
ReduceOp reduceOpOf(const c10d::ReduceOp& op, DataType dtype, const char* opName, int rank,
                    double* factor);

// A contiguous CPU buffer standing in for a user tensor that may be strided,
// or that is on a CUDA device (a pinned shadow: Note [The staged CUDA
// executor] in c10d/cuda/cuda_op.h).
struct Staged {
  at::Tensor user, buf;
  std::shared_ptr<CudaOp> cuda;  // the op's CUDA plan when `user` is on a GPU
  static Staged in(const at::Tensor& t);   // buf holds t's values
  static Staged out(const at::Tensor& t);  // buf is scratch of t's shape
  void copyBack() const;                   // user <- buf, if they differ
  uint8_t* data() const { return static_cast<uint8_t*>(buf.data_ptr()); }
};

}  // namespace args
}  // namespace braid
