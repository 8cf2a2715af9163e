/* Preloaded into gpu_check.sh's Python steps on the GPU machine (which has no gdb): a crash
 * prints its native frames before the process dies of the same signal, so that gpu_check can
 * name the function (addr2line) instead of only Python's frames. The H100 run that found Note
 * [One libstdc++ per process] needed exactly this. */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig) {
  static const char head[] = "braid native backtrace:\n";
  void* frames[64];
  int n = backtrace(frames, 64);
  (void)!write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL); /* die of the same signal: exit codes stay what callers expect */
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  signal(SIGSEGV, on_fatal);
  signal(SIGBUS, on_fatal);
  signal(SIGFPE, on_fatal);
  signal(SIGABRT, on_fatal);
}
