// One socket's authentication handshake (Note [TCP authentication]), as a
// non-blocking state machine that the progress thread advances whenever the
// socket is readable or writable. It reads exactly the handshake's bytes, so
// frames may follow at once on the same socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/tcp/auth.h"

namespace braid {
namespace transport {
namespace tcp {

constexpr size_t kHandshakeBytes = 88;

// Why an acceptor refused, as sent in the CHALLENGE or VERDICT.
enum class Refusal : uint8_t { kNone = 0, kAuthMode, kWrongRank, kDuplicate, kBadProof };

struct HandshakeIdentity {
  std::string group;
  std::string secret;
  int rank = 0;
  int size = 0;
  int socketsPerPeer = 0;
};

class Handshake {
 public:
  enum class Step {
    kWant,      // more I/O needed: wait for wantsWrite() ? writable : readable
    kVerified,  // acceptor: the dialer proved the secret; call decide()
    kDone,      // the socket is authenticated and carries frames from now on
    kFailed,    // see why() and refusedAsDuplicate()
  };

  // A dialer for socket `index` of the pair (id.rank, peer).
  Handshake(const HandshakeIdentity& id, int peer, int index);
  // An acceptor: learns peer and index from the HELLO.
  explicit Handshake(const HandshakeIdentity& id);

  Step advance(int fd);
  // Acceptor, after kVerified: keep the socket (Refusal::kNone) or refuse it.
  void decide(Refusal r);

  bool wantsWrite() const { return outSent_ < outLen_; }
  int peer() const { return peer_; }
  int index() const { return index_; }
  const std::string& why() const { return why_; }
  bool refusedAsDuplicate() const { return duplicate_; }

 private:
  enum class State { kHello, kChallenge, kResponse, kDecide, kVerdict, kSendLast, kDone, kFailed };
  Step onMessage();
  Step fail(const std::string& why);
  void send(uint8_t kind, Refusal status, const uint8_t* mac);
  MacInput macInput() const;

  const HandshakeIdentity& id_;
  const bool dialer_;
  State state_;
  int peer_ = -1;
  int index_ = -1;
  uint8_t nonceMine_[kNonceBytes];
  uint8_t noncePeer_[kNonceBytes];
  uint8_t out_[kHandshakeBytes];
  size_t outLen_ = 0, outSent_ = 0;
  uint8_t in_[kHandshakeBytes];
  size_t inHave_ = 0;
  bool failAfterSend_ = false;
  bool duplicate_ = false;
  std::string why_;
};

}  // namespace tcp
}  // namespace transport
}  // namespace braid
