#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <utility>

#include "common/error.h"

namespace braid {
namespace transport {
namespace shm {

namespace {

#ifdef BRAID_SHARE_MAPPINGS
// See Note [One mapping per process under TSan].
struct SharedMapping {
  uint8_t* base;
  int users;
};
std::mutex& sharedMu() {
  static std::mutex m;
  return m;
}
std::map<std::string, SharedMapping>& shared() {
  static std::map<std::string, SharedMapping> m;
  return m;
}
#endif

std::string pidNamespaceTag() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) == 0) return std::to_string(st.st_ino);
  return "0";
}

std::string freshName() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          (uint64_t(getpid()) << 32) ^ uint64_t(time(nullptr)));
  char buf[32];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return "/braid." + pidNamespaceTag() + "." + std::to_string(getpid()) + "." + buf;
}

// Closes fd unless `keep` (and always on failure).
uint8_t* mapFd(int fd, size_t bytes, const std::string& name, bool keep = false) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    throw Error(strCat("braid shm: mmap of ", name, " (", bytes, " bytes) failed: ",
                       std::strerror(e)));
  }
  if (!keep) close(fd);
  return static_cast<uint8_t*>(p);
}

std::string mib(uint64_t bytes) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

Segment::~Segment() {
  unlink();
  release();
}

void Segment::release() {
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  if (!base_) return;
#ifdef BRAID_SHARE_MAPPINGS
  {
    std::lock_guard<std::mutex> lock(sharedMu());
    auto it = shared().find(name_);
    if (it != shared().end() && it->second.base == base_) {
      if (--it->second.users > 0) {
        base_ = nullptr;
        return;
      }
      shared().erase(it);
    }
  }
#endif
  munmap(base_, bytes_);
  base_ = nullptr;
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unlink();
    release();
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    linked_ = std::exchange(o.linked_, false);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

Segment Segment::create(size_t bytes) {
  Segment s;
  for (int attempt = 0;; ++attempt) {
    s.name_ = freshName();
    int fd = shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST && attempt < 8) continue;
    if (fd < 0) {
      throw Error(strCat("braid shm: cannot create ", s.name_, ": ", std::strerror(errno)));
    }
    s.linked_ = true;
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      close(fd);
      s.unlink();
      throw Error(strCat("braid shm: cannot size ", s.name_, " to ", bytes,
                         " bytes: ", std::strerror(e), " (is /dev/shm large enough?)"));
    }
    s.bytes_ = bytes;
    s.base_ = mapFd(fd, bytes, s.name_, /*keep=*/true);
    s.fd_ = fd;
#ifdef BRAID_SHARE_MAPPINGS
    std::lock_guard<std::mutex> lock(sharedMu());
    shared()[s.name_] = SharedMapping{s.base_, 1};
#endif
    return s;
  }
}

Segment Segment::open(const std::string& name, size_t bytes) {
  Segment s;
#ifdef BRAID_SHARE_MAPPINGS
  {
    std::lock_guard<std::mutex> lock(sharedMu());
    auto it = shared().find(name);
    if (it != shared().end()) {
      ++it->second.users;
      s.name_ = name;
      s.bytes_ = bytes;
      s.base_ = it->second.base;
      return s;
    }
  }
#endif
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw Error(strCat("braid shm: cannot open ", name, ": ", std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    throw Error(strCat("braid shm: ", name, " has ", st.st_size, " bytes, expected ", bytes,
                       " (do the ranks use different BRAID_SHM_* settings?)"));
  }
  s.name_ = name;
  s.bytes_ = bytes;
  s.base_ = mapFd(fd, bytes, name);
  return s;
}

// Note [Reserved shared memory]
// A segment is sized with ftruncate, which allocates nothing: tmpfs gives a
// page when it is first touched, and when /dev/shm is full (a container's is
// often 64 MiB) that touch raises SIGBUS and the process dies. So every range
// is reserved before it is touched, with posix_fallocate, which fails cleanly
// instead: a window reserves its header, control area and slots when it is
// made (its creation fails, naming the room it lacks, on every rank), and each
// point-to-point ring when its first message is written into it (the send
// fails), so rings that carry nothing still cost nothing (Note [Ring size]).
void Segment::reserve(size_t offset, size_t bytes, const std::string& what) const {
  if (fd_ < 0 || bytes == 0) return;
  int e = posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  if (e == 0) return;
  std::string room;
  struct statvfs st;
  if (statvfs("/dev/shm", &st) == 0) {
    room = strCat("; /dev/shm has ", mib(uint64_t(st.f_bavail) * st.f_frsize), " free of ",
                  mib(uint64_t(st.f_blocks) * st.f_frsize));
  }
  throw Error(strCat("braid shm: cannot reserve ", mib(bytes), " of shared memory for ", what,
                     ": ", std::strerror(e), room,
                     e == ENOSPC ? " (give /dev/shm more room, e.g. docker run --shm-size=1g, or "
                                   "lower BRAID_SHM_SLOT_BYTES or BRAID_SHM_P2P_BYTES)"
                                 : ""));
}

void Segment::unlink() {
  if (linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

bool processGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // /proc/<pid>/stat is "pid (comm) S ...": the state follows the last ')'.
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "re");
  if (!f) return false;  // no procfs: trust kill()
  char buf[512];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* close = strrchr(buf, ')');
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

void sweepStale() {
  const std::string prefix = "braid." + pidNamespaceTag() + ".";
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    pid_t pid = static_cast<pid_t>(atol(n.c_str() + prefix.size()));
    if (pid > 0 && processGone(pid)) shm_unlink(("/" + n).c_str());
  }
  closedir(d);
}

}  // namespace shm
}  // namespace transport
}  // namespace braid
