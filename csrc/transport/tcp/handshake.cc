#include "transport/tcp/handshake.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace braid {
namespace transport {
namespace tcp {
namespace {

// The one message layout (Note [TCP authentication]), little-endian:
//   0 magic "BRTA" | 4 kind | 5 version | 6 status (Refusal) | 7 has-secret
//   8 dialer | 12 acceptor | 16 index | 20 reserved | 24 nonce[32] | 56 mac[32]
constexpr uint32_t kMagic = 0x41545242;
constexpr uint8_t kVersion = 1;
enum Kind : uint8_t { kHelloMsg = 1, kChallengeMsg, kResponseMsg, kVerdictMsg };

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

const char* refusalText(uint8_t r) {
  switch (static_cast<Refusal>(r)) {
    case Refusal::kNone: return "none";
    case Refusal::kAuthMode: return "one rank has a secret and the other has none";
    case Refusal::kWrongRank: return "the ranks or socket index do not fit its group";
    case Refusal::kDuplicate: return "that socket is already connected";
    case Refusal::kBadProof: return "this rank's proof of the secret did not match (different secrets?)";
  }
  return "unknown reason";
}

}  // namespace

Handshake::Handshake(const HandshakeIdentity& id, int peer, int index)
    : id_(id), dialer_(true), state_(State::kChallenge), peer_(peer), index_(index) {
  randomNonce(nonceMine_, id_.rank);
  send(kHelloMsg, Refusal::kNone, nullptr);
}

Handshake::Handshake(const HandshakeIdentity& id) : id_(id), dialer_(false), state_(State::kHello) {}

MacInput Handshake::macInput() const {
  MacInput in;
  in.group = &id_.group;
  in.dialer = static_cast<uint32_t>(dialer_ ? id_.rank : peer_);
  in.acceptor = static_cast<uint32_t>(dialer_ ? peer_ : id_.rank);
  in.index = static_cast<uint32_t>(index_);
  in.nonceDialer = dialer_ ? nonceMine_ : noncePeer_;
  in.nonceAcceptor = dialer_ ? noncePeer_ : nonceMine_;
  return in;
}

void Handshake::send(uint8_t kind, Refusal status, const uint8_t* mac) {
  std::memset(out_, 0, sizeof(out_));
  put32(out_, kMagic);
  out_[4] = kind;
  out_[5] = kVersion;
  out_[6] = static_cast<uint8_t>(status);
  out_[7] = id_.secret.empty() ? 0 : 1;
  put32(out_ + 8, static_cast<uint32_t>(dialer_ ? id_.rank : peer_));
  put32(out_ + 12, static_cast<uint32_t>(dialer_ ? peer_ : id_.rank));
  put32(out_ + 16, static_cast<uint32_t>(index_));
  if (kind == kHelloMsg || kind == kChallengeMsg) std::memcpy(out_ + 24, nonceMine_, kNonceBytes);
  if (mac) std::memcpy(out_ + 56, mac, kMacBytes);
  outLen_ = kHandshakeBytes;
  outSent_ = 0;
}

Handshake::Step Handshake::fail(const std::string& why) {
  why_ = why;
  state_ = State::kFailed;
  return Step::kFailed;
}

Handshake::Step Handshake::advance(int fd) {
  for (;;) {
    if (state_ == State::kFailed) return Step::kFailed;
    if (state_ == State::kDone) return Step::kDone;
    while (outSent_ < outLen_) {
      ssize_t n = ::send(fd, out_ + outSent_, outLen_ - outSent_, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kWant;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail(std::string("send failed during the handshake: ") + std::strerror(errno));
      outSent_ += static_cast<size_t>(n);
    }
    if (state_ == State::kSendLast) {
      if (failAfterSend_) return fail(why_);
      state_ = State::kDone;
      return Step::kDone;
    }
    if (state_ == State::kDecide) return Step::kVerified;
    while (inHave_ < kHandshakeBytes) {
      ssize_t n = ::recv(fd, in_ + inHave_, kHandshakeBytes - inHave_, 0);
      // A dialer that gives up closes its socket; if our challenge was still
      // unread there, its kernel resets the connection instead of closing it.
      // Either way it left after our challenge.
      const bool left = n == 0 || (n < 0 && errno == ECONNRESET);
      if (left && !dialer_ && state_ == State::kResponse) {
        return fail("closed the connection after this rank's challenge (a different secret?)");
      }
      if (n == 0) return fail("closed the connection during the handshake");
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kWant;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail(std::string("recv failed during the handshake: ") + std::strerror(errno));
      inHave_ += static_cast<size_t>(n);
    }
    inHave_ = 0;
    Step s = onMessage();
    if (s != Step::kWant) return s;
  }
}

Handshake::Step Handshake::onMessage() {
  const uint8_t want = dialer_ ? (state_ == State::kChallenge ? kChallengeMsg : kVerdictMsg)
                               : (state_ == State::kHello ? kHelloMsg : kResponseMsg);
  if (get32(in_) != kMagic || in_[5] != kVersion || in_[4] != want) {
    std::ostringstream os;
    os << "not a braid handshake message (magic 0x" << std::hex << get32(in_) << std::dec
       << ", version " << int(in_[5]) << ", kind " << int(in_[4]) << ", expected kind "
       << int(want) << ")";
    return fail(os.str());
  }
  const bool peerHasSecret = in_[7] != 0, iHaveSecret = !id_.secret.empty();
  uint8_t mac[kMacBytes];
  if (dialer_) {
    if (in_[6] != 0) {
      duplicate_ = in_[6] == static_cast<uint8_t>(Refusal::kDuplicate);
      return fail(std::string("refused the connection: ") + refusalText(in_[6]));
    }
    if (state_ == State::kVerdict) {
      state_ = State::kDone;
      return Step::kDone;
    }
    if (peerHasSecret != iHaveSecret) return fail(refusalText(uint8_t(Refusal::kAuthMode)));
    if (get32(in_ + 8) != uint32_t(id_.rank) || get32(in_ + 12) != uint32_t(peer_) ||
        get32(in_ + 16) != uint32_t(index_)) {
      return fail("answered for another pair or socket");
    }
    std::memcpy(noncePeer_, in_ + 24, kNonceBytes);
    computeMac(id_.secret, MacRole::kAcceptor, macInput(), mac);
    if (!macEqual(mac, in_ + 56)) {
      return fail("failed authentication: its proof of the secret does not match this rank's "
                  "(a different BRAID_SECRET, or not a braid rank of this group)");
    }
    computeMac(id_.secret, MacRole::kDialer, macInput(), mac);
    send(kResponseMsg, Refusal::kNone, mac);
    state_ = State::kVerdict;
    return Step::kWant;
  }
  if (state_ == State::kHello) {
    uint32_t d = get32(in_ + 8), a = get32(in_ + 12), idx = get32(in_ + 16);
    std::memcpy(noncePeer_, in_ + 24, kNonceBytes);
    Refusal r = Refusal::kNone;
    std::ostringstream os;
    if (a != uint32_t(id_.rank) || d >= uint32_t(id_.size) || d == a ||
        idx >= uint32_t(id_.socketsPerPeer)) {
      r = Refusal::kWrongRank;
      os << "claims to be rank " << d << " dialing rank " << a << " socket " << idx
         << ", which does not fit this group (rank " << id_.rank << " of " << id_.size << ", "
         << id_.socketsPerPeer << " sockets per peer)";
    } else if (peerHasSecret != iHaveSecret) {
      r = Refusal::kAuthMode;
      os << "claims to be rank " << d << ": " << (iHaveSecret ? "it has no secret and this rank has one"
                                                               : "it has a secret and this rank has none");
    }
    if (r != Refusal::kNone) {
      why_ = os.str();
      failAfterSend_ = true;
      send(kChallengeMsg, r, nullptr);
      state_ = State::kSendLast;
      return Step::kWant;
    }
    peer_ = static_cast<int>(d);
    index_ = static_cast<int>(idx);
    randomNonce(nonceMine_, id_.rank);
    computeMac(id_.secret, MacRole::kAcceptor, macInput(), mac);
    send(kChallengeMsg, Refusal::kNone, mac);
    state_ = State::kResponse;
    return Step::kWant;
  }
  computeMac(id_.secret, MacRole::kDialer, macInput(), mac);
  if (!macEqual(mac, in_ + 56)) {
    decide(Refusal::kBadProof);
    why_ = "claims to be rank " + std::to_string(peer_) +
           " but failed authentication (a different BRAID_SECRET, or not a braid rank)";
    return Step::kWant;
  }
  state_ = State::kDecide;
  return Step::kVerified;
}

void Handshake::decide(Refusal r) {
  send(kVerdictMsg, r, nullptr);
  state_ = State::kSendLast;
  failAfterSend_ = r != Refusal::kNone;
  if (r == Refusal::kDuplicate) why_ = "duplicate connection for a socket already taken";
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
