"""How tools/torchrun.py starts a Python worker where the TCPStores must do without
libuv (Note [torchrun without libuv] in tools/torchrun.py):

    python -u tools/torchrun_worker.py SCRIPT ARGS...
    python -u tools/torchrun_worker.py -m MODULE ARGS...

It makes torch.distributed.rendezvous's stores follow USE_LIBUV (torch makes the
client of the agent's store with use_libuv=True whatever USE_LIBUV says), then runs
SCRIPT or MODULE as `python SCRIPT ARGS...` would: as __main__, with the same
sys.argv and sys.path[0]. It imports nothing of torch itself: the script may
set up its environment before it imports torch, so the change is made when torch
loads that module.
"""
import importlib.abc
import importlib.util
import os
import runpy
import sys

_RENDEZVOUS = "torch.distributed.rendezvous"


def _follow_use_libuv(module):
    base = module.TCPStore

    class TCPStore(base):
        def __init__(self, *args, **kwargs):
            # What torch's env:// and tcp:// rendezvous read when they pass use_libuv.
            kwargs.setdefault("use_libuv", os.environ.get("USE_LIBUV", "1") == "1")
            super().__init__(*args, **kwargs)

    module.TCPStore = TCPStore


class _OnImport(importlib.abc.MetaPathFinder):
    """Patches the rendezvous module right after torch executes it."""

    def find_spec(self, name, path=None, target=None):
        if name != _RENDEZVOUS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_patch(module):
                exec_module(module)
                _follow_use_libuv(module)

            spec.loader.exec_module = exec_then_patch
        return spec


def install():
    if _RENDEZVOUS in sys.modules:
        _follow_use_libuv(sys.modules[_RENDEZVOUS])
    else:
        sys.meta_path.insert(0, _OnImport())


def run_script_path(training_script, *training_script_args):
    """torchrun --run-path's worker function (torch.distributed.run.run_script_path), with
    install() first."""
    install()
    sys.argv = [training_script, *training_script_args]
    runpy.run_path(training_script, run_name="__main__")


def main(argv):
    if not argv or argv == ["-m"]:
        sys.exit("usage: torchrun_worker.py SCRIPT ARGS... | -m MODULE ARGS...")
    install()
    if argv[0] == "-m":
        # As `python -m`: sys.path[0] is the working directory; run_module puts the module's
        # file at sys.argv[0].
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
