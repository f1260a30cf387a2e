"""Per-layer verify time from two arms of one server (stock and a fixed attention), projected to a deeper model.

Two runs of the same server and model that differ only in the verify-attention kernel (issue 12: stock Triton
verify and the specdiag split-KV plugin, or SGLang's upstream split-KV) give, per context c (all ms per verify
step, measured):

- saved per layer      = (stock(c) - fixed(c)) / layers_measured: what the kernel swap saves in one layer;
- growth per layer     = (arm(c) - arm(c0)) / layers_measured, c0 the shortest measured context: how much one
  layer's step time grows with context in that arm. It bounds the attention's context-dependent time from
  above: everything else that grows with context (drafting over a longer prefix, the scheduler) counts too.

The projection to a model of ``layers_target`` layers multiplies these per-layer numbers (computed):
at a measured context directly, and at ``target_context`` by a least-squares line of growth per layer against
context, extrapolated when the target lies past the longest measured context (then said so in ``extrapolated``).
It holds only for the same attention geometry per GPU (MLA latent 512 + 64, the same heads per rank, the same
draft tokens per step, batch 1) and says nothing of the rest of a deeper model's step (its MoE, its weights).
Pure functions: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LayerRow:
    context_tokens: int
    stock_step_ms: float          # measured, whole verify step of the stock arm
    fixed_step_ms: float          # measured, whole verify step of the arm with the faster attention
    saved_per_layer_ms: float     # computed: (stock - fixed) / layers_measured
    stock_growth_per_layer_ms: float  # computed: (stock(c) - stock(c0)) / layers_measured
    fixed_growth_per_layer_ms: float  # computed: (fixed(c) - fixed(c0)) / layers_measured
    projected_saved_ms: float     # computed: saved_per_layer_ms x layers_target
    projected_stock_growth_ms: float  # computed: stock growth per layer x layers_target
    projected_fixed_growth_ms: float  # computed: fixed growth per layer x layers_target


@dataclass(frozen=True)
class Projection:
    layers_measured: int
    layers_target: int
    target_context: int
    base_context: int                       # c0: the shortest measured context, growth is counted from it
    rows: list[LayerRow]
    stock_slope_ms_per_1k_per_layer: float  # least squares of stock growth per layer against context
    fixed_slope_ms_per_1k_per_layer: float
    target_stock_growth_ms: float           # layers_target x stock slope x (target_context - c0) / 1000
    target_fixed_growth_ms: float
    target_saved_ms: float                  # the difference of the two above
    extrapolated: bool                      # target_context past the longest measured context

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slope_per_1k(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Ordinary least-squares slope of ys against xs, per 1,000 of x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("need at least two different contexts to fit a slope")
    return 1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def project_layers(stock_ms: Mapping[int, float], fixed_ms: Mapping[int, float], *, layers_measured: int,
                   layers_target: int = 61, target_context: int = 185_000) -> Projection:
    """Per-layer saved time and growth from two arms' ms per verify step at common contexts, scaled to
    ``layers_target`` layers (see the module docstring for the formulas and what they assume)."""
    if layers_measured < 1 or layers_target < 1:
        raise ValueError(f"layer counts must be >= 1; got measured {layers_measured}, target {layers_target}")
    common = sorted(set(stock_ms) & set(fixed_ms))
    if len(common) < 2:
        raise ValueError(f"need at least two contexts measured in both arms; common: {common}")
    c0 = common[0]
    rows = []
    for c in common:
        s, f = float(stock_ms[c]), float(fixed_ms[c])
        saved = (s - f) / layers_measured
        gs = (s - float(stock_ms[c0])) / layers_measured
        gf = (f - float(fixed_ms[c0])) / layers_measured
        rows.append(LayerRow(c, s, f, saved, gs, gf, saved * layers_target, gs * layers_target, gf * layers_target))
    xs = [float(r.context_tokens) for r in rows]
    k_s = _slope_per_1k(xs, [r.stock_growth_per_layer_ms for r in rows])
    k_f = _slope_per_1k(xs, [r.fixed_growth_per_layer_ms for r in rows])
    span_k = (target_context - c0) / 1000.0
    t_s, t_f = layers_target * k_s * span_k, layers_target * k_f * span_k
    return Projection(layers_measured, layers_target, target_context, c0, rows, k_s, k_f, t_s, t_f, t_s - t_f,
                      target_context > common[-1])


def step_ms_by_context(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Median ``step_ms`` per ``context_tokens`` of sweep rows (rows without a step are left out)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if r.get("step_ms") is not None and r.get("context_tokens") is not None and not r.get("error"):
            by.setdefault(int(r["context_tokens"]), []).append(float(r["step_ms"]))
    out = {}
    for c, v in by.items():
        v = sorted(v)
        m = len(v) // 2
        out[c] = v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specdiag.steps.bandwidth_analysis.verify_projection --stock RUN --fixed RUN``: the table from two recorded runs."""
    import argparse  # noqa: PLC0415

    from specdiag.runs import Run  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m specdiag.steps.bandwidth_analysis.verify_projection", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stock", required=True, help="run folder of the stock arm, e.g. data/reference/h200-sglang-mla-stock")
    p.add_argument("--fixed", required=True, help="run folder of the faster arm, e.g. data/reference/h200-sglang-mla-plugin-splitkv")
    p.add_argument("--layers-target", type=int, default=61)
    p.add_argument("--target-context", type=int, default=185_000)
    a = p.parse_args(argv)
    stock, fixed = Run.open(a.stock), Run.open(a.fixed)
    layers = int(((stock.meta.get("model") or {}).get("model_config") or {}).get("num_hidden_layers") or 0)
    if not layers:
        raise SystemExit(f"{stock.path}/run.json has no model.model_config.num_hidden_layers: the measured layer count is needed")
    pr = project_layers(step_ms_by_context(stock.rows("sweep")), step_ms_by_context(fixed.rows("sweep")),
                        layers_measured=layers, layers_target=a.layers_target, target_context=a.target_context)
    print(f"stock {stock.path.name} vs fixed {fixed.path.name}: {layers} layers measured, projected to {a.layers_target}"
          " (ms; step measured, the rest computed)")
    print("context | stock step | fixed step | saved/layer | stock growth/layer | fixed growth/layer | "
          f"saved x{a.layers_target} | stock growth x{a.layers_target} | fixed growth x{a.layers_target}")
    for r in pr.rows:
        print(f"{r.context_tokens:,} | {r.stock_step_ms:.2f} | {r.fixed_step_ms:.2f} | {r.saved_per_layer_ms:.2f} | "
              f"{r.stock_growth_per_layer_ms:.2f} | {r.fixed_growth_per_layer_ms:.2f} | {r.projected_saved_ms:.0f} | "
              f"{r.projected_stock_growth_ms:.0f} | {r.projected_fixed_growth_ms:.0f}")
    print(f"least squares per layer: stock {pr.stock_slope_ms_per_1k_per_layer:.4f}, fixed "
          f"{pr.fixed_slope_ms_per_1k_per_layer:.4f} ms per 1k tokens")
    print(f"at {pr.target_context:,} tokens x {pr.layers_target} layers (growth from {pr.base_context:,}"
          f"{', extrapolated' if pr.extrapolated else ''}): stock {pr.target_stock_growth_ms:.0f} ms, fixed "
          f"{pr.target_fixed_growth_ms:.0f} ms, saved {pr.target_saved_ms:.0f} ms per verify step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
