// Allreduce in three stages (Note [Collectives across hosts]), pipelined
// (Note [Pipelined stages]).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "common/error.h"
#include "common/thread_name.h"
#include "reduce/reduce.h"

namespace braid {
namespace collectives {

using hier::stage;
using hier::stageOp;

// Note [Pipelined stages]
// A staged allreduce (Note [Collectives across hosts]) cuts its buffer into
// pieces of BRAID_HIER_PIPELINE_BYTES (a multiple of L elements, so that only
// the last piece has a short section) and runs the three stages piece after
// piece. The worker runs the shared-memory stages; a thread of the op's own
// ("braid-hier") runs the TCP stage of each piece in order, so the link
// carries piece i while the worker reduce-scatters piece i + 1 and gathers
// piece i - 1: on a slow link the shared-memory stages hide behind the
// transfer instead of adding to it. Every rank cuts alike (the setting travels
// in the world's header) and runs the stages of its sub-groups in the same
// order. When a stage fails on either thread, this rank aborts its cross
// transport, so the TCP stage still queued ends at once and the other hosts
// see the rank leave; the thread is joined before the error reaches the
// caller, so no stage touches the buffers after the op returns. Which error
// the caller gets: when another host goes away, the TCP stage fails (naming
// the lost rank and its host), but the worker may learn it first and second
// hand, from a local peer that failed and left the shared-memory stage; so a
// shared-memory failure waits up to 500 ms for the pending TCP stages and
// reports a lost peer or a timeout there instead.

// A piece of the buffer, elements [first, first + count), cut into L sections
// of q = ceil(count / L) elements (the shared-memory reduce-scatter and
// allgather move equal sections); the last non-empty section may be short and
// later ones empty: those go through padded copies, so at most one section's
// worth is copied.
struct HierGroup::Piece {
  size_t first = 0, count = 0, q = 0;
  std::vector<const void*> ins;
  std::vector<void*> outs;
  std::unique_ptr<uint8_t[]> padIn, padOut;
  uint8_t* mine = nullptr;  // this rank's section of the host's sum
  size_t valid(int r) const {
    size_t b = std::min(count, r * q);
    return std::min(count, b + q) - b;
  }
};

namespace {

void cut(HierGroup::Piece& p, int L, size_t es, const uint8_t* in, uint8_t* out) {
  in += p.first * es;
  out += p.first * es;
  size_t padded = 0;
  for (int r = 0; r < L; ++r) padded += p.valid(r) < p.q;
  if (padded) {
    p.padIn.reset(new uint8_t[padded * p.q * es]);
    p.padOut.reset(new uint8_t[padded * p.q * es]);
  }
  p.ins.resize(L);
  p.outs.resize(L);
  for (int r = 0, k = 0; r < L; ++r) {
    const size_t v = p.valid(r);
    if (v == p.q) {
      p.ins[r] = in + r * p.q * es;
      p.outs[r] = out + r * p.q * es;
      continue;
    }
    uint8_t* pi = p.padIn.get() + k * p.q * es;
    if (v) std::memcpy(pi, in + r * p.q * es, v * es);
    std::memset(pi + v * es, 0, (p.q - v) * es);
    p.ins[r] = pi;
    p.outs[r] = p.padOut.get() + k * p.q * es;
    ++k;
  }
}

void unpad(const HierGroup::Piece& p, int L, size_t es, uint8_t* out) {
  out += p.first * es;
  for (int r = 0, k = 0; r < L; ++r) {
    const size_t v = p.valid(r);
    if (v == p.q) continue;
    if (v) std::memcpy(out + r * p.q * es, p.padOut.get() + k * p.q * es, v * es);
    ++k;
  }
}

// Runs tasks one after another on a thread of its own; the destructor runs
// what is still queued, then joins.
class SerialThread {
 public:
  SerialThread() : thread_([this] { loop(); }) { named(thread_, "braid-hier"); }
  ~SerialThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::future<void> submit(std::function<void()> f) {
    std::packaged_task<void()> task(std::move(f));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
    return done;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // its exception goes to its future
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool closed_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

// The first TCP stage still pending that fails, within kLossGrace, because a
// peer was lost or timed out; null if none does.
constexpr auto kLossGrace = std::chrono::milliseconds(500);
std::exception_ptr crossLoss(std::vector<std::future<void>>& crossed) {
  const auto until = std::chrono::steady_clock::now() + kLossGrace;
  for (auto& f : crossed) {
    if (!f.valid()) continue;
    if (f.wait_until(until) != std::future_status::ready) return nullptr;
    try {
      f.get();
    } catch (const TimeoutError&) {
      return std::current_exception();
    } catch (const PeerLostError&) {
      return std::current_exception();
    } catch (...) {
    }
  }
  return nullptr;
}

}  // namespace

void HierGroup::allreduceStages(const OpDesc& op, const void* in, void* out) {
  const int L = local_->size(), l = local_->rank();
  const size_t es = elementSize(op.dtype), count = op.count;
  const ReduceOp red = hier::stageRedop(op.redop);
  const uint64_t pieceBytes = world_->config().hierPieceBytes;
  const size_t per = pieceBytes ? std::max<size_t>(1, pieceBytes / es / L) * L : count;
  const size_t numPieces = std::max<size_t>(1, (count + per - 1) / per);

  std::vector<Piece> pieces(numPieces);
  size_t sections = 0;
  for (size_t i = 0; i < numPieces; ++i) {
    Piece& p = pieces[i];
    p.first = i * per;
    p.count = std::min(per, count - p.first);
    p.q = (p.count + L - 1) / L;
    sections += p.q;
  }
  if (staging_.size() < sections * es) staging_.resize(sections * es);
  for (size_t i = 0, at = 0; i < numPieces; ++i) {
    pieces[i].mine = staging_.data() + at * es;
    at += pieces[i].q;
    cut(pieces[i], L, es, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out));
  }

