// PowerSGD (Vogels et al., 2019) as torch's powerSGD_hook: each gradient
// matrix M (n x m, the parameter viewed as shape[0] x rest) is sent as the
// rank-r factors P = M Q (n x r) and Q = M^T P (m x r) instead of n * m
// values. See Note [Collective order in hooks] for where the waits are. CPU
// buckets orthogonalize with the loop below, CUDA buckets with ATen ops
// (aten_kernels.h, Note [Hooks on CUDA buckets]); both draw Q on the CPU.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "common/error.h"
#include "common/logging.h"
#include "hooks/aten_kernels.h"
#include "hooks/comm_hook.h"

namespace braid {
namespace hooks {
namespace {

constexpr const char* kOp = "powersgd_hook";

// Modified Gram-Schmidt on `count` vectors of `len` elements (vector i,
// element j at a[i * vecStride + j * elemStride]), with double accumulators;
// storage stays float32 or float64. A zero vector stays zero instead of
// becoming NaN, which is what torch's division by a zero norm would give.
template <typename T>
void orthogonalizeVectors(T* a, int64_t count, int64_t len, int64_t vecStride, int64_t elemStride,
                          double epsilon) {
  auto at_ = [&](int64_t i, int64_t j) -> T& { return a[i * vecStride + j * elemStride]; };
  for (int64_t i = 0; i < count; ++i) {
    double norm2 = 0;
    for (int64_t j = 0; j < len; ++j) norm2 += double(at_(i, j)) * at_(i, j);
    const double norm = std::sqrt(norm2) + epsilon;
    if (norm > 0) {
      const T inv = static_cast<T>(1.0 / norm);
      for (int64_t j = 0; j < len; ++j) at_(i, j) *= inv;
    }
    for (int64_t k = i + 1; k < count; ++k) {
      double dot = 0;
      for (int64_t j = 0; j < len; ++j) dot += double(at_(i, j)) * at_(k, j);
      const T d = static_cast<T>(dot);
      for (int64_t j = 0; j < len; ++j) at_(k, j) -= d * at_(i, j);
    }
  }
}

// Orthonormalizes the columns of m (n x r), or its rows when `rows`; one
// step in `counts` (Note [Which branch a hook ran] in hooks/comm_hook.h).
void orthogonalize(const at::Tensor& m, bool rows, double epsilon, BranchCounts& counts) {
  counts.count(m);
  if (!m.is_cpu()) return orthogonalizeAten(m, rows, epsilon);
  TORCH_INTERNAL_ASSERT(m.dim() == 2 && m.is_contiguous());
  const int64_t n = m.size(0), r = m.size(1);
  const int64_t count = rows ? n : r, len = rows ? r : n;
  const int64_t vecStride = rows ? r : 1, elemStride = rows ? 1 : r;
  if (m.scalar_type() == at::kDouble) {
    orthogonalizeVectors(m.data_ptr<double>(), count, len, vecStride, elemStride, epsilon);
  } else {
    orthogonalizeVectors(m.data_ptr<float>(), count, len, vecStride, elemStride, epsilon);
  }
}

struct BucketState {
  at::Tensor error;              // residual carried to the next step (error feedback)
  at::Tensor q;                  // all Qs of the bucket, flat, each stored transposed (r x m)
  std::vector<int64_t> qLayout;  // (n, m, r) per compressed matrix, to detect rebuilds
};

class PowerSGDHook : public CommHook {
 public:
  PowerSGDHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, const PowerSGDOptions& options)
      : CommHook(std::move(pg)), opts_(options), rng_(options.randomSeed) {
    BRAID_ENFORCE(opts_.matrixApproximationRank >= 1, kOp, rank_,
                  "matrix_approximation_rank must be >= 1, got ", opts_.matrixApproximationRank);
    BRAID_ENFORCE(opts_.startPowerSGDIter >= 0, kOp, rank_,
                  "start_powerSGD_iter must be >= 0, got ", opts_.startPowerSGDIter);
    BRAID_ENFORCE(!(opts_.useErrorFeedback || opts_.warmStart) || opts_.startPowerSGDIter > 1, kOp,
                  rank_,
                  "start_powerSGD_iter must be > 1 with error feedback or warm start (DDP "
                  "rebuilds its buckets after the first iteration), got ",
                  opts_.startPowerSGDIter);
    BRAID_ENFORCE(opts_.minCompressionRate >= 0 && opts_.orthogonalizationEpsilon >= 0, kOp, rank_,
                  "min_compression_rate and orthogonalization_epsilon must be >= 0, got ",
                  opts_.minCompressionRate, " and ", opts_.orthogonalizationEpsilon);
  }

