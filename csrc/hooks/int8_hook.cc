// Note [int8 hook]
// Each rank adds its residual to the bucket, quantizes the sum to int8 with
// one float32 scale per chunk (max |v| / 127), keeps what rounding lost as the
// next residual (error feedback), and allgathers the int8 payload with its
// scales; every rank then dequantizes all contributions and averages them in
// rank order, so the replicas get the same bits. An allgather rather than an
// allreduce: a sum of int8 values overflows, and a sum of values quantized
// with different scales has no meaning. Per rank this sends n + 4n/chunk
// bytes instead of allreduce's 4n * 2(w-1)/w: 3.9x fewer bytes at 2 ranks,
// 2x at 4, falling as the group grows (allgather traffic is linear in w), so
// it is meant for small groups on slow links. PyTorch's experimental uint8
// hooks use one scale per bucket, no error feedback, two allgathers, and CUDA
// only in 1.13 (docs/hooks.md). CPU buckets run the loops of int8_kernels.h,
// CUDA buckets the same rules as ATen ops (aten_kernels.h, Note [Hooks on
// CUDA buckets]), with the same packed layout and the same bits.
#include <functional>
#include <map>
#include <mutex>

#include "common/error.h"
#include "hooks/aten_kernels.h"
#include "hooks/comm_hook.h"
#include "hooks/int8_kernels.h"

namespace braid {
namespace hooks {
namespace {

constexpr const char* kOp = "int8_hook";

class Int8Hook : public CommHook {
 public:
  Int8Hook(c10::intrusive_ptr<c10d::ProcessGroup> pg, const Int8Options& options)
      : CommHook(std::move(pg)), opts_(options) {
    BRAID_ENFORCE(opts_.chunkSize >= 1 && opts_.chunkSize <= (int64_t(1) << 30), kOp, rank_,
                  "chunk_size must be in [1, 2^30], got ", opts_.chunkSize);
  }

  const char* name() const override { return kOp; }

  at::Tensor residual(size_t bucketIndex) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = residuals_.find(bucketIndex);
    return it == residuals_.end() ? at::Tensor() : it->second.clone();
  }

  c10::intrusive_ptr<c10::ivalue::Future> run(BucketView& bucket) override {
    checkBuffer(bucket.buffer, kOp);
    at::Tensor input = bucket.buffer;
    at::Tensor work = input.scalar_type() == at::kFloat ? input : input.to(at::kFloat);
    const int64_t n = work.numel();
    const int64_t chunk = opts_.chunkSize;
    const int64_t nchunks = (n + chunk - 1) / chunk;

    at::Tensor residual;  // undefined without error feedback
    if (opts_.useErrorFeedback) {
      std::lock_guard<std::mutex> lock(mu_);
      at::Tensor& r = residuals_[bucket.index];
      // A rebuilt bucket (new size, or moved to another device) starts without residual.
      if (!r.defined() || r.numel() != n || r.device() != work.device())
        r = at::zeros({n}, work.options());
      residual = r;
    }

    // One int8 tensor per rank: nchunks float32 scales, then n int8 values.
    const int64_t scaleBytes = nchunks * int64_t(sizeof(float));
    const c10::Device device = work.device();
    at::Tensor packed = scratch(bucket.index, 0, scaleBytes + n, at::kChar, device);
    branches_->count(work);
    if (device.is_cpu()) {
      auto* base = reinterpret_cast<uint8_t*>(packed.data_ptr());
      quantizeInt8(work.data_ptr<float>(),
                   residual.defined() ? residual.data_ptr<float>() : nullptr, n, chunk,
                   reinterpret_cast<float*>(base), reinterpret_cast<int8_t*>(base + scaleBytes));
    } else {
      quantizeInt8Aten(work, residual, chunk, packed);
    }

    std::vector<at::Tensor> gathered;
    gathered.reserve(size_);
    for (int r = 0; r < size_; ++r)
      gathered.push_back(scratch(bucket.index, 1 + r, scaleBytes + n, at::kChar, device));
    const int size = size_;
    return allgather(packed, gathered)
        ->then(std::function<c10::IValue(c10::ivalue::Future&)>(
                   [input, work, gathered, n, chunk, scaleBytes, size,
                    counts = branches_](c10::ivalue::Future& f) mutable {
                     if (f.hasError()) std::rethrow_exception(f.exception_ptr());
                     counts->count(work);
                     if (!work.is_cpu()) {
                       // A float32 copy of a 16-bit bucket: freed once this returns.
                       if (!work.is_same(input)) recordOnCurrentStream(work);
                       dequantizeSumInt8Aten(gathered, chunk, 1.f / size, work);
                       if (!work.is_same(input)) input.copy_(work);
                       return tensorListValue(input);
                     }
                     std::vector<const int8_t*> qs(size);
                     std::vector<const float*> scales(size);
                     for (int r = 0; r < size; ++r) {
                       auto* b = reinterpret_cast<const uint8_t*>(gathered[r].data_ptr());
                       scales[r] = reinterpret_cast<const float*>(b);
                       qs[r] = reinterpret_cast<const int8_t*>(b + scaleBytes);
                     }
                     dequantizeSumInt8(qs.data(), scales.data(), size, n, chunk, 1.f / size,
                                       work.data_ptr<float>());
                     if (!work.is_same(input)) input.copy_(work);
                     return tensorListValue(input);
                   }),
               tensorListType());
  }

 private:
  const Int8Options opts_;
  mutable std::mutex mu_;  // guards the map; a bucket's residual is used by one step at a time
  std::map<size_t, at::Tensor> residuals_;
};

}  // namespace

std::shared_ptr<CommHook> makeInt8Hook(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                       const Int8Options& options) {
  return std::make_shared<Int8Hook>(std::move(pg), options);
}

}  // namespace hooks
}  // namespace braid
