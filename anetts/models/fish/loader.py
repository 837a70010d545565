"""Reading the safetensors shards without holding the model: per-layer loading for the stages,
and a memory-mapped view of the whole checkpoint for the reference.

The index tells which shard holds each tensor; `safe_open` memory-maps a shard and copies out
only the tensors asked for, so loading layers [a, b) of a 9 GB checkpoint costs the bytes of
those layers, never the whole model.
"""
from __future__ import annotations

import mmap
import warnings
from collections import defaultdict
from pathlib import Path

import torch

from anetts.models.fish.config import FishConfig
from anetts.models.fish.weights import (
    DTYPE, SAFETENSORS_DTYPE, SLOW_PREFIX, WeightsError, layer_tensors, read_config, read_index, shard_files,
    shard_header, slow_layer_prefix,
)

# Linux's default fault_around_bytes: a read fault on a file map also maps the page-cached pages of
# the aligned window of this size around it (a multiple of every page size in use)
FAULT_AROUND_BYTES = 64 << 10


def load_tensors(weights_dir: Path, names: list[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The named checkpoint tensors, each read from the shard the index assigns it."""
    from safetensors import safe_open

    weights_dir = Path(weights_dir)
    wmap = read_index(weights_dir)
    by_shard: dict[str, list[str]] = defaultdict(list)
    for name in names:
        if name not in wmap:
            raise WeightsError(f"{weights_dir}: tensor {name} is not in the safetensors index")
        by_shard[wmap[name]].append(name)
    out = {}
    for shard, shard_names in sorted(by_shard.items()):
        with safe_open(str(weights_dir / shard), framework="pt") as fh:
            for name in shard_names:
                t = fh.get_tensor(name)
                out[name] = t if dtype is None else t.to(dtype)
    return {name: out[name] for name in names}


def slow_layer_names(cfg: FishConfig, start: int, stop: int) -> list[str]:
    if not 0 <= start < stop <= cfg.slow.n_layer:
        raise ValueError(f"slow layer range [{start}, {stop}) is outside 0..{cfg.slow.n_layer}")
    names = []
    for i in range(start, stop):
        names += list(layer_tensors(cfg.slow, slow_layer_prefix(i)))
    return names


def load_slow_layers(weights_dir: Path, start: int, stop: int, dtype: torch.dtype | None = None,
                     final_norm: bool | None = None) -> dict[str, torch.Tensor]:
    """Tensors of slow layers [start, stop), keyed `layers.{i}.<name>` as in fish-speech's module.

    `final_norm` (default: when the range ends at the last layer) adds `norm.weight`, which the
    last chunk applies.
    """
    cfg = read_config(weights_dir)
    names = slow_layer_names(cfg, start, stop)
    if final_norm is None:
        final_norm = stop == cfg.slow.n_layer
    if final_norm:
        names.append(f"{SLOW_PREFIX}norm.weight")
    return {name[len(SLOW_PREFIX):]: t for name, t in load_tensors(weights_dir, names, dtype).items()}


class MappedCheckpoint:
    """Every checkpoint tensor (bf16) as a view of its shard's read-only memory map, and `release` to hand
    a tensor's pages back once it has been read.

    A view holds no memory until it is read. The pages a read touches count in the process's RSS
    until `release` drops this process's mapping of them (madvise DONTNEED); the kernel's page
    cache keeps them, so the next read of the tensor refaults from memory, not from disk. A reader
    that releases each tensor after reading it therefore never holds more of the checkpoint than
    the tensor it is reading, however large the model (the reference's upstream model: 9.1 GB of
    bf16 at fish-s2-pro).
    """

    def __init__(self, weights_dir: Path):
        weights_dir = Path(weights_dir)
        wmap = read_index(weights_dir)
        self.tensors: dict[str, torch.Tensor] = {}
        self._regions: dict[int, tuple[mmap.mmap, int, int]] = {}  # data_ptr -> (map, first byte, end)
        self._map_addresses: set[int] = set()
        for shard in shard_files(weights_dir):
            path = weights_dir / shard
            header, data_start = shard_header(path)
            with open(path, "rb") as fh:  # the map stays valid after the file is closed
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            for name, entry in header.items():
                if wmap.get(name) != shard:
                    raise WeightsError(f"{path}: tensor {name} is not in the index under this shard")
                if entry["dtype"] != SAFETENSORS_DTYPE:  # what validate_weights_dir admits
                    raise WeightsError(f"{path}: tensor {name} has dtype {entry['dtype']}, expected {SAFETENSORS_DTYPE}")
                begin, end = (data_start + int(o) for o in entry["data_offsets"])
                shape = tuple(entry["shape"])
                if end - begin != DTYPE.itemsize * int(torch.Size(shape).numel()):
                    raise WeightsError(f"{path}: tensor {name}'s offsets do not match its shape {shape}")
                if end > len(mapped):
                    raise WeightsError(f"{path}: tensor {name} runs past the end of the file "
                                       f"({end} > {len(mapped)} bytes): a truncated shard")
                with warnings.catch_warnings():  # read-only on purpose: a write would fault, not corrupt
                    warnings.filterwarnings("ignore", message="The given buffer is not writable")
                    t = torch.frombuffer(mapped, dtype=DTYPE, count=(end - begin) // DTYPE.itemsize, offset=begin)
                self.tensors[name] = t.view(shape)
                self._regions[t.data_ptr()] = (mapped, begin, end)
                self._map_addresses.add(t.data_ptr() - begin)
        missing = sorted(set(wmap) - set(self.tensors))
        if missing:
            raise WeightsError(f"{weights_dir}: tensors in the index but in no shard: {missing[:5]}")

    def release(self, tensor: torch.Tensor) -> None:
        """Drop this process's pages of `tensor` (a view from `tensors`; anything else is left alone)
        and of whatever a read of it mapped beside it: Linux maps the cached pages of the aligned
        `FAULT_AROUND_BYTES` window around a read fault, which reach into the neighbouring tensors."""
        region = self._regions.get(tensor.data_ptr())
        advice = getattr(mmap, "MADV_DONTNEED", None)  # absent on Windows
        if region is None or advice is None:
            return
        mapped, begin, end = region
        base = tensor.data_ptr() - begin  # the map's address: the windows are aligned in address space
        start = max((base + begin) // FAULT_AROUND_BYTES * FAULT_AROUND_BYTES - base, 0)
        stop = min(-(-(base + end) // FAULT_AROUND_BYTES) * FAULT_AROUND_BYTES - base, len(mapped))
        mapped.madvise(advice, start, stop - start)

    def resident_bytes(self) -> int:
        """This process's resident bytes of the shard maps (Linux: /proc/self/smaps; 0 elsewhere)."""
        return _smaps_rss(self._map_addresses)


def _smaps_rss(starts: set[int]) -> int:
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    total, inside = 0, False
    for line in lines:
        first = line.split(" ", 1)[0]
        if "-" in first and ":" not in first:
            inside = int(first.split("-")[0], 16) in starts
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total
