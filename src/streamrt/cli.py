"""The ``streamrt`` command: ``demo``, ``bench``, ``info`` (``info --ops``: the operators)."""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

from . import __version__, bench, demos, ops, sanitizer, views
from .backends import BACKENDS, get_backend
from .backends.cpu import delay_us
from .demos import SECTION_NAMES
from .device import Device
from .emu.build import unavailable as emu_unavailable
from .errors import BackendUnavailableError, StreamRTError
from .ops.docs import summary
from .sync import launch_blocking
from .trace import trace


def _ops() -> int:
    """``streamrt info --ops``: every operator, its slots, attributes, dtypes and workspace."""
    print(f"operators ({len(ops.OPS)}); help(ops.NAME) shows one in full")
    print("  phase 1: ws_size, ex = ops.NAME.get_workspace_size(*tensors, **attrs)")
    print("  phase 2: ops.NAME(workspace, ws_size, ex, stream)")
    print("  both:    ops.run(ops.NAME, *tensors, stream=s, **attrs)")
    for op in ops.OPS.values():
        for line in summary(op):
            print(f"  {line}")
    return 0


def _info(args: argparse.Namespace) -> int:
    if args.ops:
        return _ops()
    print(f"streamrt {__version__}  (Python {platform.python_version()}, numpy {np.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} cores)")
    print("backends:")
    for name in BACKENDS:
        try:
            count = get_backend(name).device_count()
            print(f"  {name:5s} available, {count} device(s)")
        except BackendUnavailableError as exc:
            print(f"  {name:5s} unavailable: {exc}")
            count = 0
        for i in range(count):
            dev = Device(f"{name}:{i}")
            free, total = dev.memory_info()
            model = dev._impl.model  # cuda: the GPU's name and architecture
            what = f"{model} ({dev._impl.arch}), " if model else ""
            print(f"    {dev.name}  {what}memory {total / 2**30:.1f} GiB total, "
                  f"{free / 2**30:.1f} GiB free")
    why = emu_unavailable()  # (one g++ run, at most, per process)
    print(f"CUDA C kernels on cpu (the emulator): {'yes, with g++' if why is None else 'no: ' + why}")
    print("settings:")
    env = {
        "STREAMRT_DEVICE": "backend of Device(None)",
        "STREAMRT_CPU_DEVICES": "number of cpu devices (default 2)",
        "STREAMRT_CPU_MEMORY": "bytes per cpu device (default: physical RAM)",
        "STREAMRT_CPU_DELAY_US": "random worker delay before each op, for ordering tests",
        "STREAMRT_LAUNCH_BLOCKING": "every enqueue synchronous",
        "STREAMRT_CACHE_DIR": "NVRTC kernel cache root (default ~/.cache/streamrt)",
        "STREAMRT_EMU_CACHE": "the CUDA C emulator's build cache (default STREAMRT_CACHE_DIR/emu)",
        "STREAMRT_EMU_ORDER": "emulated threads' order: forward reverse ahead behind random:SEED",
        "STREAMRT_OPS_CUDA_C": "1: the operators run their CUDA C kernels on cpu (ops.use_cuda_c)",
        "STREAMRT_SANITIZE": "1/raise or collect: the sanitizer on from the start",
        "STREAMRT_TRACE": "path of a Chrome/Perfetto trace written at exit",
        "STREAMRT_OPS_LOG": "1: log every operator plan (logger streamrt.ops)",
        "STREAMRT_PURE_PYTHON": "1: kernel views in Python, not the C view cache (views.py)",
    }
    for k, what in env.items():
        print(f"  {k:26s} = {os.environ.get(k, '(unset)'):10s} {what}")

    print(f"  in effect: launch blocking {launch_blocking()}, cpu delay {delay_us()} us, "
          f"sanitizer {'on' if sanitizer.enabled() else 'off'}, kernel views in "
          f"{'C' if views.compiled is not None else 'Python'}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    try:
        Device(args.device)
    except StreamRTError as exc:
        print(f"streamrt demo: {exc}", file=sys.stderr)
        return 2
    if args.trace:
        with trace(args.trace):
            failed = demos.run(args.device, args.only)
        print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev or "
              "chrome://tracing)")
        return 1 if failed else 0
    return 1 if demos.run(args.device, args.only) else 0


def _bench(args: argparse.Namespace) -> int:
    return bench.run_all(quick=args.quick, json_path=args.json, markdown_path=args.markdown,
                         only=args.only, runs=args.runs)


def _positive(text: str) -> int:
    """``--runs``: a positive count."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return int(text)


def _device_spec(text: str) -> str | int:
    """``--device``: an index on the current backend (as ``srt.Device(1)``) or a name."""
    return int(text) if text.isdigit() else text


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``streamrt`` console script."""

    ap = argparse.ArgumentParser(prog="streamrt", description="stream-ordered runtime: demo, "
                                 "benchmarks and environment information")
    ap.add_argument("--version", action="version", version=f"streamrt {__version__}")
    # not required=True: argparse would then answer "streamrt --bogus" with "the following
    # arguments are required: cmd" instead of naming the flag it does not know
    sub = ap.add_subparsers(dest="cmd", metavar="{demo,bench,info}")
    d = sub.add_parser("demo", help="run the seed scenarios and print what happened")
    d.add_argument("--device", default=None, type=_device_spec,
                   help="device to run on, e.g. cpu:0 or 1 (default: current)")
    d.add_argument("--only", choices=SECTION_NAMES, help="run one section only")
    d.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the demo")
    d.set_defaults(fn=_demo)
    b = sub.add_parser("bench", help="run the benchmarks against their peers")
    b.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    b.add_argument("--json", metavar="FILE", help="write the results as JSON")
    b.add_argument("--markdown", metavar="FILE", help="write the results as a Markdown table")
    b.add_argument("--only", action="append", choices=bench.ORDER, metavar="NAME",
                   help=f"run only this benchmark (repeatable): {', '.join(bench.ORDER)}")
    b.add_argument("--runs", type=_positive, default=1, metavar="N",
                   help="repeat the whole set N times: medians, ranges, pass in every run")
    b.set_defaults(fn=_bench)
    i = sub.add_parser("info", help="versions, backends, devices, settings")
    i.add_argument("--ops", action="store_true",
                   help="list the operators instead: inputs -> outputs, attributes with their "
                        "defaults, dtypes, workspace")
    i.set_defaults(fn=_info)
    args, extra = ap.parse_known_args(argv)
    if extra:  # with the usage of the command they were given to
        ({"demo": d, "bench": b, "info": i}.get(args.cmd) or ap).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd is None:
        ap.error("a command is required: demo, bench or info")

    try:
        return args.fn(args)
    except StreamRTError as exc:  # a bad setting or device: its message, not a traceback
        print(f"streamrt {args.cmd}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
