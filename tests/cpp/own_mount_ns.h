// Runs code in a child process with a mount namespace of its own, and, if
// asked, a fresh tmpfs on /dev/shm there: how the tests give a process a
// /dev/shm apart from its parent's (another "host", or one that is too small).
#pragma once

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <optional>
#include <string>

namespace braid {
namespace testing {

struct ChildRun {
  int status;       // as waitpid's
  std::string out;  // the child's stdout and stderr
};

// `shmSize` ("3m"): mount a tmpfs that large on /dev/shm; null: keep the
// parent's. `child` runs in the child, which then exits 0. nullopt when this
// machine gives no mount namespace (needs root).
inline std::optional<ChildRun> inOwnMountNamespace(const char* shmSize,
                                                   const std::function<void()>& child) {
  constexpr int kNoNamespace = 77;
  int out[2];
  if (pipe(out) != 0) return std::nullopt;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        (shmSize && mount("tmpfs", "/dev/shm", "tmpfs", 0,
                          (std::string("size=") + shmSize).c_str()) != 0)) {
      _exit(kNoNamespace);
    }
    child();
    fflush(stdout);
    _exit(0);
  }
  close(out[1]);
  ChildRun r{0, ""};
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) r.out.append(buf, n);
  close(out[0]);
  waitpid(pid, &r.status, 0);
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == kNoNamespace) return std::nullopt;
  return r;
}

}  // namespace testing
}  // namespace braid
