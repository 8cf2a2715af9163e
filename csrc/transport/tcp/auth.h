// Authentication of every TCP socket: a challenge-response on the per-job
// secret, run by Handshake (tcp/handshake.h) before the socket carries data.
//
// Note [TCP authentication]
// Threat model: anyone who can reach a rank's listening port may connect and
// send anything; the rendezvous store is not authenticated either (c10d's
// TCPStore has no authentication), so it carries addresses only, never the
// secret and never anything that grants access. The secret reaches each rank
// out of band (BRAID_SECRET_FILE, or BRAID_SECRET), and never travels.
// Each socket runs, with 88-byte fixed-size messages (tcp/handshake.cc):
//   dialer -> acceptor  HELLO     dialer rank, acceptor rank, socket index,
//                                 whether it has a secret, nonce_d
//   acceptor -> dialer  CHALLENGE nonce_a, mac_a = HMAC(secret, "acceptor" |
//                                 group | dialer | acceptor | index | nonce_d | nonce_a)
//   dialer -> acceptor  RESPONSE  mac_d = HMAC(secret, "dialer" | same fields)
//   acceptor -> dialer  VERDICT   ok, or why it refused
// HMAC-SHA256 from OpenSSL's libcrypto, loaded at run time (Note [libcrypto
// at run time]); nonces are 32 bytes from RAND_bytes; MACs are compared with
// CRYPTO_memcmp (constant time). So:
// - each side proves it knows the secret without sending it;
// - both nonces are fresh, so a recorded exchange replays nowhere: a replayed
//   RESPONSE does not match the acceptor's new nonce_a, a replayed CHALLENGE
//   not the dialer's new nonce_d;
// - the role label keeps an acceptor from being used as an oracle for the
//   dialer's MAC (reflection), and group, ranks and index bind the proof to
//   one socket of one pair of one group incarnation: it cannot be moved to
//   another group, pair or socket;
// - the acceptor allocates nothing for a connection until its RESPONSE
//   verified: until then a connection is a fixed-size Handshake with a
//   deadline, and a stranger's garbage is rejected, its address logged, and
//   the group carries on. A peer that fails is logged with its address.
// Without a secret both sides use an empty key: the exchange still checks
// group, ranks and index, but authenticates nothing (one warning per
// process); BRAID_REQUIRE_AUTH=1 refuses to run so. A rank with a secret and
// one without refuse each other, naming the difference.
// Not covered: confidentiality and integrity of the data after the
// handshake (no TLS: an on-path attacker can read and alter frames); a
// denial of service by flooding the port.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid {
namespace transport {
namespace tcp {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;

// Note [libcrypto at run time]
// braid uses four functions of OpenSSL's libcrypto: HMAC (the one-shot form),
// EVP_sha256, RAND_bytes and CRYPTO_memcmp. It loads the library with dlopen
// on first use instead of linking it, and declares their signatures itself
// (auth.cc), so building braid needs no OpenSSL headers (libssl-dev) and
// libbraid and torch_braid._C do not depend on libcrypto: a machine with
// pip's torch usually has the runtime (Python's ssl module uses it) but not
// the headers. The four have kept their ABI from OpenSSL 1.1.0 to 3.x (HMAC
// has taken the data's length as size_t since 1.1.0; EVP_MD is opaque here).
// Which copy: one already in the process first (dlopen with RTLD_NOLOAD;
// Python's ssl module loads it), so that the process holds one libcrypto;
// else libcrypto.so.3, else libcrypto.so.1.1; BRAID_LIBCRYPTO names a file to
// load instead. It is loaded once per process, by the first TCP group:
// groups within one host never need it.
//
// Without it, a TCP group fails at init with an error that names what is
// missing and why (dlerror), secret or not: the handshake's MAC binds group,
// ranks and socket even without a secret, and a job that set a secret must
// never run unauthenticated because a library is missing. There is no
// unauthenticated fallback to switch off, so BRAID_REQUIRE_AUTH=1 needs no
// rule of its own here. `python -m torch_braid.info` shows which file was
// loaded, or why none was.
struct CryptoInfo {
  bool loaded = false;
  std::string path;     // the file loaded, as the dynamic loader names it
  std::string version;  // OpenSSL_version(OPENSSL_VERSION), when it has one
  std::string how;      // "already loaded in the process", "dlopen", "BRAID_LIBCRYPTO"
  std::string error;    // why it could not be loaded (empty when loaded)
};
// Loads libcrypto on the first call; later calls return the same answer.
CryptoInfo cryptoInfo();
// Throws braid::Error (op "tcp init") naming what is missing when libcrypto
// cannot be loaded. The TCP transport calls it before it listens.
void requireCrypto(int rank);

// HMAC-SHA256 of `data` under `key` (an empty key is allowed).
void hmacSha256(const void* key, size_t keyLen, const uint8_t* data, size_t n,
                uint8_t out[kMacBytes]);

// Fresh random bytes (RAND_bytes); throws braid::Error when the generator fails.
void randomNonce(uint8_t* out, int rank);

struct MacInput {
  const std::string* group;
  uint32_t dialer, acceptor, index;
  const uint8_t* nonceDialer;
  const uint8_t* nonceAcceptor;
};
enum class MacRole { kDialer, kAcceptor };

// HMAC-SHA256(secret, role | group | dialer | acceptor | index | nonces).
void computeMac(const std::string& secret, MacRole role, const MacInput& in, uint8_t* out);
// Constant-time comparison (CRYPTO_memcmp).
bool macEqual(const uint8_t* a, const uint8_t* b);

// Logs, once per process, that TCP connections are not authenticated.
void warnUnauthenticatedOnce(int rank);

namespace testing {
// Forgets the loaded library, so that the next use loads again (reading
// BRAID_LIBCRYPTO again): tests of the load and of its failure. Not for use
// while a TCP group runs.
void reloadCryptoForTesting();
}  // namespace testing

}  // namespace tcp
}  // namespace transport
}  // namespace braid
