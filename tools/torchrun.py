"""torchrun, made to work with Debian's torch builds. See tools/torchrun.

Debian's torch 2.x is built without libuv, but its torchrun creates its
rendezvous TCPStore with the default use_libuv=True and fails ("use_libuv was
requested but PyTorch was build without libuv support"); USE_LIBUV=0 only
reaches init_process_group. Where libuv is missing, this sets USE_LIBUV=0
for the workers and makes torchrun's own stores skip libuv, then runs
torchrun unchanged.
"""
import os

import torch.distributed as dist


def _libuv_missing():
    try:
        dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
        return False
    except TypeError:  # torch 1.x: no libuv option at all
        return False
    except RuntimeError as e:
        return "libuv" in str(e)


def _patch_tcp_store():
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


if os.environ.get("USE_LIBUV") == "0" or _libuv_missing():
    os.environ["USE_LIBUV"] = "0"
    _patch_tcp_store()

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    main()
