"""``run-mil``: run an .mlpackage's ML Program on Linux with the reference executor.

    run-mil PKG --inputs x.npz [--function NAME] [-o out.npz] [--list] [--time N]

Prints each output's name, shape, dtype and a few statistics (min / max / mean /
RMS, count of NaN and inf); ``-o`` writes the outputs to an .npz file.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from anetts.artifacts import atomic_file


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run-mil",
        description="Run the ML Program of an .mlpackage op by op with torch (CPU, fp16-faithful).",
    )
    p.add_argument("package", help="path to the .mlpackage")
    p.add_argument("--inputs", "-i", help=".npz file with one array per function input")
    p.add_argument("--function", "-f", default=None, help="function to run (default: the package's default)")
    p.add_argument("--output", "-o", default=None, help="write the outputs to this .npz file")
    p.add_argument("--list", action="store_true", help="print functions, inputs and op counts, then exit")
    p.add_argument("--time", type=int, default=0, metavar="N", help="also time N extra runs")
    return p


def _stats(a: np.ndarray) -> str:
    if a.size == 0:
        return "empty"
    if a.dtype == np.bool_:
        return f"true={int(a.sum())}/{a.size}"
    f = a.astype(np.float64)
    finite = np.isfinite(f)
    nan, inf = int(np.isnan(f).sum()), int(np.isinf(f).sum())
    fin = f[finite]
    if fin.size == 0:
        return f"nan={nan} inf={inf}"
    parts = [
        f"min={fin.min():.6g}",
        f"max={fin.max():.6g}",
        f"mean={fin.mean():.6g}",
        f"rms={np.sqrt(np.mean(fin**2)):.6g}",
    ]
    if nan or inf:
        parts.append(f"nan={nan} inf={inf}")
    return " ".join(parts)


def _describe(prog, function: str | None) -> None:
    for name in prog.function_names:
        if function is not None and name != function:
            continue
        mark = " (default)" if name == prog.default_function else ""
        print(f"function {name}{mark}")
        for s in prog.input_specs(name):
            shape = "?" if s.shape is None else "x".join("?" if d is None else str(d) for d in s.shape)
            print(f"  input  {s.name}: {s.mil_dtype} [{shape}]")
        for n, dt in prog.output_dtypes(name).items():
            print(f"  output {n}: {dt}")
        for st in prog.state_specs(name):
            print(f"  state  {st.name}: {st.mil_dtype} [{'x'.join(str(d) for d in st.shape)}]")
        ops = prog.op_types(name)
        print(f"  {sum(ops.values())} ops: " + ", ".join(f"{k}={v}" for k, v in ops.items()))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .errors import MilError
    from .program import load_program

    try:
        prog = load_program(args.package)
        if args.list:
            _describe(prog, args.function)
            return 0
        if not args.inputs:
            print("run-mil: --inputs is required (or use --list)", file=sys.stderr)
            return 2
        with np.load(args.inputs, allow_pickle=False) as npz:
            inputs = {k: npz[k] for k in npz.files}
        # a NaN fed to an int cast comes out as -2**31 (pred_dur=-2147483648), not as an error
        nonfinite = [k for k, a in inputs.items() if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all()]
        if nonfinite:
            print(f"run-mil: {args.inputs}: non-finite values (NaN or inf) in input(s) {', '.join(nonfinite)}",
                  file=sys.stderr)
            return 1
        # a stateful function runs once from zero-filled states (Core ML's makeState());
        # sequences of calls with a carried state are anetts.verify.scenario's job
        stateful = bool(prog.state_specs(args.function))
        t0 = time.perf_counter()
        outputs = prog.run(inputs, args.function, state=prog.make_state(args.function) if stateful else None)
        elapsed = time.perf_counter() - t0
    except MilError as exc:
        print(f"run-mil: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"run-mil: {exc}", file=sys.stderr)
        return 1
    fname = args.function or prog.default_function
    print(f"{args.package} [{fname}]: {len(outputs)} output(s) in {elapsed * 1000:.1f} ms")
    for name, arr in outputs.items():
        print(f"  {name}: shape={tuple(arr.shape)} dtype={arr.dtype} {_stats(arr)}")
    if args.time > 0:
        times = []
        for _ in range(args.time):
            t0 = time.perf_counter()
            prog.run(inputs, args.function, state=prog.make_state(args.function) if stateful else None)
            times.append(time.perf_counter() - t0)
        print(f"  time over {args.time} runs: min {min(times) * 1000:.1f} ms, median {np.median(times) * 1000:.1f} ms")
    if args.output:
        out = Path(args.output)
        try:
            with atomic_file(out) as tmp:
                np.savez(tmp, **outputs)
        except OSError as exc:
            print(f"run-mil: cannot write {out}: {exc}", file=sys.stderr)
            return 1
        print(f"  wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
