"""SGLang 0.5.17's expert-distribution dump, read as its source writes it (sglang/srt/eplb/expert_distribution.py).

With ``--expert-distribution-recorder-mode per_pass`` the server keeps, between ``/start_expert_distribution_record``
and ``/dump_expert_distribution_record``, one record per forward pass (``_DetailAccumulator.append``), and the dump
(``_DetailAccumulator.dump`` -> ``_dump_to_file``) is ``torch.save`` of::

    {"records": [{"forward_pass_id": int, "rank": int, "gatherer_key": "primary",
                  "global_physical_count": IntTensor[num_layers, num_physical_experts]}, ...],
     "last_physical_to_logical_map": Tensor[num_layers, num_physical_experts]}

written to ``$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR/expert_distribution_recorder_<time>_<rank>.pt`` (one file per
rank; the directory defaults to /tmp). ``global_physical_count[l, e]`` counts the tokens of the pass that layer ``l``
routed to physical expert ``e`` (``_SelectExpertsSinglePassGatherer``: a scatter_add of the top-k ids): a layer's row
sums to tokens x top_k; dense layers' rows are 0. Prefill chunks, decode steps and target-verify passes are all
recorded (verify passes included: measured on the H200). Under tensor parallelism every rank routes every token, so
rank 0's file holds the whole picture; this module reads one file (rank 0's by default).

The per_token mode adds ``topk_ids_of_layer`` and ``input_ids`` per record; they are kept when present.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

FILE_GLOB = "expert_distribution_recorder_*.pt"


@dataclass(frozen=True)
class PassCounts:
    """One forward pass of one rank."""

    forward_pass_id: int
    rank: int
    counts: np.ndarray  # int64 [num_layers, num_logical_experts]: tokens routed to each expert, per layer
    extra: Mapping[str, Any]  # other keys of the record (per_token mode: input_ids, topk_ids_of_layer, ...)


@dataclass(frozen=True)
class Dump:
    passes: tuple[PassCounts, ...]
    physical_to_logical: np.ndarray | None  # [num_layers, num_physical_experts], None when absent
    path: str = ""

    @property
    def num_layers(self) -> int:
        return int(self.passes[0].counts.shape[0]) if self.passes else 0

    @property
    def num_experts(self) -> int:
        return int(self.passes[0].counts.shape[1]) if self.passes else 0


def to_logical(counts: np.ndarray, physical_to_logical: np.ndarray | None, num_logical: int | None = None) -> np.ndarray:
    """Physical-expert counts as logical-expert counts (redundant copies of an expert summed; SGLang's
    ``_convert_global_physical_count_to_logical_count``). Without a map, or an identity map, unchanged."""
    counts = np.asarray(counts, dtype=np.int64)
    if physical_to_logical is None:
        return counts
    m = np.asarray(physical_to_logical, dtype=np.int64)
    if m.shape != counts.shape:
        raise ValueError(f"physical_to_logical_map has shape {m.shape}, the counts {counts.shape}")
    n = int(num_logical if num_logical is not None else m.max() + 1)
    if n == counts.shape[1] and np.array_equal(m, np.broadcast_to(np.arange(n), m.shape)):
        return counts
    out = np.zeros((counts.shape[0], n), dtype=np.int64)
    for layer in range(counts.shape[0]):
        np.add.at(out[layer], m[layer], counts[layer])
    return out


def parse(obj: Mapping[str, Any], path: str = "", rank: int | None = 0) -> Dump:
    """The loaded dump object (module docstring) as a :class:`Dump`; ``rank`` keeps one rank's records (None: all).
    Raises ValueError naming what is missing (a ``stat``-mode dump has ``logical_count`` and no records)."""
    if not isinstance(obj, Mapping) or "records" not in obj:
        keys = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
        hint = (" (a 'stat'-mode dump: start the server with --expert-distribution-recorder-mode per_pass)"
                if isinstance(obj, Mapping) and "logical_count" in obj else "")
        raise ValueError(f"{path or 'the dump'} is not a per_pass expert-distribution dump: it holds {keys}{hint}")
    mp = obj.get("last_physical_to_logical_map")
    mp = _np(mp) if mp is not None else None
    passes = []
    for rec in obj["records"]:
        if "global_physical_count" not in rec:
            raise ValueError(f"{path or 'the dump'}: a record without global_physical_count: {sorted(rec)}")
        r = int(rec.get("rank", 0))
        if rank is not None and r != rank:
            continue
        counts = to_logical(_np(rec["global_physical_count"]), mp)
        extra = {k: v for k, v in rec.items() if k not in ("forward_pass_id", "rank", "global_physical_count")}
        passes.append(PassCounts(int(rec["forward_pass_id"]), r, counts, extra))
    passes.sort(key=lambda p: (p.forward_pass_id, p.rank))
    return Dump(tuple(passes), mp, path)


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def stored(path: str | Path) -> Path | None:
    """``path``, or ``path.gz`` where a recorded run keeps its files gzipped (the same bytes); None if neither."""
    p = Path(path)
    gz = p.with_name(p.name + ".gz")
    return p if p.exists() else gz if gz.exists() else None


def read_bytes(path: str | Path) -> bytes:
    """A recorded file's bytes, gunzipped when it is stored as ``.gz`` (:func:`stored`)."""
    p = stored(path)
    if p is None:
        raise FileNotFoundError(f"{path} (nor {path}.gz) does not exist")
    return gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()


def load(path: str | Path, rank: int | None = 0) -> Dump:
    """Read one dump file, or its ``.gz`` (``torch.load`` with ``weights_only=True``: tensors, ints, strings and lists
    only)."""
    import torch  # noqa: PLC0415 - only to read the file

    obj = torch.load(io.BytesIO(read_bytes(path)), map_location="cpu", weights_only=True)
    return parse(obj, str(path), rank)


def newest(folder: str | Path, since_unix_s: float = 0.0, rank: int = 0) -> Path | None:
    """The newest dump file of ``rank`` in ``folder`` written after ``since_unix_s`` (None if there is none)."""
    files = [p for p in Path(folder).glob(FILE_GLOB) if p.stat().st_mtime >= since_unix_s
             and p.stem.rsplit("_", 1)[-1] == str(rank)]
    return max(files, key=lambda p: p.stat().st_mtime) if files else None


def dump_object(passes: Sequence[tuple[int, Any]], physical_to_logical: Any, rank: int = 0) -> dict[str, Any]:
    """The object SGLang 0.5.17's per_pass dump holds, from ``(forward_pass_id, IntTensor[layers, experts])`` pairs
    (for the tests and a dry run; a file written from it is a constructed dump, not a recorded one)."""
    return {"records": [{"forward_pass_id": int(i), "rank": rank, "gatherer_key": "primary",
                         "global_physical_count": counts} for i, counts in passes],
            "last_physical_to_logical_map": physical_to_logical}
