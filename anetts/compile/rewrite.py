"""Linear → Conv rewrite as a MIL graph pass that runs inside ``ct.convert``.

Why a MIL pass and not a torch-side module swap (an earlier port did it with a load-state-dict
pre-hook):

* the torch model and the upstream checkpoints stay untouched, so parity tests against
  upstream keep testing upstream code;
* the weight reshape [Cout, Cin] → [Cout, Cin, 1] / [Cout, Cin, 1, 1] is an exact const
  reshape (same numbers, same dtype), so the rewritten op computes the same dot products;
* it applies to every stage (and every nested block) without editing stage code;
* it is verifiable on the saved program: the op histogram must show zero ``linear``.

Where in the pipeline: the pass is inserted into coremltools' default pass pipeline right
after ``common::compose_conv1d``.  That point is

* after ``fuse_matmul_weight_bias`` / ``fuse_linear_bias``, the only default passes that
  *create* ``linear`` ops (from matmul + add), so nothing re-introduces a ``linear`` later;
* after ``compose_conv1d``, which would otherwise fold the conv2d variant's
  ``expand_dims → conv → squeeze`` straight back into a rank-3 conv;
* before ``reduce_transposes`` (cancels the transpose pairs the rank-3 layout change adds
  between consecutive rewritten ops), the conv bias/scale fusions, and before
  ``add_fp16_cast``: the pass itself is dtype-preserving (the reshaped weight keeps the
  dtype of the linear's weight) and at that point the program is still fp32; the fp16 cast
  pass then treats the new ``conv`` like any other conv, and ``const_elimination`` folds the
  weight cast so the saved weights are fp16 exactly as for the original ``linear``.

Layouts (x is the linear's input, C = Cin on the last axis):

* rank 1 ``(C,)``          → reshape ``(1, C, 1[, 1])``      → conv → reshape ``(Cout,)``
* rank 2 ``(N, C)``        → expand_dims ``(N, C, 1[, 1])``   → conv → squeeze → ``(N, Cout)``
  (the 48 AdaIN ``fc`` layers act on the style vector (1, 128))
* rank 3 ``(B, T, C)``     → transpose ``(B, C, T)`` [→ expand_dims ``(B, C, 1, T)``, Apple's
  BC1S layout] → conv → [squeeze →] transpose back
* rank ≥4 (static shapes) → reshape to ``(prod(lead), T, C)`` and as rank 3, reshape back.

Only ``linear`` ops whose weight (and bias, if any) are compile-time constants are rewritten;
MIL ``conv`` needs a const weight.  Others are left alone and reported (the default pipeline's
``expand_dynamic_linear`` turns them into ``matmul`` anyway).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from anetts.compile.spec_walk import program_ops

LINEAR_VARIANTS = ("none", "auto", "conv1d", "conv2d")
# `auto` (the default of every stage): conv1d wherever the program has linear ops, and no error for a
# program without any; an explicit conv1d/conv2d that matches nothing is a configuration error.
AUTO_VARIANT = "conv1d"
PASS_NAME = "anetts::linear_to_conv"
INSERT_AFTER = "common::compose_conv1d"


class RewriteError(RuntimeError):
    pass


@dataclass
class RewriteStats:
    """What one run of the pass did.  Filled in by the pass; read it after ``ct.convert``."""

    variant: str = "none"
    rewritten: int = 0
    skipped: list[str] = field(default_factory=list)  # "op_name: reason"
    by_rank: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"variant": self.variant, "rewritten": self.rewritten,
                "by_input_rank": {str(k): v for k, v in sorted(self.by_rank.items())},
                "skipped": list(self.skipped)}


def _check_variant(variant: str) -> None:
    if variant not in LINEAR_VARIANTS:
        raise RewriteError(f"unknown linear rewrite variant {variant!r}; choose one of {LINEAR_VARIANTS}")


def _mil():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from coremltools.converters.mil.mil import Builder as mb
        from coremltools.converters.mil.mil.passes.helper import block_context_manager
        from coremltools.converters.mil.mil.types.symbolic import is_symbolic
    return mb, block_context_manager, is_symbolic


# --------------------------------------------------------------------------------------------
# the rewrite on a pymil Program


def rewrite_linear_ops(prog, variant: str, stats: RewriteStats | None = None) -> int:
    """Replace every const-weight ``linear`` op of every function (nested blocks included) of a
    pymil ``Program`` with an exactly equivalent ``conv``.  Returns the number rewritten.

    Dead weights are left for dead-code elimination (the convert pipeline runs it; a caller
    working on a standalone Program can run ``PASS_REGISTRY["common::dead_code_elimination"]``).
    """
    _check_variant(variant)
    stats = stats if stats is not None else RewriteStats()
    stats.variant = variant
    if variant == "none":
        return 0
    mb, block_context_manager, is_symbolic = _mil()
    nd = 1 if variant == "conv1d" else 2

    @block_context_manager
    def rewrite_block(block) -> int:
        n = 0
        for op in list(block.operations):
            for nested in op.blocks:
                n += rewrite_block(nested)
            if op.op_type == "linear":
                reason = _rewrite_one(op, block, nd, mb, is_symbolic)
                if reason is None:
                    n += 1
                    stats.by_rank[op.x.rank] = stats.by_rank.get(op.x.rank, 0) + 1
                else:
                    stats.skipped.append(f"{op.name}: {reason}")
        return n

    count = 0
    for fn in prog.functions.values():
        count += rewrite_block(fn)
    stats.rewritten += count
    return count


def _rewrite_one(op, block, nd: int, mb, is_symbolic) -> str | None:
    """Rewrite one linear op in place; return None on success or the reason it was skipped."""
    x = op.x
    w = op.weight.val
    if w is None:
        return "weight is not a compile-time constant"
    b = None
    if op.bias is not None:
        b = op.bias.val
        if b is None:
            return "bias is not a compile-time constant"
    w = np.asarray(w)
    if w.ndim != 2:
        return f"weight rank {w.ndim} != 2"
    cout, cin = (int(d) for d in w.shape)
    rank = x.rank
    if rank < 1:
        return "scalar input"
    shape = list(x.shape)
    if is_symbolic(shape[-1]) or int(shape[-1]) != cin:
        return f"input feature axis {shape[-1]} does not match weight {list(w.shape)}"
    wconv = w.reshape(cout, cin, *([1] * nd))  # exact: same values, same dtype
    if b is not None:
        b = np.asarray(b).reshape(cout)
    conv_kw = dict(strides=[1] * nd, dilations=[1] * nd, pad_type="valid", groups=1)
    name = op.name
    out_var = op.outputs[0]

    # the reshaped weight keeps the linear weight's name as its prefix, so settings that name a
    # weight (a variant's exclude_op_names, a stage's uncompressed_weights) still find it
    weight = mb.const(val=wconv, name=f"{op.weight.name}_conv_{name}", before_op=op)

    def conv(v, final_name=None):
        kw = dict(x=v, weight=weight, **conv_kw, before_op=op)
        if b is not None:
            kw["bias"] = b
        if final_name:
            kw["name"] = final_name
        return mb.conv(**kw)

    spatial = list(range(2, 2 + nd))  # the singleton / length axes after the channel axis
    if rank == 1:
        y = mb.reshape(x=x, shape=[1, cin] + [1] * nd, before_op=op)
        y = conv(y)
        y = mb.reshape(x=y, shape=[cout], before_op=op, name=name)
    elif rank == 2:
        y = mb.expand_dims(x=x, axes=spatial, before_op=op)
        y = conv(y)
        y = mb.squeeze(x=y, axes=spatial, before_op=op, name=name)
    else:
        lead = shape[:-1]
        if rank > 3:
            if any(is_symbolic(d) for d in lead):
                return f"rank-{rank} input with symbolic leading dims {shape}"
            flat = int(np.prod([int(d) for d in lead[:-1]]))
            x3 = mb.reshape(x=x, shape=[flat, int(lead[-1]), cin], before_op=op)
        else:
            x3 = x
        y = mb.transpose(x=x3, perm=[0, 2, 1], before_op=op)  # (B, C, T)
        if nd == 2:
            y = mb.expand_dims(x=y, axes=[2], before_op=op)  # (B, C, 1, T)
            y = conv(y)
            y = mb.squeeze(x=y, axes=[2], before_op=op)
        else:
            y = conv(y)
        if rank > 3:
            y = mb.transpose(x=y, perm=[0, 2, 1], before_op=op)
            y = mb.reshape(x=y, shape=[int(d) for d in lead] + [cout], before_op=op, name=name)
        else:
            y = mb.transpose(x=y, perm=[0, 2, 1], before_op=op, name=name)
    if y.dtype != out_var.dtype:  # pragma: no cover - conv keeps x's dtype, as linear does
        raise RewriteError(f"{name}: rewrite changed dtype {out_var.dtype} -> {y.dtype}")
    block.replace_uses_of_var_after_op(anchor_op=op, old_var=out_var, new_var=y)
    block.remove_ops([op])
    return None


# --------------------------------------------------------------------------------------------
# the registered graph pass and the convert-time integration

_registered = False


def register() -> str:
    """Register the graph pass with coremltools (idempotent); returns its pass name."""
    global _registered
    if _registered:
        return PASS_NAME
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
        from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY, register_pass

    if PASS_NAME not in PASS_REGISTRY:
        @register_pass(namespace="anetts", name="linear_to_conv")
        class linear_to_conv(AbstractGraphPass):  # noqa: N801 (coremltools naming)
            """Options: ``variant`` (one of LINEAR_VARIANTS) and ``stats`` (a RewriteStats)."""

            def __init__(self):
                self.variant = "conv2d"
                self.stats = None

            def apply(self, prog):
                rewrite_linear_ops(prog, self.variant, self.stats)

    _registered = True
    return PASS_NAME


def make_pass_pipeline(variant: str, stats: RewriteStats | None = None):
    """The default ``ct.PassPipeline`` with the linear→conv pass inserted (see module doc).

    Returns None for ``variant == "none"`` (``ct.convert``'s own default pipeline is used).
    ``ct.convert`` still removes the fp16-cast passes itself for FLOAT32 precision.
    """
    _check_variant(variant)
    if variant == "none":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    name = register()
    pipeline = ct.PassPipeline.DEFAULT
    passes = list(pipeline.passes)
    at = passes.index(INSERT_AFTER) + 1
    pipeline.insert_pass(at, name)
    pipeline.set_options(name, {"variant": AUTO_VARIANT if variant == "auto" else variant,
                                "stats": stats if stats is not None else RewriteStats()})
    return pipeline


class LinearRewrite:
    """The convert-time integration: one object per ``ct.convert`` call.

    Usage in ``convert_function``::

        rw = LinearRewrite(variant, where=f"{spec.stage}/{spec.bucket}")
        mlmodel = ct.convert(..., pass_pipeline=rw.pass_pipeline())
        rw.check(mlmodel)                      # RewriteError if nothing matched / linear left
        report["linear_rewrite"] = rw.report()
    """

    def __init__(self, variant: str, where: str = ""):
        _check_variant(variant)
        self.variant = variant
        self.where = where
        self.stats = RewriteStats(variant=variant)
        self.remaining = None

    def pass_pipeline(self):
        return make_pass_pipeline(self.variant, self.stats)

    def check(self, mlmodel_or_package) -> None:
        """Raise RewriteError when the variant matched nothing or a ``linear`` op survived."""
        if self.variant == "none":
            return
        where = f" in {self.where}" if self.where else ""
        if self.stats.rewritten == 0 and self.variant == "auto":
            self.remaining = count_linear(mlmodel_or_package)
            if not self.remaining:
                return  # a program without linear ops: nothing to rewrite
        elif self.stats.rewritten == 0:
            extra = f" ({len(self.stats.skipped)} skipped: {self.stats.skipped[:3]})" if self.stats.skipped else ""
            raise RewriteError(f"linear rewrite {self.variant!r} matched no linear op{where}{extra}; "
                               f"set the variant to 'none' for this stage or fix the graph")
        else:
            self.remaining = count_linear(mlmodel_or_package)
        if self.remaining:
            raise RewriteError(f"{self.remaining} linear op(s) survived the {self.variant!r} rewrite{where}: "
                               f"{self.stats.skipped[:5]}")

    def report(self) -> dict:
        return {**self.stats.as_dict(), "where": self.where, "linear_remaining": self.remaining}


def count_linear(mlmodel_or_package) -> int:
    """Number of ``linear`` ops in a converted MLModel (via its spec) or a saved .mlpackage."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    if isinstance(mlmodel_or_package, ct.models.MLModel):
        spec = mlmodel_or_package.get_spec()
    else:
        spec = ct.utils.load_spec(str(mlmodel_or_package))
    return sum(op.type == "linear" for _, op in program_ops(spec))


def convert_with_rewrite(model, variant: str, where: str = "", **convert_kwargs):
    """``ct.convert(model, pass_pipeline=…, **convert_kwargs)`` with the rewrite; returns
    ``(mlmodel, report)``.  Raises RewriteError per :meth:`LinearRewrite.check`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    if "pass_pipeline" in convert_kwargs:
        raise RewriteError("convert_with_rewrite builds the pass pipeline itself")
    rw = LinearRewrite(variant, where=where)
    pipeline = rw.pass_pipeline()
    if pipeline is not None:
        convert_kwargs["pass_pipeline"] = pipeline
    mlmodel = ct.convert(model, **convert_kwargs)
    rw.check(mlmodel)
    return mlmodel, rw.report()


# --------------------------------------------------------------------------------------------
# post-hoc rewrite of an already saved package (manual checks, A/B packages without re-tracing)


def rewrite_package(src, dst, variant: str, where: str = "") -> dict:
    """Rewrite the ``linear`` ops of a saved single- or multi-function .mlpackage into ``dst``.

    The program is loaded into pymil (``milproto.load``), rewritten, cleaned up (DCE, const
    elimination, transpose reduction; no precision passes: the program already carries its
    fp16 casts) and re-serialised at the source's specification version; descriptions and
    ``user_defined`` metadata are copied, plus ``anetts.linear_rewrite``.  Written atomically.
    Returns the rewrite report (as :meth:`LinearRewrite.report`).
    """
    from pathlib import Path

    from anetts.artifacts import atomic_outputs
    from anetts.compile.reproducible import stabilize_package

    _check_variant(variant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
        from coremltools.converters.mil.converter import mil_convert
        from coremltools.converters.mil.frontend.milproto import load as milproto_load
        from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager
        from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
    src = Path(src)
    where = where or str(src)
    spec = ct.utils.load_spec(str(src))
    weights_dir = ct.models.MLModel(str(src), skip_model_load=True).weights_dir
    prog = milproto_load.load(spec, spec.specificationVersion, weights_dir)
    stats = RewriteStats(variant=variant)
    rewrite_linear_ops(prog, variant, stats)
    rw = LinearRewrite(variant, where=where)
    rw.stats = stats
    if variant != "none" and stats.rewritten == 0:
        rw.check(None)  # raises "matched no linear op"
    desc = spec.description
    multi = len(desc.functions) > 0
    PassPipelineManager.apply_pipeline(prog, ct.PassPipeline.CLEANUP)
    if multi:  # re-share byte-identical weights across functions, as save_multifunction does
        PASS_REGISTRY["common::const_deduplication"]._deduplicate_const_across_functions(prog)
        prog.default_function_name = desc.defaultFunctionName
        prog.export_as_multifunction = True
    prog.skip_all_passes = True
    mlmodel = mil_convert(prog, convert_to="mlprogram", convert_from="milinternal",
                          specification_version=spec.specificationVersion,
                          compute_units=ct.ComputeUnit.CPU_ONLY, skip_model_load=True,
                          model_description=desc if multi else None)
    out_spec = mlmodel.get_spec()
    if not multi:  # carry descriptions (feature descriptions, metadata) over
        for i, f in enumerate(desc.input):
            out_spec.description.input[i].shortDescription = f.shortDescription
        for i, f in enumerate(desc.output):
            out_spec.description.output[i].shortDescription = f.shortDescription
    out_spec.description.metadata.CopyFrom(desc.metadata)
    out_spec.description.metadata.userDefined["anetts.linear_rewrite"] = variant
    with atomic_outputs(Path(dst)) as (tmp,):
        ct.models.MLModel(out_spec, weights_dir=mlmodel.weights_dir, skip_model_load=True).save(str(tmp))
        stabilize_package(tmp)  # the same inputs give the same bytes (sha256)
        rw.check(tmp)
    return rw.report()
