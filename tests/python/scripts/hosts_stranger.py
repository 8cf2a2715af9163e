"""A stranger on the network (test_hosts_faults.py): connects to braid ranks' listening ports.

    hosts_stranger.py TARGETS_JSON WAIT_S

TARGETS_JSON: [[addr, port, [[acceptor, dialer], ...]], ...]; for each target port:
- garbage: sends 200 bytes of an HTTP request and reads until braid closes the connection;
- silent: connects and says nothing; braid must close it at its handshake deadline (WAIT_S
  bounds the wait);
- plausible: speaks braid's handshake (Note [TCP authentication], tcp/handshake.cc) without
  the secret: a HELLO claiming to be rank `dialer` dialing rank `acceptor` (candidates tried
  in order until one is not refused as a wrong rank), then a RESPONSE with a random MAC.
Prints one JSON line: per target, what braid answered and when it closed each connection.
"""

import json
import os
import socket
import struct
import sys
import time

MAGIC, VERSION = 0x41545242, 1
HELLO, CHALLENGE, RESPONSE, VERDICT = 1, 2, 3, 4
SIZE = 88


def message(kind, dialer, acceptor, index, nonce=b"", mac=b""):
    m = struct.pack("<IBBBBIIII", MAGIC, kind, VERSION, 0, 1, dialer, acceptor, index, 0)
    m += nonce.ljust(32, b"\0") + mac.ljust(32, b"\0")
    assert len(m) == SIZE
    return m


def read_exactly(s, n):
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            break
        buf += b
    return buf


def closed_within(s, seconds):
    """Seconds until the peer closed the connection (EOF or reset), or None."""
    t0 = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except socket.timeout:
        return None
    except OSError:
        pass  # reset
    return time.monotonic() - t0


def garbage(addr, port):
    s = socket.create_connection((addr, port), 5)
    junk = b"GET / HTTP/1.1\r\nHost: braid\r\n\r\n".ljust(200, b"x")
    s.sendall(junk)
    t = closed_within(s, 10)
    s.close()
    return {"closed_after": t}


def plausible(addr, port, candidates):
    tried = []
    for acceptor, dialer in candidates:
        s = socket.create_connection((addr, port), 5)
        s.sendall(message(HELLO, dialer, acceptor, 0, os.urandom(32)))
        ch = read_exactly(s, SIZE)
        if len(ch) < SIZE:
            tried.append({"claim": [dialer, acceptor], "challenge": "closed"})
            s.close()
            continue
        magic, kind, _, status = struct.unpack("<IBBB", ch[:7])
        tried.append({"claim": [dialer, acceptor], "challenge_kind": kind, "status": status})
        if status != 0:  # refused (2: the claim does not fit this group): next candidate
            closed_within(s, 10)
            s.close()
            continue
        s.sendall(message(RESPONSE, dialer, acceptor, 0, b"", os.urandom(32)))
        verdict = read_exactly(s, SIZE)
        tried[-1]["verdict_status"] = verdict[6] if len(verdict) == SIZE else "closed"
        tried[-1]["closed_after"] = closed_within(s, 10)
        s.close()
        break
    return tried


def main():
    targets, wait_s = json.loads(sys.argv[1]), float(sys.argv[2])
    silent = []
    for addr, port, _ in targets:  # opened first: they wait out the others' exchanges
        silent.append((socket.create_connection((addr, port), 5), time.monotonic()))
    out = []
    for addr, port, candidates in targets:
        out.append({"port": port, "garbage": garbage(addr, port),
                    "plausible": plausible(addr, port, candidates)})
    for (s, t0), rec in zip(silent, out):
        t = closed_within(s, max(0.1, wait_s - (time.monotonic() - t0)))
        rec["silent_closed_after"] = None if t is None else time.monotonic() - t0
        s.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
