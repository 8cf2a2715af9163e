// Small allreduces and barriers among many ranks: a radix-4 gather tree and a
// flat release (issue 30 item 2).
//
// Note [Tree allreduce]
// The one-shot allreduce (allreduce.cc) has every rank wait for every peer's
// counter and read every peer's input: n - 1 polled lines and n inputs per
// rank, n^2 line transfers in all, and at 8 or 16 ranks its latency grows
// with n (issue 30: 22 us at 8 ranks, 145 us at 16, against 4.7 us at 2). In
// groups of BRAID_ALLREDUCE_TREE_RANKS ranks or more (default 8; 0: never),
// allreduces of up to BRAID_ALLREDUCE_TREE_MAX_BYTES (default 16 KiB, and at
// most BRAID_ALLREDUCE_ONESHOT_MAX and half a slot) and barriers take two
// steps instead, as MPICH's release/gather does:
// - gather (step s): rank r waits for its children 4r+1..4r+4 (those below
//   n) to publish s, compares each child's header with its own, reduces its
//   own input and the children's partials into its partial, and publishes
//   s. The partial of a leaf is its input. Partials of up to 48 bytes travel
//   beside the rank's step counter, in the counter's own cache line (Note
//   [Bytes beside the step counter] in transport/window.h), so a parent gets
//   a child's step and partial in one line transfer; larger ones lie in the
//   child's slot of step s.
// - release (step s + 1): rank 0, the root, reduces its own input with its
//   children's partials into the result, puts it beside its counter (up to
//   48 bytes) or in its slot of step s + 1, and publishes s + 1; every other
//   rank waits for that one counter, copies the result out and publishes
//   s + 1 itself.
// Each rank polls at most 4 children's lines and the root's, whatever n,
// and the longest chain of waits is log4(n) + 1 hops: 2 up to 5 ranks, 3 up
// to 21, 4 up to 85. The counters are the window's own step counters (one per
// rank on its own line, growing, never reset), so every wait is the window's
// wait, under the same spin policy (Note [Spin, then sleep] in
// transport/shm/futex.h, Note [Spinning for a blocked rank] in
// common/cpu_cores.h): ranks that outnumber their cores spin briefly and
// sleep on the futex, nothing else sleeps.
//
// Order and rounding. Rank r combines, in this fixed order, its own input,
// then its children's partials in rank order: partial(r) = in(r) op
// partial(4r+1) op ... op partial(4r+4), left to right, with the kernels of
// math/reduce.h. The result is computed once, by the root, and every rank
// copies the same bytes: every rank gets the same bits, whatever the timing.
// Integers (wrap-around), bool, MIN and MAX give exactly the flat path's
// result. Float SUM and PRODUCT group the terms differently from the flat
// path (in(0) op in(1) op ... op in(n-1)), so their last bits may differ
// from it, though not between ranks or runs. float16 and bfloat16 keep the
// flat path's rule (Note [Reduced-precision accumulation] in math/reduce.h):
// partials travel as float32 (twice the bytes, hence half a slot at most),
// inputs are widened once, everything is combined in float32, and the root
// rounds once to the 16-bit type; AVG then divides that rounded sum as the
// flat path does (reduce::divide), so it rounds twice there, as before.
//
// Why these defaults: at 2 and 4 ranks the one-shot is one step and already
// at the floor, so the tree must not engage there; from 8 ranks the flat
// path's per-rank cost grows with n, the tree's with log n
// (benchmarks/results/tree-allreduce-2core.txt has what a 2-core machine
// could measure; the 16-core check is tools/scaling_check.sh). The byte
// limit keeps larger messages on the one-shot, whose reads spread over all
// ranks' caches, where the tree funnels n * 5 partials through 4 levels.
//
// Note [Tree slots]
// Within a group's run of tree ops no rank waits for every peer before it
// writes its slots or its counter's line again; it need not:
// - rank r's partial of step s (line or slot s % 2) is read only by its
//   parent, before the parent publishes s, so before the root releases s + 1;
//   r writes a partial again only in its next op, after that release.
// - the root's result of step s + 1 (line or slot (s + 1) % 2) is read by
//   every rank before it publishes s + 2 (the next op's gather step: it reads
//   the result, publishes s + 1, and only then starts the next op); the root
//   writes the next result only after its children published s + 2, which
//   they did only after their own children did, and so on: after every rank
//   has read this result.
// - a header in the control area of step s is read by the rank's parent
//   before the release, as its partial.
// The same chains of release/acquire order (child publishes, parent
// acquires, ...) make these plain reads and writes race-free for the memory
// model (and TSan). The argument needs the op before to have been this
// group's tree op and to have ended well (Communicator::treeDone): after any
// other op, or after a failed tree op (whose error texts, and whose flat
// ranks' headers, are read after the release), Communicator::treeSteps waits
// for every peer first, as Note [Step protocol] asks of every flat step.
//
// Note [Flat ranks among tree ranks]
// Whether an op takes the tree depends on its kind and size and on the
// settings, which the headers compare (Note [Settings that shape an op]):
// ranks that differ in one of them, or in the op's size, or a rank that
// failed its argument checks (failOp sends a header-only flat step), may run
// a flat op beside the tree ranks. They must still fail together, with the
// step numbers aligned, which two rules ensure:
// - a tree rank compares each child's header before it trusts the child's
//   status and partial; the first difference found in a subtree (or a
//   rank's own failed checks) travels up as a status word beside the
//   counter (1 + the rank that found it; its text in that rank's control
//   area of step s), and the root releases it, so every tree rank throws,
//   naming that rank and what it found. Where a flat rank is somebody's
//   child, that parent finds it; where rank 0 itself is flat, see below.
// - a flat rank's header step (Communicator::exchange) reads every header;
//   when one says tree, it takes the tree's release step too
//   (Communicator::followTree): rank 0 releases the tree ranks with its own
//   finding as the error, the others publish it; then it throws what it
//   found. It reads every header before it publishes s + 1, never after: a
//   tree rank that has its release starts its next op and writes its header
//   again once every rank has published s + 1.
// Both sides thus use steps s and s + 1 and fail the op; the group stays
// usable, and its next op waits for every peer (Note [Tree slots]).
#pragma once

#include "collectives/shm/communicator.h"

namespace braid {
namespace collectives {

constexpr int kTreeRadix = 4;
// A rank's line (Note [Bytes beside the step counter]): the status word,
// then the partial or result when it fits.
constexpr size_t kTreeInlineBytes = transport::Window::kLineBytes - sizeof(uint64_t);

// Allreduce (or, with kind kBarrier, a barrier: no data) as Note [Tree
// allreduce] describes; plan() chose Algo::kTree. in == out allowed.
void allreduceTree(Communicator& c, const OpDesc& op, const void* in, void* out);

}  // namespace collectives
}  // namespace braid
