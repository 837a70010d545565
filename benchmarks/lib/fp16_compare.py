"""Three executors of the same fp16 model, scored against fp32/fp64 eager: where do they disagree?

- `mil`:        the coremltools fp16 `.mlpackage` run by `anetts.mil` (every fp16 op widened to fp32,
                accumulated in fp32, rounded once);
- `coreai`:     the Core AI fp16 asset run by Apple's runtime (its Linux CPU runtime here);
- `torch_fp16`: the half-precision module run eagerly by torch on CPU;
- `torch_fp16_decomposed`: the *Core AI program* (torch.export + coreai-torch's decompositions)
                run by torch in fp16: Core AI's op graph under the MIL executor's arithmetic. If it
                scores like `mil`, the two programs are equivalent and the gap is Apple's arithmetic;
                if it scores like `coreai`, the gap is in the program (decomposition);
- `torch_fp16_decomposed_fp16acc`: the same, with mm/addmm/bmm accumulated in fp16 the way the op
                probe shows Apple's runtime does it: how much of the gap that one kernel explains.

`op_probe` isolates single ops at growing reduction lengths, so an executor that accumulates in
fp16 (error growing with the reduction length) is told apart from one that accumulates in fp32.
"""
from __future__ import annotations

import copy
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from anetts.compile.aimodel import _export, convert_module, run_asset
from anetts.metrics import compare
from anetts.tensors import FunctionSpec, TensorSpec


def _snr(ref, got) -> float:
    return round(compare(np.asarray(ref, np.float64), np.asarray(got, np.float64))["snr_db"], 2)


def _half_args(args):
    return tuple(a.half() if a.is_floating_point() else a for a in args)


def torch_fp16(wrapper, args) -> tuple:
    with torch.no_grad():
        out = copy.deepcopy(wrapper).half().eval()(*_half_args(args))
    return tuple(o.float() for o in (out if isinstance(out, tuple) else (out,)))


def torch_fp16_decomposed(wrapper, args) -> tuple:
    """Core AI's decomposed fp16 program, executed by torch."""
    ep, hargs = _export(wrapper, args, "fp16")
    with torch.no_grad():
        out = ep.module()(*hargs)
    return tuple(o.float() for o in (out if isinstance(out, tuple) else (out,)))


