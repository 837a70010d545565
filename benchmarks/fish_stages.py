"""Fish AR stages end to end on one weights directory (default: fish-tiny, synthesized): the
upstream reference decode (prompt prefill + N frames), every stage exported and converted (fp16,
macOS15, states), the full teacher-forced scenario of each on the MIL executor (per-call dB,
top-1 agreement of logits), perturbed-weights twins, and the compiled chain's greedy decode vs
the reference. Prints the figures and writes them as JSON.

    python benchmarks/fish_stages.py --chunks 2 --frames 16 --context 192 -o fish_stages.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from anetts.models.fish import reference as R  # noqa: E402
from anetts.compile.export import compile_module as export_stage  # noqa: E402
from anetts.compile.export import record_eager  # noqa: E402
from anetts.artifacts import tree_bytes  # noqa: E402
from anetts.models.fish.chain_check import play_mil  # noqa: E402
from anetts.models.fish.stages.fast_ar import FastARStage  # noqa: E402
from anetts.models.fish.stages.slow_chunk import SlowChunkStage  # noqa: E402
from anetts.models.fish.tokenizer import TOKENIZER_NAME, load_tokenizer  # noqa: E402
from anetts.weights import materialize_weights  # noqa: E402
from anetts.options import ConvertOptions, Gate  # noqa: E402
from anetts.provenance import provenance  # noqa: E402
from anetts.metrics import top1_agreement  # noqa: E402
from anetts.gate import valid_part  # noqa: E402
from anetts.verify.parity import per_call_db, run_scenario  # noqa: E402


def perturbed(module):
    bad = copy.deepcopy(module)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in bad.parameters():
            p.add_(0.1 * p.std() * torch.randn(p.shape, generator=g))
    return bad


def scenario_figures(name, package, module, scenario, gate, logits=False, perturbed_package=None):
    t0 = time.perf_counter()
    ref = record_eager(copy.deepcopy(module), scenario)
    eager_s = time.perf_counter() - t0
    report = run_scenario(package, scenario, ref, gate)
    out = {"calls": len(scenario.calls), "functions": [c.function for c in scenario.calls],
           "positions": [int(c.inputs["pos"][0]) if "pos" in c.inputs else i for i, c in enumerate(scenario.calls)],
           "per_call_db": per_call_db(report), "passed": report["passed"],
           "mil_seconds": report["backends"]["mil"]["seconds"], "eager_seconds": round(eager_s, 3)}
    if logits:
        # each call's logits: the named output (its valid rows), else each call's first output
        keys = [logits if isinstance(logits, str) else scenario.functions[c.function].outputs[0].name
                for c in scenario.calls]
        played = play_mil(package, scenario)

        def rows(out, k, call):
            return valid_part(np.asarray(out[k]), call.valid.get(k)).reshape(-1, out[k].shape[-1])

        got = [rows(o, k, c) for o, k, c in zip(played, keys, scenario.calls)]
        want = [rows(r, k, c) for r, k, c in zip(ref, keys, scenario.calls)]
        out["top1"] = top1_agreement(np.concatenate(want), np.concatenate(got))
        out["top1_mismatch_calls"] = [i for i, (w, g) in enumerate(zip(want, got)) if (w.argmax(-1) != g.argmax(-1)).any()]
        if any("code" in c.inputs and "pos" in c.inputs for c in scenario.calls):
            # the fast AR's stepped calls after pos 0 (pos 0's logits are discarded: codebook 0 comes
            # from the semantic token)
            sampled = [i for i, c in enumerate(scenario.calls) if "pos" in c.inputs and int(c.inputs["pos"][0]) > 0]
            out["top1_sampled"] = top1_agreement(np.concatenate([want[i] for i in sampled]),
                                                 np.concatenate([got[i] for i in sampled]))
    if perturbed_package is not None:
        bad = run_scenario(perturbed_package, scenario, ref, gate)
        out["perturbed_per_call_db"] = per_call_db(bad)
        out["perturbed_passed"] = bad["passed"]
    dbs = out["per_call_db"]
    print(f"{name}: {len(dbs)} calls, dB min {min(dbs):.1f} max {max(dbs):.1f}"
          + (f", top-1 {out['top1']:.3f}" if logits else "")
          + (f"; perturbed max {max(out['perturbed_per_call_db']):.1f} dB" if perturbed_package else ""))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, help="a Fish weights directory (default: synthesize fish-tiny)")
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--prefill", type=int, default=16)
    p.add_argument("--context", type=int, default=192)
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--no-perturbed", action="store_true")
    p.add_argument("--rms-lowering", default="decomposed", choices=("decomposed", "layer_norm"))
    p.add_argument("-o", "--output", type=Path, help="JSON file for the figures")
    a = p.parse_args(argv)
    options = ConvertOptions(deployment_target="macOS15", precision="fp16")
    gate = Gate(min_snr_db=35.0)
    meta = {"model": "fish", "family": "fish"}
    with tempfile.TemporaryDirectory(prefix="fish-stages-") as tmp:
        tmp = Path(tmp)
        w = a.weights
        if w is None:
            w = tmp / "weights"
            materialize_weights("fish", {"source": "synthetic", "preset": "fish-tiny", "seed": 0}, w)
        t0 = time.perf_counter()
        model, cfg = R.load_reference_model(w)
        prompt = R.make_prompt(cfg, load_tokenizer(w / TOKENIZER_NAME, cfg))
        ref = R.reference_decode(model, cfg, prompt, a.frames)
        T = prompt.shape[1]
        result = {"weights": str(w), "rms_lowering": a.rms_lowering, "prompt_tokens": T, "frames": a.frames, "context": a.context, "prefill": a.prefill,
                  "reference_seconds": round(time.perf_counter() - t0, 3), "stages": {}}
        print(f"reference: {T}-token prompt + {a.frames} frames in {result['reference_seconds']} s")
        chunks = [SlowChunkStage(cfg, k, a.chunks, a.prefill, lowering=a.rms_lowering) for k in range(a.chunks)]
        fast = FastARStage(cfg, lowering=a.rms_lowering)
        pkgs = {}
        jobs = [(st, st.functions(a.context), st.load(w, a.context)) for st in [*chunks, fast]]
        for st, fns, m in jobs:
            module = st.build(m)
            pkg, reports = export_stage(module, fns, tmp / "pkg", options, meta, st.name)
            pkgs[st.name] = pkg
            bad = None
            if not a.no_perturbed:
                bad = export_stage(perturbed(module), fns, tmp / "bad", options, meta, st.name)[0]
            fig = {"package_bytes": tree_bytes(pkg),
                   "seconds": {k: v["seconds"] for k, v in reports.items() if k != "bundle_seconds"},
                   "bundle_seconds": reports["bundle_seconds"],
                   "ops": reports[fns[-1].name]["ops"]}
            if st in chunks:
                n_layer = cfg.slow.n_layer
                hin = np.concatenate([ref["prefill_layer_hidden"][st.start], ref["decode_layer_hidden"][:, st.start]])
                sc = st.teacher_forced(hin, T, a.context)
                # the last chunk's head: top-1 over its logits' valid rows
                fig |= scenario_figures(st.name, pkg, module, sc, gate, "logits" if st.final else False, bad)
                fig["layers"] = [st.start, st.stop]
                fig["final_norm"] = st.stop == n_layer
            else:
                fig |= scenario_figures("fast_ar", pkg, module, fast.teacher_forced(ref["slow_hidden"], ref["codes"]),
                                        gate, True, bad)
            result["stages"][st.name] = fig
        t0 = time.perf_counter()
        # the runtime's decode loop over the packages, greedy, closed loop
        from anetts.models.fish.assets import InputEmbedding, write_runtime_assets
        from anetts.models.fish.chain_check import compiled_decoder, decode_against

        (tmp / "assets").mkdir()
        write_runtime_assets(w, tmp / "assets")
        composed = {f"slow_chunk{i}": pkgs[st.name] for i, st in enumerate(chunks)}
        decoder = compiled_decoder(composed, pkgs["fast_ar"], InputEmbedding.from_dir(tmp / "assets"), a.prefill)
        chain = decode_against(decoder, ref, a.frames, follow=False)
        chain["wall_seconds"] = round(time.perf_counter() - t0, 3)
        result["chain"] = chain
        print(f"chain: {chain['frames_all_codes_equal']}/{chain['frames']} frames with all codes equal, "
              f"{chain['codes_equal']}/{chain['codes_total']} codes, semantic {chain['semantic_equal']}/{chain['frames']}, "
              f"slow state dB {min(chain['slow_hidden_db']):.1f}..{max(chain['slow_hidden_db']):.1f}, "
              f"head top-1 {chain['head_top1']}, fast top-1 {chain['fast_top1']:.3f}")
        result["provenance"] = provenance()
    if a.output:
        a.output.write_text(json.dumps(result, indent=1))
    return 0 if all(s["passed"] for s in result["stages"].values()) and \
        chain["frames_all_codes_equal"] == chain["frames"] else 1


if __name__ == "__main__":
    sys.exit(main())
