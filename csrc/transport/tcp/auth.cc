#include "transport/tcp/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/logging.h"

namespace braid {
namespace transport {
namespace tcp {
namespace {

void putU32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

void randomNonce(uint8_t* out, int rank) {
  BRAID_ENFORCE(RAND_bytes(out, static_cast<int>(kNonceBytes)) == 1, "tcp handshake", rank,
                "RAND_bytes failed to produce a nonce");
}

void computeMac(const std::string& secret, MacRole role, const MacInput& in, uint8_t* out) {
  static const char kDialerLabel[] = "braid-tcp-v1 dialer";
  static const char kAcceptorLabel[] = "braid-tcp-v1 acceptor";
  const char* label = role == MacRole::kDialer ? kDialerLabel : kAcceptorLabel;
  std::vector<uint8_t> msg(label, label + std::char_traits<char>::length(label) + 1);
  putU32(msg, static_cast<uint32_t>(in.group->size()));
  msg.insert(msg.end(), in.group->begin(), in.group->end());
  putU32(msg, in.dialer);
  putU32(msg, in.acceptor);
  putU32(msg, in.index);
  msg.insert(msg.end(), in.nonceDialer, in.nonceDialer + kNonceBytes);
  msg.insert(msg.end(), in.nonceAcceptor, in.nonceAcceptor + kNonceBytes);
  // An empty key still needs a valid pointer.
  static const uint8_t kNoKey = 0;
  const void* key = secret.empty() ? static_cast<const void*>(&kNoKey) : secret.data();
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key, static_cast<int>(secret.size()), msg.data(), msg.size(), out, &len) ||
      len != kMacBytes) {
    throw Error("braid tcp handshake: HMAC-SHA256 failed");
  }
}

bool macEqual(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kMacBytes) == 0; }

void warnUnauthenticatedOnce(int rank) {
  static std::once_flag once;
  std::call_once(once, [&] {
    BRAID_LOG(kWarn, "tcp", rank)
        << "TCP connections are NOT authenticated: neither BRAID_SECRET_FILE nor BRAID_SECRET is "
           "set, so anyone who can reach this job's ports can inject data. Set the same secret "
           "on every rank (and BRAID_REQUIRE_AUTH=1 to insist on it).";
  });
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
