"""A small, exact draft-then-verify loop to check the embedded models (greedy, lossless).

No KV cache: each verify step runs the target over the whole sequence plus the drafts, and the model
drafter runs over the whole sequence once per draft token. That is slow but has no cache to get wrong,
so it is the reference the embedded engine's commit lengths can be checked against.

Commit length of a verify step = accepted drafts + 1 (the target's own next token), so its maximum is
``num_draft_tokens + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SpecResult:
    output_ids: list[int]
    step_commit_lengths: list[int] = field(default_factory=list)

    @property
    def mean_commit_length(self) -> float:
        return float(np.mean(self.step_commit_lengths)) if self.step_commit_lengths else float("nan")


def ngram_draft(ids: list[int], num_draft_tokens: int, max_ngram: int = 12, min_ngram: int = 1) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens.

    Tries n = max_ngram down to min_ngram (the longest match wins, as in the embedded server's NGRAM
    with its default window 1..12); returns [] when nothing matches.
    """
    arr = np.asarray(ids, dtype=np.int64)
    n_total = len(arr)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n_total <= n:
            continue
        suffix = arr[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # excludes the suffix itself
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return arr[start : start + num_draft_tokens].tolist()
    return []


@torch.no_grad()
def greedy_next(model: torch.nn.Module, ids: list[int], device: str) -> torch.Tensor:
    """Greedy next-token predictions at every position of `ids` (1-D tensor, len(ids))."""
    x = torch.tensor([ids], device=device)
    return model(input_ids=x).logits[0].argmax(-1)


@torch.no_grad()
def model_draft(drafter: torch.nn.Module, ids: list[int], num_draft_tokens: int, device: str) -> list[int]:
    seq = list(ids)
    out = []
    for _ in range(num_draft_tokens):
        nxt = int(greedy_next(drafter, seq, device)[-1])
        out.append(nxt)
        seq.append(nxt)
    return out


@torch.no_grad()
def speculative_generate(
    target: torch.nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    num_draft_tokens: int,
    drafter: torch.nn.Module | None,
    device: str,
) -> SpecResult:
    """Greedy speculative decoding; drafter None means n-gram prompt lookup."""
    ids = list(prompt_ids)
    res = SpecResult(output_ids=[])
    while len(res.output_ids) < max_new_tokens:
        room = max_new_tokens - len(res.output_ids)
        k = min(num_draft_tokens, room - 1)
        drafts = [] if k <= 0 else (ngram_draft(ids, k) if drafter is None else model_draft(drafter, ids, k, device))
        preds = greedy_next(target, ids + drafts, device)[len(ids) - 1 :].tolist()  # len(drafts) + 1
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == preds[accepted]:
            accepted += 1
        committed = drafts[:accepted] + [preds[accepted]]
        ids.extend(committed)
        res.output_ids.extend(committed)
        res.step_commit_lengths.append(len(committed))
    return res


@torch.no_grad()
def copy_accuracy(model: torch.nn.Module, ids: list[int], device: str, skip: int) -> float:
    """Teacher-forced share of positions after `skip` where the greedy prediction is the next token."""
    preds = greedy_next(model, ids, device)[skip:-1]
    truth = torch.tensor(ids[skip + 1 :], device=device)
    return float((preds == truth).float().mean())


@torch.no_grad()
def _probs(model: torch.nn.Module, ids: list[int], device: str, temperature: float) -> torch.Tensor:
    """Next-token distributions (float64) at every position of `ids`, at `temperature`."""
    logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].double()
    return torch.softmax(logits / temperature, -1)


@torch.no_grad()
def speculative_sample(
    target: torch.nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    num_draft_tokens: int,
    drafter: torch.nn.Module | None,
    device: str,
    temperature: float,
    generator: torch.Generator,
) -> SpecResult:
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023) at `temperature`.

    A draft token x with drafter probability q(x) is accepted with probability min(1, p(x)/q(x)) (p: the
    target's); on rejection the token is drawn from max(0, p - q), normalized. The n-gram drafter is
    deterministic, so its q is one-hot on its proposal. The output is distributed exactly as sampling
    the target alone.
    """
    ids = list(prompt_ids)
    res = SpecResult(output_ids=[])
    vocab = None
    while len(res.output_ids) < max_new_tokens:
        room = max_new_tokens - len(res.output_ids)
        k = min(num_draft_tokens, room - 1)
        drafts: list[int] = []
        q_rows: list[torch.Tensor] = []
        if k > 0 and drafter is None:
            drafts = ngram_draft(ids, k)
        elif k > 0:
            seq = list(ids)
            for _ in range(k):
                q = _probs(drafter, seq, device, temperature)[-1]
                x = int(torch.multinomial(q.float().cpu(), 1, generator=generator))
                drafts.append(x)
                q_rows.append(q)
                seq.append(x)
        p_all = _probs(target, ids + drafts, device, temperature)[len(ids) - 1 :]
        vocab = p_all.shape[-1]
        committed: list[int] = []
        for i, x in enumerate(drafts):
            p = p_all[i]
            q = q_rows[i] if q_rows else torch.nn.functional.one_hot(torch.tensor(x), vocab).to(p)
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            if u < min(1.0, float(p[x] / q[x])):
                committed.append(x)
                continue
            resid = torch.clamp(p - q, min=0)
            resid = resid / resid.sum()
            committed.append(int(torch.multinomial(resid.float().cpu(), 1, generator=generator)))
            break
        else:
            committed.append(int(torch.multinomial(p_all[len(drafts)].float().cpu(), 1, generator=generator)))
        ids.extend(committed)
        res.output_ids.extend(committed)
        res.step_commit_lengths.append(len(committed))
    return res
