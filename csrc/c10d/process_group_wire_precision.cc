// The allreduce of the fp16/bf16 compression hooks on one host (Note
// [Allreduce on a narrower wire] in collectives/shm/collectives.h).
#include "c10d/process_group.h"

#include "engine/engine.h"
#include "c10d/tensor_args.h"
#include "collectives/shm/collectives.h"
#include "common/error.h"

namespace braid {

using collectives::OpDesc;
using collectives::OpKind;

bool ProcessGroupBraid::canNarrow(const at::Tensor& t) const {
  return narrowsOnWire_ && t.defined() && !t.is_sparse() && t.device().is_cpu() &&
         t.scalar_type() == at::kFloat && t.is_contiguous();
}

bool ProcessGroupBraid::averagesExactly(const at::Tensor& t) const {
  const int world = getSize();
  return (world & (world - 1)) == 0 && t.defined() && t.device().is_cpu() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduceNarrowed(at::Tensor& t,
                                                                    at::ScalarType wire,
                                                                    double divisor) {
  return guarded(OpKind::kAllreduce, [&] {
    const int rank = getRank();
    const char* op = "allreduce_narrowed";
    args::checkTensor(t, op, rank);
    BRAID_ENFORCE(canNarrow(t), op, rank, "expected a contiguous float32 CPU tensor in a group "
                  "on one host, got ", t.scalar_type(), " on ", t.device(), ", contiguous=",
                  t.is_contiguous(), ", group ", narrowsOnWire_ ? "on one host" : "across hosts");
    BRAID_ENFORCE(wire == at::kHalf || wire == at::kBFloat16, op, rank,
                  "the wire type must be float16 or bfloat16, got ", wire);
    BRAID_ENFORCE(divisor > 0 && divisor == static_cast<double>(static_cast<float>(divisor)), op,
                  rank, "the divisor must be a positive float32 value, got ", divisor);
    OpDesc d = desc(OpKind::kAllreduce, std::chrono::milliseconds(0));
    d.dtype = DataType::kFloat32;
    d.redop = ReduceOp::kSum;
    d.wire = wire == at::kHalf ? DataType::kFloat16 : DataType::kBFloat16;
    d.wireDivisor = static_cast<float>(divisor);
    d.count = t.numel();
    d.shape = args::shapeOf(t);
    Engine* e = engine_.get();
    void* buf = t.data_ptr();
    return launch(d, c10d::OpType::ALLREDUCE, "braid:allreduce_narrowed", {t},
                  [e, d, buf] { e->group().allreduce(d, buf, buf); });
  });
}

}  // namespace braid
