"""torchrun, made to work with Debian's torch builds. See tools/torchrun.

Note [torchrun without libuv]
torch 2.4 and later create TCPStores with libuv by default (use_libuv=True), and a
torch built without libuv, as Debian's 2.6 and 2.14 are, refuses that on the
server and on the client alike ("use_libuv was requested but PyTorch was build
without libuv support"). USE_LIBUV=0 turns libuv off, but torch reads it in only
some of the places that make a store:
  - torchrun's agent: torch.distributed.elastic.utils.distributed reads it; the
    rendezvous backends (static, c10d, and the shared store of the dynamic
    rendezvous) do not (torch 2.6);
  - the workers: env:// and tcp:// read it when every rank makes its own store,
    but under torchrun the workers are clients of the agent's store
    (TORCHELASTIC_USE_AGENT_STORE=True), and that client, in
    torch.distributed.rendezvous._create_c10d_store, is made with the default,
    use_libuv=True, whatever USE_LIBUV says.
So where this torch has a use_libuv option but no libuv server (found by trying
to start one: torch's build configuration does not say), or where USE_LIBUV=0
is set already, this launcher
  1. sets USE_LIBUV=0 in its own environment, which the workers inherit (braid's
     C++ init_from_env and the workers' own stores follow it);
  2. makes the agent's stores default to use_libuv=False;
  3. starts each Python worker through tools/torchrun_worker.py, which makes the
     agent-store client follow USE_LIBUV and then runs the script as python would.
torch 1.x has no use_libuv option at all: nothing of this applies there. The
tests run torchrun with USE_LIBUV unset (harness.torchrun_env) and check what the
workers saw (test_init.py's test_torchrun).
"""
import os

import torch.distributed as dist


def libuv_state():
    """'absent': this torch's TCPStore has no use_libuv option (torch 1.x);
    'missing': it has the option but no libuv server (a build without libuv);
    'present': a libuv server starts."""
    try:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except TypeError:
        return "absent"
    except RuntimeError as e:
        if "libuv" in str(e):
            return "missing"
        raise  # not about libuv: a loopback store on port 0 should always start
    del store
    return "present"


def _patch_tcp_store():
    """The agent's stores: every module of torchrun's that makes one, by the name it uses."""
    base = dist.TCPStore

    class TCPStore(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    import importlib

    for name in ("torch.distributed", "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
                 "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
                 "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
                 "torch.distributed.elastic.utils.distributed"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(mod, "TCPStore", None) is base:
            mod.TCPStore = TCPStore


def _patch_worker_command():
    """Python workers start through torchrun_worker.py (step 3 of the Note)."""
    import torch.distributed.run as run

    shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_worker.py")
    config_from_args = run.config_from_args

    def patched(args):
        config, cmd, cmd_args = config_from_args(args)
        if isinstance(cmd, str) and not args.no_python and cmd_args[:1] == ["-u"]:
            cmd_args = ["-u", shim] + cmd_args[1:]
        elif callable(cmd):  # --run-path: the workers are processes of multiprocessing
            import torchrun_worker  # this file's directory is sys.path[0]

            cmd = torchrun_worker.run_script_path
        # --no-python: a program of its own; braid's C++ init_from_env follows USE_LIBUV.
        return config, cmd, cmd_args

    run.config_from_args = patched


def _without_libuv():
    state = libuv_state()
    if state == "missing":
        return True
    return state == "present" and os.environ.get("USE_LIBUV") == "0"


if _without_libuv():
    os.environ["USE_LIBUV"] = "0"
    _patch_tcp_store()
    _patch_worker_command()

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    main()
