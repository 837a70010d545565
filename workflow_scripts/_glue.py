"""Shared prologue of the rule scripts: log to the rule's log file, quiet third-party chatter."""
import logging
import os
import sys


def setup(snakemake, torch: bool = True, coremltools: bool = False, huge_pages: bool = False) -> logging.Logger:
    """`torch`: the job runs torch (its thread count is set to the rule's threads); `coremltools`: the
    job writes or reads packages (coremltools imported first, without its unused probes: anetts.imports).
    Each costs seconds of start-up (benchmarks/results/startup_log.md), so a job asks only for what it uses.
    `huge_pages`: torch's CPU allocator backs tensors of 2 MB and more with transparent huge pages
    (its THP_MEM_ALLOC_ENABLE, read at the first such allocation): for jobs that allocate and free large
    tensors in a loop, such as the Fish reference's per-use fp32 weight copies (docs/fish.md)."""
    # this checkout's package first, even when another anetts is installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(snakemake.scriptdir)))
    from anetts import artifacts, jobserver

    # run in the build's warm job server when there is one (it comes back here, in its forked child)
    status = jobserver.delegate(artifacts.job_usage_of_log(snakemake.log[0]) if snakemake.log else None)
    if status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if huge_pages:
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    from anetts.recovery import guard_job

    guard_job()  # stop with the build that started it, temporaries where the next build finds them
    handler = logging.FileHandler(snakemake.log[0], mode="w") if snakemake.log else logging.StreamHandler()
    logging.basicConfig(level=logging.INFO, handlers=[handler, logging.StreamHandler(sys.stderr)],
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("coremltools", "numexpr", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if coremltools:
        from anetts import imports

        imports.coremltools()
    if torch:
        import torch as _torch

        _torch.set_num_threads(max(1, snakemake.threads))
    return logging.getLogger(f"anetts.rule.{snakemake.rule}")
