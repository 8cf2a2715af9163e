"""Several "hosts" on one machine, for tests and benchmarks across hosts.

    hosts = Hosts(2, link_gbit=1.0)      # or: with Hosts(2) as hosts: ...
    subprocess.run(hosts.cmd(1, ["python3", "rank.py"]), env=...)
    hosts.addr(0)                        # "10.233.0.1": host 0's address
    hosts.teardown()                     # idempotent; also at exit and on SIGTERM/SIGINT

CLI (tools/hosts.sh): `create N [--link-gbit G]` prints the run's prefix;
`run PREFIX HOST CMD...`; `teardown PREFIX`; `teardown-stale` (runs whose pid is gone).
Stdlib only, so that any python3 runs it; needs root, `ip`, `tc`, `unshare`, `nsenter`
(`unavailable()` says why not, for tests to skip with).

Note [Simulated hosts]
Host k is:
  - a network namespace `<prefix>-h<k>` (ip netns) whose eth0 is one end of a veth pair;
    the other ends are ports of a bridge in a namespace of its own, `<prefix>-br`. Addresses
    are 10.233.0.<k+1>/24 and fd00:233::<k+1>/64 with no default route, so a host reaches the other hosts and its
    own loopback and nothing else; the root namespace (this machine's network) is never
    joined. Every run has its own namespaces, so parallel runs may use the same addresses.
  - a hostname braid-h<k> and an /etc/hosts naming every host (gloo, torchrun and c10d
    resolve hostnames as on a real cluster). With own_name_loopback, a host's own name maps
    to 127.0.1.1 instead, as Debian's and Ubuntu's installers write it: the name by which the
    other hosts reach it resolves to loopback on the host itself;
  - a tmpfs of its own mounted at /dev/shm, shared by the processes of that host only.
`cmd(k, argv)` runs argv in host k's network namespace (nsenter) and in a fresh UTS and
private mount namespace (unshare) that set the hostname, bind the host's tmpfs at /dev/shm
and its hosts file at /etc/hosts, and hide the run's state directory (so no process can
reach another host's tmpfs). Each process gets its own UTS and mount namespace carrying the
same content, rather than all sharing a persistent one: nothing has to hold those namespaces
alive, and it works unchanged inside tools/torch2_root.sh's chroot (entering a persistent
mount namespace would leave the chroot). Processes keep the machine's PID namespace, so
braid's host identity (hostname/boot_id/pid namespace) differs between hosts by hostname.
--link-gbit caps each host's link at G Gbit/s both ways with tc tbf (this kernel has no netem):
on the host's eth0 (upload) and on its bridge port (download).
Teardown kills every process in the run's namespaces, deletes them (the veths and the bridge
go with them), unmounts the tmpfs and removes the state directory.
"""

import atexit
import functools
import os
import random
import shutil
import signal
import subprocess
import sys

SUBNET = "10.233.0"
SUBNET6 = "fd00:233"
STATE_ROOT = "/run/braid-hosts"
NETNS_DIR = "/run/netns"
TOOLS = ("ip", "tc", "unshare", "nsenter", "mount", "umount")

# Run inside the fresh namespaces, before exec'ing the command: $1 hostname, $2 the host's
# tmpfs, $3 its hosts file, $4 the state directory to hide.
_ENTER = ('echo "$1" > /proc/sys/kernel/hostname && mount --bind "$2" /dev/shm && '
          'mount --bind "$3" /etc/hosts && mount -t tmpfs -o size=4k,mode=700 none "$4" && '
          'shift 4 && exec "$@"')


