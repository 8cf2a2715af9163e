// dist.monitored_barrier on braid, with gloo's semantics (ProcessGroupGloo::
// monitoredBarrier), over braid's point-to-point messages.
//
// Note [Monitored barrier]
// Rank 0 waits, up to the timeout, for an arrival message from every other
// rank, then releases them all; a rank that did not arrive in time is named in
// rank 0's error (the first such rank, or all with wait_all_ranks). Unlike
// gloo, rank 0 waits for all ranks against one deadline, so it reports within
// the timeout even with wait_all_ranks (gloo waits up to the timeout per
// rank), and a rank that died is reported at once.
//   - Other ranks wait for their release up to max(group timeout, barrier
//     timeout): they cannot know when rank 0 starts its own wait (gloo uses the
//     group timeout). On failure rank 0 tells every rank, so those that arrived,
//     and those that arrive late, fail at once instead of waiting that long.
//   - Messages carry the call's number (each rank counts its calls), so a late
//     arrival or release left over from an earlier, failed barrier is dropped
//     instead of passing a later one. A rank that skips a call stays behind for
//     good; rank 0's error then says so.
//   - It runs on the caller's thread, beside the collectives (as gloo's does),
//     and uses no collective step, so it never leaves the group out of step.
//   - The timeout is the call's own, from either entry point
//     (dist.monitored_barrier(group, timeout) and group.monitored_barrier(
//     timeout) both reach here with BarrierOptions.timeout); only an unset one
//     (negative: c10d's kUnsetTimeout) means the group's. A zero timeout is a
//     timeout too, as in gloo: rank 0 has no time to process any rank and
//     fails at once with gloo's "Rank 0 timed out in monitoredBarrier after
//     0 ms" (torch's test_monitored_barrier_gloo_rank_0_timeout), telling
//     the others (Ranks ... failed, with wait_all_ranks). gloo fails so when
//     its remaining time is gone before it waits for a rank; rank 0 here
//     waits for all ranks at once, so that can only happen at 0.
#include <algorithm>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>

#include "engine/engine.h"
#include "c10d/process_group.h"
#include "common/error.h"

namespace braid {

namespace {

// Reserved: user tags are other values (c10d's tags are small non-negative ints).
constexpr int kTag = std::numeric_limits<int>::min() + 0x6d62;  // "mb"
constexpr const char* kOp = "monitored_barrier";
constexpr std::chrono::seconds kGrace{5};  // past the deadline, the P2P thread has failed every op

struct Msg {
  int64_t seq = 0;
  int64_t failed = 0;   // release: how many ranks failed (0: passed); arrival: 0
  int64_t first = -1;   // release: the lowest rank that failed
};

// One posted receive or send; filled in by the P2P thread's callback.
struct Op {
  enum State { kPending, kOk, kTimeout, kFailed } state = kPending;
  Msg msg;
  std::string error;
};

// Shared with the callbacks, so that it outlives a caller that throws.
struct Exchange {
  explicit Exchange(int n) : recv(n), send(n) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Op> recv, send;
};
using ExchangePtr = std::shared_ptr<Exchange>;

collectives::PointToPoint::Done doneFor(ExchangePtr ex, Op* op) {
  return [ex, op](std::exception_ptr e, int) {
    std::lock_guard<std::mutex> lock(ex->mu);
    op->state = Op::kOk;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const TimeoutError& t) {
        op->state = Op::kTimeout;
        op->error = t.what();
      } catch (const std::exception& x) {
        op->state = Op::kFailed;
        op->error = x.what();
      }
    }
    ex->cv.notify_all();
  };
}

// Posts a receive of the next message from `peer` (the caller holds no lock).
void postRecv(collectives::PointToPoint& p2p, const ExchangePtr& ex, int peer,
              transport::Clock::time_point deadline, std::chrono::milliseconds timeout) {
  Op* op = &ex->recv[peer];
  p2p.postRecv(peer, kTag, &op->msg, sizeof(Msg), deadline, timeout, doneFor(ex, op));
}

void postSend(collectives::PointToPoint& p2p, const ExchangePtr& ex, int peer, Msg msg,
              transport::Clock::time_point deadline, std::chrono::milliseconds timeout) {
  Op* op = &ex->send[peer];
  op->msg = msg;
  p2p.postSend(peer, kTag, &op->msg, sizeof(Msg), deadline, timeout, doneFor(ex, op));
}