  const char* name() const override { return kOp; }
  bool needsLayout() const override { return true; }
  int64_t iteration() const override { return iter_.load(); }

  at::Tensor residual(size_t bucketIndex) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(bucketIndex);
    if (it == states_.end() || !it->second->error.defined()) return at::Tensor();
    return it->second->error.clone();
  }

  c10::intrusive_ptr<c10::ivalue::Future> run(BucketView& bucket) override {
    checkBuffer(bucket.buffer, kOp);
    if (iter_.load() < opts_.startPowerSGDIter) {
      auto fut = allreduceMean(bucket.buffer);
      countIteration(bucket);
      return fut;
    }
    auto fut = compress(bucket);
    countIteration(bucket);
    return fut;
  }

 private:
  struct Matrix {
    at::Tensor m;  // n x m view of the working buffer
    int64_t n, cols, r;
  };

  void countIteration(const BucketView& bucket) {
    if (!bucket.isLast) return;
    if (++iter_ == opts_.startPowerSGDIter) {
      BRAID_LOG(kInfo, "powersgd", rank_)
          << "switching from allreduce to PowerSGD (rank " << opts_.matrixApproximationRank
          << ") at iteration " << iter_.load();
    }
  }

  std::shared_ptr<BucketState> stateFor(size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& s = states_[index];
    if (!s) s = std::make_shared<BucketState>();
    return s;
  }

  c10::intrusive_ptr<c10::ivalue::Future> compress(BucketView& bucket) {
    at::Tensor input = bucket.buffer;
    const bool exactType = input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble;
    // Half types are worked in float32: matmul and Gram-Schmidt need the range.
    at::Tensor work = exactType ? input : input.to(at::kFloat);
    const int64_t total = work.numel();
    auto st = stateFor(bucket.index);

    // With error feedback the residual buffer holds the corrected input until
    // decompression turns it into input - output, in place.
    at::Tensor inputCopy;
    if (opts_.useErrorFeedback) {
      if (st->error.defined() && st->error.numel() == total &&
          st->error.scalar_type() == work.scalar_type() && st->error.device() == work.device()) {
        work.add_(st->error);
      } else {
        st->error = at::empty_like(work);
      }
      st->error.copy_(work);
      inputCopy = st->error;
    }

    // Split: matrices worth compressing vs everything else (vectors, small
    // or near-square-at-rank matrices), as torch's _should_compress.
    std::vector<Matrix> mats;
    std::vector<at::Tensor> plain;
    std::vector<int64_t> qLayout;
    int64_t totalP = 0, totalQ = 0, totalPlain = 0, covered = 0;
    if (bucket.shapes.empty()) {
      plain.push_back(work);
      totalPlain = covered = total;
    }
    for (size_t i = 0; i < bucket.shapes.size(); ++i) {
      const auto& shape = bucket.shapes[i];
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      covered += numel;
      at::Tensor flat = work.narrow(0, bucket.offsets[i], numel);
      if (shape.size() >= 2 && numel > 0) {
        const int64_t n = shape[0], cols = numel / n;
        const int64_t r = std::min({n, cols, opts_.matrixApproximationRank});
        if (double((n + cols) * r) * opts_.minCompressionRate < double(n * cols)) {
          mats.push_back({flat.view({n, cols}), n, cols, r});
          qLayout.insert(qLayout.end(), {n, cols, r});
          totalP += n * r;
          totalQ += cols * r;
          continue;
        }
      }
      plain.push_back(flat);
      totalPlain += numel;
    }
    BRAID_ENFORCE(covered == total, kOp, rank_, "the gradients of bucket ", bucket.index, " cover ",
                  covered, " elements, but its buffer has ", total);

    // Q: random and orthogonal on the first compressed step (and every step
    // without warm start), else last step's averaged Q re-orthogonalized.
    // Every rank draws the same seeds, so the Qs agree without communication.
    // The draw is on the CPU for every bucket, then copied to the bucket's
    // device: a CUDA bucket gets the Q a CPU bucket gets.
    const bool randomize = !opts_.warmStart || !st->q.defined() || st->qLayout != qLayout ||
                           st->q.scalar_type() != work.scalar_type() ||
                           st->q.device() != work.device();
    if (randomize) {
      auto gen = at::detail::createCPUGenerator(rng_() % 1000000000ULL);
      st->q = at::randn({totalQ}, gen, work.options().device(at::kCPU));
      if (!work.is_cpu()) st->q = st->q.to(work.device());
      st->qLayout = qLayout;
    }
    // Q is kept transposed (r x m): Q' = M^T P is then computed as P^T M,
    // which BLAS runs several times faster than the transposed product here.
    std::vector<at::Tensor> ps, qs;
    at::Tensor flat =
        scratch(bucket.index, 0, totalPlain + totalP, work.scalar_type(), work.device());
    int64_t pOff = totalPlain, qOff = 0, plainOff = 0;
    for (const auto& mat : mats) {
      ps.push_back(flat.narrow(0, pOff, mat.n * mat.r).view({mat.n, mat.r}));
      qs.push_back(st->q.narrow(0, qOff, mat.cols * mat.r).view({mat.r, mat.cols}));
      pOff += mat.n * mat.r;
      qOff += mat.cols * mat.r;
    }
    for (size_t i = 0; i < mats.size(); ++i) {
      orthogonalize(qs[i], /*rows=*/true, opts_.orthogonalizationEpsilon, *branches_);
      at::mm_out(ps[i], mats[i].m, qs[i].t().contiguous());
    }
    for (const auto& t : plain) {
      flat.narrow(0, plainOff, t.numel()).copy_(t);
      plainOff += t.numel();
    }

    // One allreduce for the uncompressed values and the Ps; P needs no
    // division, it is orthogonalized next.
    auto first = allreduceSum(flat);
    first->wait();
    if (first->hasError()) std::rethrow_exception(first->exception_ptr());
    plainOff = 0;
    for (auto& t : plain) {
      t.copy_(flat.narrow(0, plainOff, t.numel())).div_(size_);
      plainOff += t.numel();
    }
    for (size_t i = 0; i < mats.size(); ++i) {
      orthogonalize(ps[i], /*rows=*/false, opts_.orthogonalizationEpsilon, *branches_);
      at::mm_out(qs[i], ps[i].t(), mats[i].m);
    }
    const Finish fin{
        input, work, inputCopy, flat, st, mats, ps, qs, opts_.useErrorFeedback, opts_.warmStart};
    if (mats.empty()) {
      auto fut = c10::make_intrusive<c10::ivalue::Future>(tensorListType());
      fut->markCompleted(fin());
      return fut;
    }
    at::Tensor q = st->q;
    const int size = size_;
    // The callback holds what it needs by value: the hook may be gone by then.
    return allreduceSum(q)->then(std::function<c10::IValue(c10::ivalue::Future&)>(
                                     [fin, q, size](c10::ivalue::Future& f) mutable {
                                       if (f.hasError()) std::rethrow_exception(f.exception_ptr());
                                       q.div_(size);
                                       return fin();
                                     }),
                                 tensorListType());
  }