@functools.lru_cache(maxsize=None)
def unavailable():
    """Why simulated hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, mounts)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"simulated hosts need {', '.join(missing)} (Debian: iproute2, util-linux)"
    probe = f"bhprobe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"`ip netns add` fails here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    p = subprocess.run(["unshare", "--uts", "--mount", "--propagation", "private", "true"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"`unshare --uts --mount` fails here: {p.stderr.strip()}"
    return None


def _sh(*argv, check=True):
    p = subprocess.run(list(argv), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"hosts: `{' '.join(argv)}` failed ({p.returncode}): "
                           f"{p.stderr.strip()}")
    return p


def _tbf(ns, dev, gbit):
    rate = int(gbit * 1e9)  # bits per second
    burst = max(64 << 10, rate // 8 // 250)  # >= 4 ms of traffic and a 64 KiB GSO packet
    _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate}bit",
        "burst", str(burst), "latency", "50ms")


class Hosts:
    """n simulated hosts (Note [Simulated hosts]); torn down by teardown() or at exit."""

    def __init__(self, n, link_gbit=None, prefix=None, create=True, own_name_loopback=False):
        self.n, self.link_gbit = n, link_gbit
        self.own_name_loopback = own_name_loopback
        self.prefix = prefix or f"bh{os.getpid()}-{random.randrange(16 ** 4):04x}"
        self.state = os.path.join(STATE_ROOT, self.prefix)
        self.bridge_ns = f"{self.prefix}-br"
        self._torn_down = False
        if create:
            atexit.register(self.teardown)
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                try:
                    signal.signal(signal.SIGTERM, _exit_on_signal)
                except ValueError:  # not the main thread: atexit alone
                    pass
            try:
                self._create()
            except BaseException:
                self.teardown()
                raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()

    def ns(self, k):
        return f"{self.prefix}-h{k}"

    def addr(self, k):
        return f"{SUBNET}.{k + 1}"

    def addr6(self, k):
        """Host k's IPv6 address (a unique local one, beside its IPv4 address)."""
        return f"{SUBNET6}::{k + 1}"

    def hostname(self, k):
        return f"braid-h{k}"

    def hosts_file(self, k):
        """Host k's /etc/hosts as seen from the root namespace."""
        return os.path.join(self.state, f"hosts-h{k}")

    def shm(self, k):
        """Host k's /dev/shm as seen from the root namespace (for leak checks)."""
        return os.path.join(self.state, f"h{k}", "shm")

    def _create(self):
        if self.n < 1 or self.n > 200:
            raise ValueError(f"hosts: {self.n} hosts; expected 1 to 200")
        os.makedirs(self.state, mode=0o700)
        for k in range(self.n):
            with open(self.hosts_file(k), "w") as f:
                f.write("127.0.0.1 localhost\n::1 localhost\n")
                f.writelines(f"{self.addr(q)} {self.hostname(q)}\n" for q in range(self.n)
                             if q != k or not self.own_name_loopback)
                if self.own_name_loopback:
                    f.write(f"127.0.1.1 {self.hostname(k)}\n")
        _sh("ip", "netns", "add", self.bridge_ns)
        _sh("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
        for k in range(self.n):
            ns, port = self.ns(k), f"port{k}"
            _sh("ip", "netns", "add", ns)
            # Both ends are created directly in their namespaces: none ever exists in ours.
            _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                "netns", self.bridge_ns)
            _sh("ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0")
            _sh("ip", "-n", self.bridge_ns, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.addr(k)}/24", "dev", "eth0")
            # nodad: usable at once, without duplicate address detection's delay
            _sh("ip", "-n", ns, "addr", "add", f"{self.addr6(k)}/64", "dev", "eth0", "nodad")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.link_gbit:
                _tbf(ns, "eth0", self.link_gbit)
                _tbf(self.bridge_ns, port, self.link_gbit)
            os.makedirs(self.shm(k))
            _sh("mount", "-t", "tmpfs", "-o", "mode=1777", "none", self.shm(k))

    def cmd(self, k, argv):
        """argv run on host k (a list for subprocess)."""
        return (["nsenter", f"--net={NETNS_DIR}/{self.ns(k)}", "unshare", "--uts", "--mount",
                 "--propagation", "private", "sh", "-c", _ENTER, "sh", self.hostname(k),
                 self.shm(k), self.hosts_file(k), self.state] + list(argv))

    def pids(self, k=None):
        """The processes running on host k (every host and the bridge: k=None)."""
        names = [self.ns(k)] if k is not None else [self.bridge_ns] + [self.ns(q) for q in
                                                                         range(self.n)]
        out = set()
        for ns in names:
            p = _sh("ip", "netns", "pids", ns, check=False)
            out |= {int(x) for x in p.stdout.split()}
        return out

    def set_link(self, k, up):
        """Takes host k's interface down (a host that vanishes from the network) or up."""
        _sh("ip", "-n", self.ns(k), "link", "set", "eth0", "up" if up else "down")

    def teardown(self):
        """Kills the hosts' processes and removes every trace of this run. Idempotent."""
        if self._torn_down:
            return
        self._torn_down = True
        teardown_prefix(self.prefix)