// Waits until the receives from `peers` hold a message of call `seq` (or a
// later one) or failed; drops and re-posts those of earlier calls, recording
// the last dropped number in `stale`.
void awaitRecvs(collectives::PointToPoint& p2p, const ExchangePtr& ex, int rank,
                const std::vector<int>& peers, int64_t seq, transport::Clock::time_point deadline,
                std::chrono::milliseconds timeout, std::vector<int64_t>* stale) {
  std::unique_lock<std::mutex> lock(ex->mu);
  for (;;) {
    std::vector<int> again;
    bool pending = false;
    for (int p : peers) {
      Op& op = ex->recv[p];
      if (op.state == Op::kOk && op.msg.seq < seq) {
        (*stale)[p] = op.msg.seq;
        op = Op();
        again.push_back(p);
      }
      pending |= op.state == Op::kPending;
    }
    if (!again.empty()) {
      lock.unlock();
      for (int p : again) postRecv(p2p, ex, p, deadline, timeout);
      lock.lock();
      continue;
    }
    if (!pending) return;
    // The P2P thread fails every op at its deadline; the bound only guards
    // against a bug there turning into a hang.
    if (ex->cv.wait_until(lock, deadline + kGrace) == std::cv_status::timeout) {
      for (int p : peers) {
        if (ex->recv[p].state == Op::kPending) {
          BRAID_THROW(Error, kOp, rank, "no answer about rank ", p, " from the P2P thread");
        }
      }
    }
  }
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void ProcessGroupBraid::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const int rank = getRank(), n = getSize();
  const int64_t seq = static_cast<int64_t>(monitoredBarriers_.fetch_add(1)) + 1;
  if (n == 1) return;
  // Unset: negative (c10d's kUnsetTimeout); 0 is a timeout of 0 ms, as in gloo.
  const auto timeout = opts.timeout.count() >= 0 ? opts.timeout : this->timeout();
  auto& p2p = engine_->p2p();
  auto ex = std::make_shared<Exchange>(n);
  std::vector<int64_t> stale(n, -1);

  if (rank != 0) {
    const auto wait = std::max(timeout, this->timeout());
    const auto deadline = transport::Clock::now() + wait;
    postSend(p2p, ex, 0, Msg{seq, 0, -1}, deadline, wait);
    postRecv(p2p, ex, 0, deadline, wait);
    awaitRecvs(p2p, ex, rank, {0}, seq, deadline, wait, &stale);
    std::lock_guard<std::mutex> lock(ex->mu);
    const Op& got = ex->recv[0];
    if (got.state != Op::kOk) {
      BRAID_THROW(Error, kOp, rank, "Rank ", rank, " reached monitoredBarrier, but rank 0 did not ",
                  "release it within ", wait.count(), " ms (rank 0 did not arrive in time, or its ",
                  "error names the ranks that failed): ", got.error);
    }
    if (got.msg.seq != seq) {
      BRAID_THROW(Error, kOp, rank, "rank 0 is at monitored barrier #", got.msg.seq,
                  ", this rank at #", seq, " (a rank skipped a call)");
    }
    if (got.msg.failed > 0) {
      BRAID_THROW(Error, kOp, rank, "rank 0 reported that rank ", got.msg.first,
                  got.msg.failed > 1 ? strCat(" and ", got.msg.failed - 1, " more") : "",
                  " failed to pass monitoredBarrier",
                  got.msg.first == rank ? " (this rank arrived after rank 0 stopped waiting)" : "");
    }
    return;
  }

  const auto deadline = transport::Clock::now() + timeout;
  std::vector<int> peers;
  for (int r = 1; r < n; ++r) peers.push_back(r);
  // The releases must outlive a zero timeout: late ranks take theirs when
  // they arrive, up to their own wait (the longer of both timeouts).
  const auto releaseFor = std::max(timeout, this->timeout());
  if (timeout.count() == 0) {
    // No time to process any rank (Note [Monitored barrier]): fail now, and
    // tell every rank, so that none waits for a release.
    const Msg release{seq, n - 1, 1};
    for (int r : peers) {
      postSend(p2p, ex, r, release, transport::Clock::now() + releaseFor, releaseFor);
    }
    if (waitAllRanks) {
      BRAID_THROW(Error, kOp, rank, "Ranks ", joinRanks(peers),
                  " failed to pass monitoredBarrier in 0 ms");
    }
    // gloo's wording, which torch's tests look for.
    BRAID_THROW(Error, kOp, rank, "Rank 0 timed out in monitoredBarrier after 0 ms.\n",
                "No ranks successfully processed in monitoredBarrier.");
  }
  for (int r : peers) postRecv(p2p, ex, r, deadline, timeout);
  awaitRecvs(p2p, ex, rank, peers, seq, deadline, timeout, &stale);

  std::vector<int> failed;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(ex->mu);
    for (int r : peers) {
      const Op& got = ex->recv[r];
      if (got.state == Op::kOk && got.msg.seq == seq) continue;
      failed.push_back(r);
      if (got.state == Op::kOk) {
        why += strCat("; rank ", r, " is at monitored barrier #", got.msg.seq, ", this rank at #",
                      seq);
      } else if (got.state == Op::kFailed) {
        why += "; " + got.error;
      }
      if (stale[r] >= 0) {
        why += strCat("; rank ", r, " last sent monitored barrier #", stale[r], ", this rank is at #",
                      seq, " (a rank that skips a call stays behind)");
      }
    }
  }
  const Msg release{seq, static_cast<int64_t>(failed.size()), failed.empty() ? -1 : failed[0]};
  for (int r : peers) {
    postSend(p2p, ex, r, release, transport::Clock::now() + releaseFor, releaseFor);
  }
  if (!failed.empty()) {
    // Everyone was told (the late ranks when they arrive); the sends finish on
    // their own. gloo's wording, which scripts may look for.
    if (waitAllRanks) {
      BRAID_THROW(Error, kOp, rank, "Ranks ", joinRanks(failed), " failed to pass monitoredBarrier in ",
                  timeout.count(), " ms", why);
    }
    BRAID_THROW(Error, kOp, rank, "Rank ", failed[0], " failed to pass monitoredBarrier in ",
                timeout.count(), " ms", why);
  }
  // As gloo: the barrier passes once every release is on its way.
  std::unique_lock<std::mutex> lock(ex->mu);
  ex->cv.wait_until(lock, transport::Clock::now() + releaseFor + kGrace, [&] {
    return std::all_of(peers.begin(), peers.end(),
                       [&](int r) { return ex->send[r].state != Op::kPending; });
  });
  for (int r : peers) {
    const Op& s = ex->send[r];
    BRAID_ENFORCE(s.state == Op::kOk, kOp, rank, "could not release rank ", r, ": ",
                  s.state == Op::kPending ? "no answer from the P2P thread" : s.error);
  }
}

}  // namespace braid