  // "braid allreduce (rank 5): op #7, stage 2 of 3 (...): braid allreduce (rank 1): op #3 ..."
  auto head = [&](int n, size_t i) {
    std::string where = n == 2   ? hier::acrossHosts(topo_, "allreduce")
                        : n == 1 ? hier::withinHost(topo_, "reduce-scatter")
                                 : hier::withinHost(topo_, "allgather");
    if (numPieces > 1) where += strCat("; piece ", i + 1, " of ", numPieces);
    return hier::stageHead("allreduce", rank(), world_->opCount(), n, 3, where);
  };
  auto scatter = [&](size_t i) {
    Piece& p = pieces[i];
    stage([&] { return head(1, i); }, [&] {
      local_->reduceScatter(stageOp(op, OpKind::kReduceScatter, red, p.q), p.ins.data(), p.mine);
    });
  };
  auto across = [&](size_t i) {
    Piece& p = pieces[i];
    const size_t v = p.valid(l);
    stage([&] { return head(2, i); }, [&] {
      net::allreduce(*cross_, stageOp(op, OpKind::kAllreduce, red, v), p.mine, p.mine);
    });
    if (op.redop == ReduceOp::kAvg && v) reduce::divide(op.dtype, p.mine, p.mine, size(), v);
  };
  auto gather = [&](size_t i) {
    Piece& p = pieces[i];
    stage([&] { return head(3, i); }, [&] {
      local_->allgather(stageOp(op, OpKind::kAllgather, red, p.q), p.mine, p.outs.data());
    });
    unpad(p, L, es, static_cast<uint8_t*>(out));
  };

  if (numPieces == 1) {
    scatter(0);
    across(0);
    gather(0);
    return;
  }
  std::vector<std::future<void>> crossed(numPieces);
  SerialThread tcpStage;  // after the buffers: joined before they go
  bool crossError = false;
  auto crossedOk = [&](size_t i) {
    try {
      crossed[i].get();
    } catch (...) {
      crossError = true;
      throw;
    }
  };
  try {
    for (size_t i = 0; i < numPieces; ++i) {
      scatter(i);
      crossed[i] = tcpStage.submit([&across, i] { across(i); });
      if (i > 0) {
        crossedOk(i - 1);
        gather(i - 1);
      }
    }
    crossedOk(numPieces - 1);
    gather(numPieces - 1);
  } catch (...) {
    // Note [Pipelined stages]: a host that goes away fails this rank's TCP
    // stage, and may fail its shared-memory stage first, through a local peer
    // that saw it and left: report the cause, not the echo.
    std::exception_ptr error = std::current_exception();
    if (!crossError) {
      if (std::exception_ptr lost = crossLoss(crossed)) error = lost;
    }
    std::string why = errorText("allreduce", rank(), "a stage failed");
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
    crossT_->abort(why);
    std::rethrow_exception(error);
  }
}

}  // namespace collectives
}  // namespace braid