def _our_namespaces(prefix):
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return [n for n in names if n.startswith(prefix + "-")]


def teardown_prefix(prefix):
    names = _our_namespaces(prefix)
    for ns in names:
        for pid in _sh("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        _sh("ip", "netns", "del", ns, check=False)
    state = os.path.join(STATE_ROOT, prefix)
    if os.path.isdir(state):
        for entry in sorted(os.listdir(state)):
            shm = os.path.join(state, entry, "shm")
            if os.path.ismount(shm):
                _sh("umount", "-l", shm, check=False)
        shutil.rmtree(state, ignore_errors=True)


def leftovers(prefix):
    """What a run left behind: namespaces, mounts, its state directory."""
    left = [f"netns {n}" for n in _our_namespaces(prefix)]
    with open("/proc/self/mounts") as f:
        left += [f"mount {line.split()[1]}" for line in f
                 if f"{STATE_ROOT}/{prefix}/" in line.split()[1] + "/"]
    if os.path.exists(os.path.join(STATE_ROOT, prefix)):
        left.append(f"directory {STATE_ROOT}/{prefix}")
    return left


def teardown_stale():
    """Removes runs whose creating process is gone (a killed run's leftovers)."""
    prefixes = {n.split("-")[0] + "-" + n.split("-")[1] for n in _our_namespaces("bh")
                if n.count("-") >= 2}
    if os.path.isdir(STATE_ROOT):
        prefixes |= set(os.listdir(STATE_ROOT))
    removed = []
    for p in sorted(prefixes):
        pid = p[2:].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            teardown_prefix(p)
            removed.append(p)
    return removed


def _exit_on_signal(*_):
    sys.exit(128 + signal.SIGTERM)  # runs the atexit teardown, which SIGTERM's default skips


def main(argv):
    usage = ("usage: hosts.sh create N [--link-gbit G] | run PREFIX HOST CMD... | "
             "teardown PREFIX | teardown-stale | check")
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    what, rest = argv[0], argv[1:]
    if what == "check":
        why = unavailable()
        print(why or "ok")
        return 1 if why else 0
    if what == "create" and rest:
        gbit = float(rest[rest.index("--link-gbit") + 1]) if "--link-gbit" in rest else None
        h = Hosts(int(rest[0]), link_gbit=gbit, prefix=f"bh{os.getppid()}-"
                  f"{random.randrange(16 ** 4):04x}")
        atexit.unregister(h.teardown)  # the hosts outlive this command: `teardown` ends them
        print(h.prefix)
        return 0
    if what == "run" and len(rest) >= 3:
        prefix, k = rest[0], int(rest[1])
        h = Hosts(len(_our_namespaces(prefix)) - 1, prefix=prefix, create=False)
        os.execvp("nsenter", h.cmd(k, rest[2:]))
    if what == "teardown" and len(rest) == 1:
        teardown_prefix(rest[0])
        left = leftovers(rest[0])
        if left:
            print("\n".join(left), file=sys.stderr)
        return 1 if left else 0
    if what == "teardown-stale":
        print("\n".join(teardown_stale()))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
