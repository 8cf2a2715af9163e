"""Prints braid's build configuration and every BRAID_ setting.

    /usr/bin/python3 -m torch_braid.info
    /usr/bin/python3 -m torch_braid.info --settings-markdown > docs/settings.md
"""
import sys

import torch

import torch_braid


def print_network(out):
    """What a group across hosts would use from this process (Note [Choosing the interface])."""
    net = torch_braid._C.network_info()
    print("Network (groups across hosts):", file=out)
    ifs = ", ".join(f"{name} {host}" + (" (loopback)" if lo else "")
                    for name, host, lo in net["interfaces"])
    print(f"  interfaces      {ifs or 'none'}", file=out)
    listen = net["listen"]
    if "error" in listen:
        print(f"  would listen on nothing: {listen['error']}", file=out)
    else:
        print(f"  would listen on {listen['host']} ({listen['how']})", file=out)
    cc = net["system_congestion"]
    mine = listen.get("congestion")
    print(f"  TCP congestion  {mine + ' (BRAID_TCP_CONGESTION)' if mine else cc + ' (the system)'}"
          f"; allowed: {net['allowed_congestion']}", file=out)
    # Note [libcrypto at run time] (csrc/transport/tcp/auth.h): loaded, not linked.
    crypto = torch_braid._C.crypto_info()
    if crypto["loaded"]:
        print(f"  libcrypto       {crypto['path']} ({crypto['version'] or 'version unknown'}; "
              f"{crypto['how']})", file=out)
    else:
        print(f"  libcrypto       none: TCP groups will fail: {crypto['error']}", file=out)


def print_cores(out):
    """The cores ranks here may count on, and the spin policy that follows (Notes [Counting
    cores] and [How long to spin] in csrc/common/cpu_cores.h)."""
    cores = torch_braid._C.cores_info()
    print(f"  cores           {cores['describe']}", file=out)
    n = cores["cores"]
    # The two cases that differ: one rank per core, and one rank more than the cores.
    per_ranks = {ranks: torch_braid._C.cores_info(ranks) for ranks in sorted({n, n + 1})}
    for info in per_ranks.values():
        print(f"  spin policy     {info['policy']}", file=out)
    print("                  (BRAID_SHM_SPIN_US / BRAID_WORKER_SPIN_US set explicitly win)",
          file=out)
    # Note [Pinning ranks on a full host] (csrc/common/rank_pinning.h): bound from n + 1 on.
    for ranks, info in per_ranks.items():
        print(f"  pinning         {ranks} rank(s) here: {info['pinning']}", file=out)


def cuda_line(info):
    """CUDA tensors: which executors a group can choose, and what this machine has."""
    kernels = (f"GPU kernels built for {info.get('cuda_kernel_images', '?')}"
               if info.get("cuda_kernels") else "no GPU kernels (built without nvcc)")
    line = f"staged and NCCL executors, chosen per group (BRAID_CUDA_EXECUTOR); {kernels}"
    if not torch.cuda.is_available():
        return line + "; this torch or machine has no CUDA device"
    nccl = getattr(torch.cuda, "nccl", None)
    version = ".".join(map(str, nccl.version())) if nccl and hasattr(nccl, "version") else "?"
    return (line + f"; {torch.cuda.device_count()} device(s), CUDA {torch.version.cuda}, "
            f"torch's NCCL {version}")


def main(out=sys.stdout):
    info = torch_braid.build_info()
    print(f"braid {info['version']}", file=out)
    print(f"  torch           {torch.__version__} ({info['torch_api']})", file=out)
    print(f"  built against   torch {info['torch_version']}", file=out)
    print(f"  SIMD            {info['simd']}", file=out)
    print(f"  CUDA            {cuda_line(info)}", file=out)
    print(f"  transports      {', '.join(info['transports'])}", file=out)
    print(f"  compiler        {info.get('compiler', '?')}", file=out)
    # Note [One pybind11 per process] (CMakeLists.txt): the headers torch was built with.
    where = info.get("pybind11_include")
    print(f"  pybind11        {info.get('pybind11', '?')}" + (f" ({where})" if where else ""),
          file=out)
    print_cores(out)
    print("", file=out)
    print_network(out)
    print("", file=out)
    print("Settings (environment variables):", file=out)
    for s in torch_braid.settings():
        changed = "" if s["value"] == s["default"] else f"  (set: {s['value']})"
        print(f"  {s['name']} = {s['default']} [{s['type']}]{changed}", file=out)
        print(f"      {s['doc']}", file=out)


SETTINGS_MARKDOWN_COMMAND = "python -m torch_braid.info --settings-markdown > docs/settings.md"


def _cell(text):
    """One Markdown table cell. A '|' would end the cell and a newline the row; '<prefix>'
    would be read as an HTML tag and vanish; a lone '*' (eth*) could start emphasis."""
    text = " ".join(str(text).split())
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def settings_markdown(out=sys.stdout):
    """docs/settings.md: every setting's name, type, default and doc, from the same registry
    that main() prints (Note in csrc/common/settings.h: each setting is declared once, in the
    file that uses it). The file is generated rather than written so that it cannot drift from
    the code; tests/python/test_info.py fails when it differs from this output. Only defaults
    are printed, never this environment's values, so the output is the same on every machine."""
    print("# Settings", file=out)
    print("", file=out)
    print(f"Generated by `{SETTINGS_MARKDOWN_COMMAND}` from braid's settings registry; "
          "do not edit by hand.", file=out)
    print("", file=out)
    print("Every setting is an environment variable, read when a group is created (logging "
          "and the SIMD level: once per process). Settings that change the steps an op takes "
          "must be equal on every rank; ranks that differ fail with both values before any "
          "data moves. `python -m torch_braid.info` prints the same list with this "
          "environment's values. Variables that only the scripts read (`BRAID_PYTHON`, "
          "`BRAID_TEST_TIER`, ...) are described in [testing.md](testing.md).", file=out)
    print("", file=out)
    print("| setting | type | default | what it does |", file=out)
    print("|---|---|---|---|", file=out)
    for s in torch_braid.settings():
        # In a code span only '|' needs its escape (GFM tables); the others would show.
        code = " ".join(s["default"].split()).replace("|", "\\|")
        default = f"`{code}`" if code else "(empty)"
        print(f"| `{s['name']}` | {s['type']} | {default} | {_cell(s['doc'])} |", file=out)


if __name__ == "__main__":
    if sys.argv[1:] == ["--settings-markdown"]:
        settings_markdown()
    elif sys.argv[1:]:
        sys.exit("usage: python -m torch_braid.info [--settings-markdown]")
    else:
        main()