def _mm_fp16_acc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (..., M, K) x (..., K, N) in half: each product rounded, summed left to right in fp16."""
    acc = torch.zeros(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), dtype=torch.float16)
    for k in range(a.shape[-1]):
        acc = acc + a[..., :, k:k + 1] * b[..., k:k + 1, :]  # half ops on CPU: fp32 compute, one rounding
    return acc


def _conv_transpose1d_fp16_acc(x, w, bias, stride, padding, output_padding) -> torch.Tensor:
    """conv_transpose1d in half: each product rounded, accumulated in fp16, input channels outermost
    and kernel taps inner (the order that matches Apple's runtime in the op probe)."""
    n, cin, length = x.shape
    _, cout, k = w.shape
    full = torch.zeros(n, cout, (length - 1) * stride + k + output_padding, dtype=torch.float16)
    pos = torch.arange(length) * stride
    for ci in range(cin):
        for tap in range(k):
            prod = x[:, ci:ci + 1, :] * w[ci, :, tap][None, :, None]  # (n, cout, length), rounded
            full[:, :, pos + tap] = full[:, :, pos + tap] + prod
    out = full[:, :, padding:full.shape[-1] - padding]
    return out if bias is None else out + bias[None, :, None]


class _FP16Accumulation(torch.utils._python_dispatch.TorchDispatchMode):
    """Runs fp16 mm/addmm/bmm (and, with `conv_transpose`, 1-D transposed convolutions) with an fp16
    accumulator, the arithmetic the op probe finds in Apple's Linux runtime."""

    def __init__(self, conv_transpose: bool = False):
        super().__init__()
        self.conv_transpose = conv_transpose

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func in (aten.mm.default, aten.bmm.default) and args[0].dtype == torch.float16:
            return _mm_fp16_acc(args[0], args[1])
        if func is aten.addmm.default and args[1].dtype == torch.float16 and not kwargs:
            return args[0] + _mm_fp16_acc(args[1], args[2])
        if (self.conv_transpose and func is aten.convolution.default and args[0].dtype == torch.float16
                and args[6] and args[0].dim() == 3 and args[8] == 1 and list(args[5]) == [1]):
            return _conv_transpose1d_fp16_acc(args[0], args[1], args[2], args[3][0], args[4][0], args[7][0])
        return func(*args, **kwargs)


def torch_fp16_decomposed_fp16acc(wrapper, args, conv_transpose: bool = False) -> tuple:
    """Core AI's decomposed fp16 program run by torch, its matrix products (and optionally its
    transposed convolutions) accumulated in fp16."""
    ep, hargs = _export(wrapper, args, "fp16")
    with torch.no_grad(), _FP16Accumulation(conv_transpose):
        out = ep.module()(*hargs)
    return tuple(o.float() for o in (out if isinstance(out, tuple) else (out,)))


def mlpackage_fp16(wrapper, args, spec: FunctionSpec, workdir: Path):
    """coremltools fp16 conversion of the traced wrapper (fp32 I/O), run by the MIL executor."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct

        from anetts.mil import load_program

        traced = torch.jit.trace(wrapper.eval(), args, check_trace=False)
        ml = ct.convert(traced, inputs=[ct.TensorType(name=t.name, shape=t.shape, dtype=t.np_dtype) for t in spec.inputs],
                        outputs=[ct.TensorType(name=t.name, dtype=t.np_dtype) for t in spec.outputs],
                        convert_to="mlprogram", compute_precision=ct.precision.FLOAT16,
                        minimum_deployment_target=ct.target.macOS14)
    pkg = Path(workdir) / f"{spec.name}.mlpackage"
    ml.save(str(pkg))
    out = load_program(pkg).run({t.name: a.numpy() for t, a in zip(spec.inputs, args)})
    return tuple(np.asarray(out[t.name], np.float32) for t in spec.outputs)


def aimodel_fp16(wrapper, args, spec: FunctionSpec, workdir: Path):
    inputs = {t.name: a.numpy() for t, a in zip(spec.inputs, args)}
    asset = Path(workdir) / f"{spec.name}.aimodel"
    convert_module(wrapper, inputs, spec, "probe", spec.name, {}, asset, asset.with_suffix(".json"), "fp16",
                   {"model": "probe"}, function="main")
    out = run_asset(asset, inputs, "main")
    return tuple(out[t.name] for t in spec.outputs)


def compare_executors(wrapper, args: tuple, spec: FunctionSpec, reference: tuple, regions=None,
                      executors=("mil", "coreai", "torch_fp16", "torch_fp16_decomposed")) -> dict:
    """Worst-output SNR (dB) and seconds per executor; `reference` are fp32 (or fp64) outputs."""
    regions = regions or {}

    def valid(name, a):
        a = np.asarray(a)
        r = regions.get(name)
        return a if r is None else np.take(a, np.arange(r[1]), axis=r[0])

    results = {}
    with tempfile.TemporaryDirectory(prefix="anetts-fp16-") as tmp:
        runners = {"mil": lambda: mlpackage_fp16(wrapper, args, spec, Path(tmp)),
                   "coreai": lambda: aimodel_fp16(wrapper, args, spec, Path(tmp)),
                   "torch_fp16": lambda: torch_fp16(wrapper, args),
                   "torch_fp16_decomposed": lambda: torch_fp16_decomposed(wrapper, args),
                   "torch_fp16_decomposed_fp16acc": lambda: torch_fp16_decomposed_fp16acc(wrapper, args),
                   "torch_fp16_decomposed_fp16acc_convt": lambda: torch_fp16_decomposed_fp16acc(wrapper, args, True)}
        for name in executors:
            t0 = time.perf_counter()
            try:
                outs = runners[name]()
            except Exception as e:  # an executor that cannot run this model is a result, not a crash
                results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            per = {}
            for t, o, r in zip(spec.outputs, outs, reference):
                if t.dtype == "int32":
                    continue
                per[t.name] = _snr(valid(t.name, np.asarray(r)), valid(t.name, np.asarray(o).reshape(np.shape(r))))
            results[name] = {"snr_db": per, "worst_snr_db": min(per.values()) if per else None,
                             "seconds": round(time.perf_counter() - t0, 2)}
    return results


# -- single-op probe -------------------------------------------------------------------------------
class _Op(torch.nn.Module):
    def __init__(self, fn, params: dict | None = None):
        super().__init__()
        self.fn = fn
        for k, v in (params or {}).items():
            self.register_buffer(k, v)

    def forward(self, x):
        return self.fn(self, x)


def _cases(rng: torch.Generator):
    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=rng) * scale

    cases = []
    for k in (64, 512, 4096):
        w = rnd(64, k, scale=k ** -0.5)
        cases.append((f"linear K={k}", _Op(lambda m, x: torch.nn.functional.linear(x, m.w), {"w": w}), rnd(1, 32, k)))
    for cin in (32, 256, 1024):
        w = rnd(64, cin, 7, scale=(cin * 7) ** -0.5)
        cases.append((f"conv1d Cin·k={cin * 7}", _Op(lambda m, x: torch.nn.functional.conv1d(x, m.w, padding=3), {"w": w}),
                      rnd(1, cin, 128)))
    for n in (256, 4096, 65536):
        # a positive-mean signal: a sum whose magnitude grows, where fp16 accumulation loses the most
        cases.append((f"mean N={n}", _Op(lambda m, x: x.mean(dim=-1, keepdim=True)), rnd(1, 8, n) + 1.0))
    cases.append(("instance_norm C=64 T=4096",
                  _Op(lambda m, x: torch.nn.functional.instance_norm(x, eps=1e-5)), rnd(1, 64, 4096, scale=3.0) + 2.0))
    cases.append(("layer_norm C=512", _Op(lambda m, x: torch.nn.functional.layer_norm(x, (512,), eps=1e-5)),
                  rnd(1, 64, 512) + 1.0))
    cases.append(("sin |x|≤1000", _Op(lambda m, x: torch.sin(x)), rnd(1, 1, 8192, scale=300.0).clamp(-1000, 1000)))
    cases.append(("exp", _Op(lambda m, x: torch.exp(x)), rnd(1, 1, 8192, scale=2.0)))
    cases.append(("tanh", _Op(lambda m, x: torch.tanh(x)), rnd(1, 1, 8192, scale=2.0)))
    cases.append(("snake x+sin²(ax)/a", _Op(lambda m, x: x + torch.sin(m.a * x) ** 2 / m.a, {"a": torch.full((1, 64, 1), 1.3)}),
                  rnd(1, 64, 512, scale=2.0)))
    wt = rnd(64, 32, 20, scale=(64 * 20) ** -0.5)
    cases.append(("conv_transpose1d s=5 Cin=64", _Op(lambda m, x: torch.nn.functional.conv_transpose1d(x, m.w, stride=5), {"w": wt}),
                  rnd(1, 64, 256)))
    lstm = torch.nn.LSTM(64, 64, batch_first=True)
    with torch.no_grad():
        for p in lstm.parameters():
            p.copy_(torch.randn(p.shape, generator=rng) * 0.15)
    cases.append(("lstm H=64 T=64", _LSTM(lstm), rnd(1, 64, 64)))
    return cases


class _LSTM(torch.nn.Module):
    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x):
        return self.lstm(x)[0]


def fp16_accumulate_linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T with fp16 products summed left to right in an fp16 accumulator (rounded after each add)."""
    x16, w16 = x.astype(np.float16), w.astype(np.float16)
    acc = np.zeros(x.shape[:-1] + (w.shape[0],), np.float16)
    for k in range(x.shape[-1]):
        prod = (x16[..., k:k + 1].astype(np.float32) * w16[:, k].astype(np.float32)).astype(np.float16)
        acc = (acc.astype(np.float32) + prod.astype(np.float32)).astype(np.float16)
    return acc.astype(np.float32)


def fp16_accumulate_mean(x: np.ndarray) -> np.ndarray:
    acc = np.zeros(x.shape[:-1] + (1,), np.float16)
    for k in range(x.shape[-1]):
        acc = (acc.astype(np.float32) + x[..., k:k + 1].astype(np.float16).astype(np.float32)).astype(np.float16)
    return (acc.astype(np.float32) / np.float32(x.shape[-1])).astype(np.float16).astype(np.float32)


def _emulation(label: str, module, x: torch.Tensor):
    """The op computed with an fp16 accumulator, where the probe has such a model (else None)."""
    if label.startswith("linear"):
        return fp16_accumulate_linear(x.numpy(), module.w.numpy())
    if label.startswith("mean"):
        return fp16_accumulate_mean(x.numpy())
    return None


def op_probe(seed: int = 0, names: list[str] | None = None, executors=("mil", "coreai", "torch_fp16")) -> list[dict]:
    """SNR vs fp64 eager of each single-op module under each fp16 executor."""
    rng = torch.Generator().manual_seed(seed)
    rows = []
    for label, module, x in _cases(rng):
        if names and not any(label.startswith(n) for n in names):
            continue
        module = module.eval()
        # inputs are rounded to fp16 first, so every executor sees the same values and the
        # scores measure the op's arithmetic, not the input cast
        x = x.half().float()
        with torch.no_grad():
            ref = copy.deepcopy(module).double()(x.double())
            out_shape = tuple(module(x).shape)
        spec = FunctionSpec("probe", (TensorSpec("x", tuple(x.shape), "float32", ""),),
                            (TensorSpec("y", out_shape, "float32", ""),))
        res = compare_executors(module, (x,), spec, (ref.numpy(),), executors=executors)
        row = {"op": label, **{k: v.get("worst_snr_db", v.get("error")) for k, v in res.items()}}
        emulated = _emulation(label, module, x)
        if emulated is not None:
            row["fp16_accumulator_model"] = _snr(ref.numpy(), emulated)
        rows.append(row)
    return rows
