// The TCP stages of a staged op's pieces, on a thread of their own, while the
// caller runs the shared-memory stages (Note [Pipelined stages]).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "transport/transport.h"

namespace braid {
namespace collectives {
namespace hier {

class SerialThread;

// Note [Pipelined stages]
// A staged op (Note [Collectives across hosts]) cuts its buffer into pieces
// of BRAID_HIER_PIPELINE_BYTES and runs its stages piece after piece. The
// worker runs the shared-memory stages; a thread of the op's own
// ("braid-hier") runs the TCP stage of each piece in order, so the link
// carries piece i while the worker works on the pieces before and after it:
// on a slow link the shared-memory stages hide behind the transfer instead of
// adding to it. Every rank cuts alike (the setting travels in the world's
// header) and runs the stages of its sub-groups in the same order. When a
// stage fails on either thread, this rank aborts its cross transport, so the
// TCP stages still queued end at once and the other hosts see the rank leave;
// the thread is joined before the error reaches the caller, so no stage
// touches the buffers after the op returns. Which error the caller gets: when
// another host goes away, the TCP stage fails (naming the lost rank and its
// host), but the worker may learn it first and second hand, from a local peer
// that failed and left the shared-memory stage; so a shared-memory failure
// waits up to 500 ms for the pending TCP stages and reports a lost peer or a
// timeout there instead.
class CrossStages {
 public:
  // `cross`: the transport of this rank's cross group, aborted on failure.
  CrossStages(size_t pieces, transport::Transport& cross);
  // Runs what is still queued (it fails fast once the transport is aborted),
  // then joins: declare it after the buffers its stages use.
  ~CrossStages();

  // Queues piece i's TCP stage.
  void submit(size_t i, std::function<void()> stage);
  // Waits for piece i's TCP stage; rethrows its error.
  void wait(size_t i);
  // After a failure on either thread (`error`, caught by the caller): picks
  // the error to report, aborts the cross transport and throws it.
  [[noreturn]] void fail(std::exception_ptr error);

 private:
  std::vector<std::future<void>> crossed_;
  bool crossError_ = false;  // the error came from a TCP stage
  transport::Transport& cross_;
  std::unique_ptr<SerialThread> thread_;
};

// A two-stage op over `pieces` pieces: across(i), its TCP stage, on the
// CrossStages thread; within(i), its shared-memory stage, on the caller.
// One piece runs both on the caller.
using PieceStage = std::function<void(size_t)>;
// Broadcast, allgather: piece i's TCP stage, then its shared-memory stage.
void acrossThenWithin(size_t pieces, transport::Transport& cross, const PieceStage& across,
                      const PieceStage& within);
// Reduce, reduce_scatter: piece i's shared-memory stage, then its TCP stage.
void withinThenAcross(size_t pieces, transport::Transport& cross, const PieceStage& within,
                      const PieceStage& across);

}  // namespace hier
}  // namespace collectives
}  // namespace braid
