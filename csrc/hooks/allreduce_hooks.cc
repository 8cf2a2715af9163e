// The averaging hooks: plain allreduce, and allreduce in float16 / bfloat16.
#include <functional>

#include "c10d/compat.h"
#include "c10d/process_group.h"
#include "hooks/aten_kernels.h"
#include "hooks/comm_hook.h"
#include "math/cast.h"

namespace braid {
namespace hooks {
namespace {

class AllreduceHook : public CommHook {
 public:
  using CommHook::CommHook;
  const char* name() const override { return "allreduce_hook"; }

  c10::intrusive_ptr<c10::ivalue::Future> run(BucketView& bucket) override {
    checkBuffer(bucket.buffer, name());
    return allreduceMean(bucket.buffer);
  }
};

// Note [bfloat16 on torch 1.13's gloo]
// ProcessGroupGloo of torch 1.13 has no bfloat16 reduction: its worker thread
// throws outside any handler and the process aborts (torch 2.x added it).
// There the bf16 hook allgathers the bfloat16 bits instead (as Half, which
// gloo only copies) and sums in float32 in rank order, rounding once: the
// value an allreduce that accumulates in float32 gives, and the same bytes
// as a bfloat16 allreduce at 2 ranks (2n per rank; 2n(w-1) above).
bool needsGatherFallback(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                         at::ScalarType wireType) {
  if (wireType != at::kBFloat16 || compat::kTorch2) return false;
  try {
    return pg->getBackendName() == "gloo";
  } catch (const std::exception&) {
    return false;  // a group that does not name its backend (1.13 asserts)
  }
}

// The bucket is divided by the world size before the sum, and rounded once to
// the wire type: no float16 overflow where the sum of the gradients, or a
// gradient itself, exceeds 65504 but its share does not; it costs the low
// bits of tiny values, which torch's fp16_compress_hook accepts too (torch
// rounds x, then x / n). float32 CPU buckets go through fused loops
// (math/cast.h): one pass each way instead of three; CUDA buckets through
// one ATen kernel each way (Note [Hooks on CUDA buckets]). On a braid group
// on one host, float32 CPU buckets skip both: the allreduce itself rounds,
// sums and widens, with the same bits (Note [Allreduce on a narrower wire]
// in collectives/shm/collectives.h).
class CastCompressHook : public CommHook {
 public:
  CastCompressHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, at::ScalarType wireType,
                   const char* name)
      : CommHook(std::move(pg)),
        wireType_(wireType),
        name_(name),
        gatherFallback_(needsGatherFallback(pg_, wireType)) {}
  const char* name() const override { return name_; }

  c10::intrusive_ptr<c10::ivalue::Future> run(BucketView& bucket) override {
    checkBuffer(bucket.buffer, name());
    at::Tensor buffer = bucket.buffer;
    if (!gatherFallback_ && buffer.scalar_type() == wireType_) return allreduceMean(buffer);
    if (braid_ && braid_->canNarrow(buffer)) {
      // Both casts on the host, inside the collective.
      branches_->count(buffer);
      branches_->count(buffer);
      return allreduceNarrowed(buffer);
    }
    at::Tensor compressed = scratch(bucket.index, 0, buffer.numel(), wireType_, buffer.device());
    narrow(buffer, compressed, static_cast<float>(size_));
    if (gatherFallback_) return gatherAndSum(bucket.index, buffer, compressed);
    const at::ScalarType wireType = wireType_;
    return allreduceSum(compressed)
        ->then(std::function<c10::IValue(c10::ivalue::Future&)>(
                   [buffer, compressed, wireType,
                    counts = branches_](c10::ivalue::Future& f) mutable {
                     if (f.hasError()) std::rethrow_exception(f.exception_ptr());
                     recordOnCurrentStream(compressed);
                     widenInto(buffer, compressed, wireType, /*accumulate=*/false, *counts);
                     return tensorListValue(buffer);
                   }),
               tensorListType());
  }

 private:
  static DataType half16(at::ScalarType t) {
    return t == at::kBFloat16 ? DataType::kBFloat16 : DataType::kFloat16;
  }
  static uint16_t* bits(const at::Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }

