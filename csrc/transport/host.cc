#include "transport/host.h"

#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/settings.h"

namespace braid {
namespace transport {

BRAID_SETTING_STRING(kHostIdOverride, "BRAID_HOST_ID_OVERRIDE", "",
                     "Replaces this process's host identity (for tests that simulate hosts).");

namespace {
std::string readFirstLine(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}
}  // namespace

std::string hostIdentity() {
  std::string override = kHostIdOverride.get();
  if (!override.empty()) return override;
  char host[HOST_NAME_MAX + 1] = {0};
  gethostname(host, sizeof(host) - 1);
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  std::ostringstream os;
  os << host << '/' << readFirstLine("/proc/sys/kernel/random/boot_id") << '/'
     << (n > 0 ? std::string(ns, n) : std::string("?"));
  // Segments are named in /dev/shm (shm_open): two processes that agree on
  // all of the above but each mount a /dev/shm of its own (a mount namespace
  // with its own tmpfs) cannot open each other's, so they are two hosts to
  // braid and talk over TCP rather than fail at the first segment.
  struct stat st;
  if (::stat("/dev/shm", &st) == 0) {
    os << "/shm:" << major(st.st_dev) << ':' << minor(st.st_dev) << ':' << st.st_ino;
  }
  return os.str();
}

}  // namespace transport
}  // namespace braid
