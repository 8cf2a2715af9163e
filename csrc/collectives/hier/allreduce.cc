// Allreduce in three stages (Note [Collectives across hosts]).
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/net/collectives.h"
#include "common/error.h"
#include "reduce/reduce.h"

namespace braid {
namespace collectives {

namespace {

OpDesc stageOp(const OpDesc& op, OpKind kind, ReduceOp redop, size_t count) {
  OpDesc s;
  s.kind = kind;
  s.dtype = op.dtype;
  s.redop = redop;
  s.count = count;
  s.shape.ndim = 1;
  s.shape.dims[0] = static_cast<int64_t>(count);
  s.deadline = op.deadline;
  s.timeout = op.timeout;
  return s;
}

// "[2, 3]"
std::string rankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += strCat(i ? ", " : "", ranks[i]);
  return s + "]";
}

// Runs one stage; its errors say which stage of which op failed on which
// rank of the group, and keep their type (a timeout or a lost peer breaks the
// group). A stage runs in a group of its own (the host's ranks, or one cross
// group) whose errors number the ranks from 0 there: `ranks` are the group's
// ranks in that order, so the message translates.
template <typename F>
void stage(int rank, const char* what, const std::vector<int>& ranks, F&& f) {
  auto text = [&](const std::exception& e) {
    return errorText("allreduce", rank, what, " (ranks 0..", ranks.size() - 1,
                     " there are this group's ranks ", rankList(ranks), "): ", e.what());
  };
  try {
    f();
  } catch (const TimeoutError& e) {
    throw TimeoutError(text(e));
  } catch (const PeerLostError& e) {
    throw PeerLostError(text(e));
  } catch (const Error& e) {
    throw Error(text(e));
  }
}

}  // namespace

// The buffer is cut into L sections of q = ceil(count / L) elements (the
// shared-memory reduce-scatter and allgather move equal sections); the last
// non-empty section may be short and later ones empty: those go through
// padded copies, so at most one section's worth is copied.
void HierGroup::allreduceStages(const OpDesc& op, const void* in, void* out) {
  const int L = local_->size(), l = local_->rank();
  const size_t es = elementSize(op.dtype), count = op.count;
  const size_t q = (count + L - 1) / L;
  const ReduceOp red = op.redop == ReduceOp::kAvg ? ReduceOp::kSum : op.redop;
  auto valid = [&](int r) {
    size_t b = std::min(count, r * q);
    return std::min(count, b + q) - b;
  };

  std::unique_ptr<uint8_t[]> padIn, padOut;
  size_t padded = 0;
  for (int r = 0; r < L; ++r) padded += valid(r) < q;
  if (padded) {
    padIn.reset(new uint8_t[padded * q * es]);
    padOut.reset(new uint8_t[padded * q * es]);
  }
  std::vector<const void*> ins(L);
  std::vector<void*> outs(L);
  for (int r = 0, k = 0; r < L; ++r) {
    const size_t v = valid(r);
    if (v == q) {
      ins[r] = static_cast<const uint8_t*>(in) + r * q * es;
      outs[r] = static_cast<uint8_t*>(out) + r * q * es;
      continue;
    }
    uint8_t* pi = padIn.get() + k * q * es;
    if (v) std::memcpy(pi, static_cast<const uint8_t*>(in) + r * q * es, v * es);
    std::memset(pi + v * es, 0, (q - v) * es);
    ins[r] = pi;
    outs[r] = padOut.get() + k * q * es;
    ++k;
  }

  std::vector<int> cross;
  for (int k = 0; k < topo_.numHosts(); ++k) cross.push_back(topo_.ranksOn(k)[l]);
  const std::vector<int>& here = topo_.ranksOn(topo_.host());

  std::vector<uint8_t> mine(q * es);
  stage(rank(), "stage 1 of 3, reduce-scatter within the host", here, [&] {
    local_->reduceScatter(stageOp(op, OpKind::kReduceScatter, red, q), ins.data(), mine.data());
  });
  const size_t v = valid(l);
  stage(rank(), "stage 2 of 3, allreduce across hosts", cross, [&] {
    net::allreduce(*cross_, stageOp(op, OpKind::kAllreduce, red, v), mine.data(), mine.data());
  });
  if (op.redop == ReduceOp::kAvg && v) {
    reduce::divide(op.dtype, mine.data(), mine.data(), size(), v);
  }
  stage(rank(), "stage 3 of 3, allgather within the host", here, [&] {
    local_->allgather(stageOp(op, OpKind::kAllgather, red, q), mine.data(), outs.data());
  });
  for (int r = 0, k = 0; r < L; ++r) {
    const size_t vr = valid(r);
    if (vr == q) continue;
    if (vr) std::memcpy(static_cast<uint8_t*>(out) + r * q * es, padOut.get() + k * q * es, vr * es);
    ++k;
  }
}

}  // namespace collectives
}  // namespace braid
