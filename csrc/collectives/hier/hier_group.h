// A group whose ranks run on several hosts.
//
// Note [Collectives across hosts]
// Three groups carry a HierGroup's traffic, all made when it is created:
//  - world: a transport among all ranks with a NetComm (collectives/net):
//    TCP between hosts (transport/tcp), shared memory between the ranks of
//    one host (Note [Routing by host] in transport/routed.h);
//  - p2p: another such transport, whose TCP side connects pair by pair on
//    first use, for send/recv (net_p2p.h, Note [Point-to-point across hosts]);
//  - local: the ranks of this host over shared memory (a ShmGroup), when the
//    host runs more than one of the group's ranks;
//  - cross: a TCP transport among the ranks that have this rank's local rank
//    on every host (one such group per local rank), when every host runs the
//    same number L > 1 of ranks.
// Every op starts with the world's header exchange (Note [Collectives over
// messages]): each rank compares its op with every other rank's there, so a
// mismatch, a rank's argument error or a setting that differs fails every
// rank the same way before any data moves, and the stages after it need no
// agreement of their own (their own headers only re-check it). With local
// and cross groups, the headers travel through them, not all-to-all over the
// world's sockets (Note [Op headers across hosts], hier/relay.cc), and a
// small allreduce rides on that exchange (Note [Small allreduce across
// hosts]).
// Allreduce from BRAID_HIER_MIN_BYTES bytes, with local and cross groups,
// runs in three stages (hier/allreduce.cc): a reduce-scatter within the host
// over shared memory, leaving local rank l with section l of the host's sum;
// an allreduce of section l across hosts in cross group l (the L cross groups
// run at once, each over its own sockets); an allgather of the sections
// within the host; large buffers go through the stages in pieces of
// BRAID_HIER_PIPELINE_BYTES, pipelined (Note [Pipelined stages]). Each byte
// crosses the network once per host, not once per rank: a flat ring over
// n = H x L ranks sends 2(n-1)/n of the buffer per rank, L times that per
// host, where the hierarchy sends 2(H-1)/H per host in all. From the same
// threshold, broadcast and reduce (hier/broadcast.cc, Note [Staged broadcast
// and reduce]) and allgather and reduce_scatter (hier/allgather.cc, Note
// [Staged allgather and reduce-scatter]) run in two stages of the same kind,
// pipelined as well.
// Everything else (smaller buffers but allreduce's, groups with one rank per
// host or uneven hosts, gather, scatter, alltoall, barrier) runs over the
// world group, whose algorithms are latency-optimal for small buffers (a
// direct exchange) and bandwidth-optimal for large ones (rings), and whose
// messages between ranks of one host stay in shared memory. The world's
// header exchange decides for every op, so ranks that would stage
// differently fail there (the threshold travels in the header).
// Failures. A lost peer or a timeout in any stage breaks the group: every
// transport is aborted, so the ranks on other hosts see this rank leave and
// fail at once; the ranks of this host that wait for it in a shared-memory
// stage fail at their deadline. Errors across hosts name the peer's rank,
// host and address (TcpOptions::peerNames). An allreduce stage's error leads
// with what the caller ran ("braid allreduce (rank 5): op #7, stage 2 of 3
// (allreduce across hosts, among ranks 1, 5, where this rank is rank 1 of
// 2): ") and goes on with the stage's own error, which numbers ranks and ops
// as its sub-group does (local and cross groups have ranks 0..L-1, 0..H-1).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "collectives/group.h"
#include "collectives/net/net_comm.h"
#include "collectives/net/net_p2p.h"
#include "collectives/shm/shm_group.h"
#include "transport/store.h"
#include "transport/topology.h"

namespace braid {
namespace collectives {

struct HierOptions {
  std::string groupId;    // binds the TCP handshakes to this group incarnation
  std::string storeHost;  // picks the interface (TcpOptions::storeHost)
  std::chrono::milliseconds timeout{300000};
};

class HierGroup : public Group, private net::HeaderRelay {
 public:
  // Collective over the group's ranks: connects the world, local and cross
  // groups (Note [Collectives across hosts]). Throws naming "init" and the rank.
  HierGroup(transport::Store& store, const transport::Topology& topo, const HierOptions& opts);
  ~HierGroup() override;