  // compressed = round(buffer / divisor) in the wire type.
  void narrow(at::Tensor& buffer, at::Tensor& compressed, float divisor) const {
    if (buffer.scalar_type() == at::kFloat && buffer.is_cpu()) {
      branches_->count(buffer);
      reduce::narrowDivided(buffer.data_ptr<float>(), bits(compressed), buffer.numel(), divisor,
                    half16(wireType_));
    } else if (buffer.scalar_type() == at::kFloat) {
      branches_->count(buffer);
      narrowDividedAten(buffer, compressed, divisor);
    } else {  // float64 or 16-bit buckets: rare, ATen is fine
      buffer.div_(divisor);
      compressed.copy_(buffer);
    }
  }

  // buffer (+)= widen(src); src holds wire-type values (under the wire type's
  // own dtype, or Half's for the gather fallback's bfloat16 bits). A float32
  // buffer's step is counted (Note [Which branch a hook ran]).
  static void widenInto(at::Tensor& buffer, const at::Tensor& src, at::ScalarType wireType,
                        bool accumulate, BranchCounts& counts) {
    if (buffer.scalar_type() == at::kFloat) counts.count(buffer);
    if (buffer.scalar_type() == at::kFloat && buffer.is_cpu()) {
      reduce::widen(bits(src), buffer.data_ptr<float>(), buffer.numel(), half16(wireType), accumulate);
    } else if (accumulate) {
      buffer.add_(src.view(wireType).to(buffer.scalar_type()));
    } else {
      buffer.copy_(src.view(wireType));
    }
  }

  c10::intrusive_ptr<c10::ivalue::Future> allreduceNarrowed(at::Tensor buffer) {
    countAllreduce(buffer.numel() * 2);  // 16-bit values, as the unfused hook's allreduce
    return braid_->allreduceNarrowed(buffer, wireType_, size_)
        ->getFuture()
        ->then(
            [buffer](c10::ivalue::Future& f) {
              if (f.hasError()) std::rethrow_exception(f.exception_ptr());
              return tensorListValue(buffer);
            },
            tensorListType());
  }

  // See Note [bfloat16 on torch 1.13's gloo].
  c10::intrusive_ptr<c10::ivalue::Future> gatherAndSum(size_t index, at::Tensor buffer,
                                                       at::Tensor compressed) {
    at::Tensor wire = compressed.view(at::kHalf);
    std::vector<at::Tensor> gathered;
    for (int r = 0; r < size_; ++r)
      gathered.push_back(scratch(index, 1 + r, wire.numel(), at::kHalf, buffer.device()));
    const at::ScalarType wireType = wireType_;
    return allgather(wire, gathered)
        ->then(std::function<c10::IValue(c10::ivalue::Future&)>(
                   [buffer, compressed, gathered, wireType,
                    counts = branches_](c10::ivalue::Future& f) mutable {
                     if (f.hasError()) std::rethrow_exception(f.exception_ptr());
                     recordOnCurrentStream(compressed);
                     // float32 sum in rank order, then one rounding through the send
                     // buffer, which is free again.
                     at::Tensor sum =
                         buffer.scalar_type() == at::kFloat
                             ? buffer
                             : at::empty(buffer.sizes(), buffer.options().dtype(at::kFloat));
                     for (size_t r = 0; r < gathered.size(); ++r) {
                       widenInto(sum, gathered[r], wireType, /*accumulate=*/r > 0, *counts);
                     }
                     if (sum.is_cpu()) {
                       reduce::narrowDivided(sum.data_ptr<float>(), bits(compressed), sum.numel(), 1.f,
                                     half16(wireType));
                     } else {
                       compressed.copy_(sum);  // the send buffer: a stream-ordered reuse
                     }
                     widenInto(buffer, compressed, wireType, /*accumulate=*/false, *counts);
                     return tensorListValue(buffer);
                   }),
               tensorListType());
  }

  const at::ScalarType wireType_;
  const char* name_;
  const bool gatherFallback_;
};

}  // namespace

std::shared_ptr<CommHook> makeAllreduceHook(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_shared<AllreduceHook>(std::move(pg));
}

std::shared_ptr<CommHook> makeFp16CompressHook(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_shared<CastCompressHook>(std::move(pg), at::kHalf, "fp16_compress_hook");
}

std::shared_ptr<CommHook> makeBf16CompressHook(c10::intrusive_ptr<c10d::ProcessGroup> pg) {
  return std::make_shared<CastCompressHook>(std::move(pg), at::kBFloat16, "bf16_compress_hook");
}

}  // namespace hooks
}  // namespace braid