  // Decompression: M ~= P Q^T into the buffer, then the residual.
  struct Finish {
    at::Tensor input, work, inputCopy, flat;
    std::shared_ptr<BucketState> st;
    std::vector<Matrix> mats;
    std::vector<at::Tensor> ps, qs;
    bool useErrorFeedback, warmStart;

    c10::IValue operator()() const {
      // On a GPU these kernels may run on the callback's stream: keep the
      // temporaries (P's buffer; work, for a half bucket) from reuse until they ran.
      recordOnCurrentStream(flat);
      if (!work.is_same(input)) recordOnCurrentStream(work);
      for (size_t i = 0; i < mats.size(); ++i) {
        at::Tensor m = mats[i].m;
        at::mm_out(m, ps[i], qs[i]);
      }
      if (useErrorFeedback) inputCopy.sub_(work);  // st->error: input - output
      if (!warmStart) st->q = at::Tensor();
      if (!work.is_same(input)) input.copy_(work);
      return tensorListValue(input);
    }
  };

  const PowerSGDOptions opts_;
  std::mt19937_64 rng_;  // same seed on every rank: same Q draws
  std::atomic<int64_t> iter_{0};
  mutable std::mutex mu_;  // guards states_ (the map, not the tensors)
  std::map<size_t, std::shared_ptr<BucketState>> states_;
};

}  // namespace

std::shared_ptr<CommHook> makePowerSGDHook(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                           const PowerSGDOptions& options) {
  return std::make_shared<PowerSGDHook>(std::move(pg), options);
}

}  // namespace hooks
}  // namespace braid