  int rank() const override { return topo_.rank(); }
  int size() const override { return topo_.size(); }
  std::string describe() const override;

  void allreduce(const OpDesc& op, const void* in, void* out) override;
  void broadcast(const OpDesc& op, void* buf) override;
  void reduce(const OpDesc& op, const void* in, void* out) override;
  void allgather(const OpDesc& op, const void* in, void* const* outs) override;
  void gather(const OpDesc& op, const void* in, void* const* outs) override;
  void scatter(const OpDesc& op, const void* const* ins, void* out) override;
  void reduceScatter(const OpDesc& op, const void* const* ins, void* out) override;
  void alltoall(const OpDesc& op, const void* const* ins, void* const* outs) override;
  void barrier(const OpDesc& op) override;
  void failOp(const OpDesc& op) override;
  void markBroken(const std::string& why) override;

  PointToPoint& p2p() override;
  void abort() override;
  void close() override;

 struct Piece;  // hier/allreduce.cc

 private:
  struct Rider;    // hier/relay.cc
  struct Trailer;  // hier/relay.cc
  // The world's header exchange within and across hosts (Note [Op headers
  // across hosts], hier/relay.cc); set when the group has local and cross groups.
  void relay(const OpDesc& op, uint8_t* all, size_t hb) override;
  void relaySteps(const OpDesc& op, uint8_t* all, size_t hb);
  // A small allreduce's host sum, or a small broadcast's data on the root's
  // host, between the relay's steps (or why none).
  Trailer hostSum(const OpDesc& op, const uint8_t* all, size_t hb,
                  const uint8_t* gathered, size_t gb);
  std::string relayHead(const OpDesc& op, const std::string& where) const;
  // Begins op on the world group with `rider` riding on the relay.
  void ride(const OpDesc& op, Rider& rider);
  // Note [Small allreduce across hosts] (hier/relay.cc).
  void allreduceSmall(const OpDesc& op, const void* in, void* out);
  // Whether a broadcast is small enough to ride on the relay, and the ride
  // (Note [Small broadcast across hosts], hier/relay.cc).
  bool broadcastRides(const OpDesc& op) const;
  void broadcastSmall(const OpDesc& op, void* buf);
  // Whether op runs in stages (Note [Collectives across hosts]).
  bool staged(const OpDesc& op) const;
  void allreduceStages(const OpDesc& op, const void* in, void* out);  // hier/allreduce.cc
  void allgatherStages(const OpDesc& op, const void* in, void* const* outs);  // hier/allgather.cc
  void reduceScatterStages(const OpDesc& op, const void* const* ins, void* out);
  void broadcastStages(const OpDesc& op, void* buf);  // hier/broadcast.cc
  void reduceStages(const OpDesc& op, const void* in, void* out);
  // "braid <op> (rank r): op #k, stage n of 2 (<where>): ", which a two-stage
  // op's stage errors lead with (hier::stage).
  std::string stageHead(const char* op, int n, const std::string& where) const;

  const transport::Topology topo_;
  std::unique_ptr<transport::Transport> worldT_, crossT_, p2pT_;
  std::unique_ptr<net::NetComm> world_, cross_;
  std::unique_ptr<ShmGroup> local_;
  std::once_flag p2pOnce_;
  std::unique_ptr<net::NetP2P> p2p_;
  // The staged ops' own buffers (the partial sums of reduce and reduce-scatter,
  // the relay's host sums; the allreduce needs none, Note [The host's sum in
  // place]), kept between ops: a fresh zeroed buffer cost a memset and a page
  // fault per 4 KiB of every op (ops run one at a time).
  std::vector<uint8_t> staging_;
  std::vector<uint8_t> relayBuf_;  // the relay's blocks and bundles (hier/relay.cc)
  Rider* rider_ = nullptr;  // a small allreduce or broadcast, during its header exchange
};

}  // namespace collectives
}  // namespace braid
