"""The night's verdict, in a few logical lines both renderings open with: the champion, the model
against the online counter, what the what-if and the layer bought (tasks/nightly/terminal.py
wraps them to the terminal's width; tasks/nightly/markdown.py lists them).
"""

from __future__ import annotations

from tasks.allocators.seeds import HEADLINE_PAIRS, SeedLine, short_case_names
from tasks.nightly.summary_model import NightlySummary
from tasks.report.page import fmt_bytes

ELLIPSIS = "…"
TABLE_NAMES = {
    "unseen_runs": "unseen runs",
    "unseen_programs": "never-seen programs",
    "heldout_workloads": "held-out workloads",
}
# the layer's pairs the verdict reads (tasks/allocators/seeds.py: HEADLINE_PAIRS)
VS_COUNTER = next(pair for pair, name in HEADLINE_PAIRS.items() if name == "vs_counter")
VS_NONE = next(pair for pair, name in HEADLINE_PAIRS.items() if name == "vs_none")
P_DECIDES = 0.05  # the rank test's level for "beyond the noise" (tasks/allocators/decide.py)


def verdict_lines(s: NightlySummary) -> list[str]:
    """The verdict as logical lines (each wrapped by the caller): the champion, the model
    against the online counter, what the calling context bought the counters, what the what-if
    and the layer bought. The markdown page opens with the same lines."""
    lines = [champion_line(s)]
    lines += [line for line in (counter_line(s), s.context) if line]
    lines += [whatif_line(s), layer_line(s)]
    return lines


def _v(version: str | None) -> str:
    return f"v{version}" if version is not None else "(none)"


def champion_line(s: NightlySummary) -> str:
    """Did tonight's model win: the champion before and after, with both scores."""
    stays = (
        f"the champion stays {_v(s.champion_after)}"
        if s.champion_after is not None
        else "no champion in the registry"
    )
    if not s.trained:
        why = s.not_registered or "the train stage did not run"
        return f"NO MODEL TRAINED: {why}. Nothing was registered; {stays}."
    p = s.promotion
    metric = "top-1" if p is None or p.metric == "top1" else p.metric
    tonight = _v(s.model_version)
    scores = ""
    if p is not None:
        scores = f"{metric} on unseen runs {p.candidate_score:.4f}"
        if p.previous_score is not None:
            gain = p.candidate_score - p.previous_score
            rescored = f"; {_v(p.previous_version)} re-scored on them" if p.reevaluated else ""
            scores += (
                f" vs {_v(p.previous_version)}'s {p.previous_score:.4f} ({gain:+.4f}{rescored})"
            )
    unread = f" (the scores could not be read: {s.promotion_unread})" if s.promotion_unread else ""
    if s.champion_changed:
        if s.champion_before is None:
            head = f"CHAMPION: {_v(s.champion_after)} is the first champion"
        else:
            head = f"CHAMPION CHANGED: {_v(s.champion_after)} replaces {_v(s.champion_before)}"
        if s.champion_after != s.model_version:  # another registration took the alias
            head += f" (tonight's model is {tonight})"
        return f"{head}: {scores}{unread}." if scores else f"{head}{unread}."
    if p is not None and p.decision == "not_comparable":
        return (
            f"Champion unchanged: {stays}; tonight's {tonight} could not be compared with it "
            f"(scored on other data and not re-scored){unread}."
        )
    head = f"Champion unchanged: tonight's {tonight} did not beat it; {stays}"
    return f"{head}: {scores}{unread}." if scores else f"{head}{unread}."


def counter_line(s: NightlySummary) -> str:
    """The model against the online counter (an allocator can always have that one), per
    evaluation table: the first in full, the others as margins."""
    if not s.tables:
        return ""
    first, *rest = s.tables
    where = f"{TABLE_NAMES.get(first.table, first.table)}, {first.positions:,} positions"
    if first.online_counter is None:
        line = f"Against the online counter: not scored tonight ({where})"
    else:
        line = (
            f"Against the online counter: top-1 {first.model:.4f} vs {first.online_counter:.4f} "
            f"({first.model - first.online_counter:+.4f}, {where})"
        )
        if first.hedged is not None:
            line += f"; mixed with it per thread {first.hedged:.4f}"
    line += (
        f"; best baseline {first.best_baseline} {first.best_baseline_top1:.4f} "
        f"({first.model - first.best_baseline_top1:+.4f})"
    )
    others = [
        f"{TABLE_NAMES.get(t.table, t.table)} {t.model - t.online_counter:+.4f}"
        for t in rest
        if t.online_counter is not None
    ]
    if others:
        line += f"; on {', '.join(others)}"
    return line + "."


def _not_run(s: NightlySummary, name: str, off: str) -> str:
    """Why a stage gave no figures: it failed (its error), was skipped (why), or was off."""
    st = s.stage(name)
    if st is None:
        return off
    if not st.ok:
        return f"the {name} stage {st.state.lower()}: {one_line(st.error or '', 160)}"
    return "no figures"


def whatif_line(s: NightlySummary) -> str:
    """What the predictions bought in simulation: the pooled hit rate at the idle budget."""
    pooled = next((a for a in s.whatif_at_budget if a.workload == "all"), None)
    if pooled is None and s.whatif_at_budget:
        pooled = s.whatif_at_budget[-1]
    if pooled is None or s.whatif_budget is None:
        return f"What-if: {_not_run(s, 'whatif', 'not run tonight')}."
    kind = "causal"
    if any(k.startswith("headline/whatif_optimistic.") for k in s.headline):
        kind = "optimistic: later predictions read, a bound"
    where = f"{pooled.workload} workloads" if pooled.workload == "all" else pooled.workload
    guided = pooled.guided_hit_rate
    best = pooled.best_heuristic_hit_rate
    line = f"What-if ({fmt_bytes(s.whatif_budget)} held idle, {where}, {kind}): hit rate "
    if guided is None:
        line += "guided by the model n/a (the model could not load)"
    else:
        line += f"guided by the model {guided:.4f}"
    if best is not None:
        line += f" vs best heuristic {pooled.best_heuristic or ''} {best:.4f}".replace("  ", " ")
        if guided is not None:
            line += f" ({guided - best:+.4f})"
    if pooled.oracle_hit_rate is not None:
        line += f"; oracle {pooled.oracle_hit_rate:.4f}"
    return line + "."


def pair_bought(line: SeedLine, pair: tuple[str, str]):
    return next((b for b in line.bought if (b.who, b.against) == pair), None)


def ms_text(b) -> str:
    if b is None or b.wall_ms is None:
        return "n/a"
    return f"{b.wall_ms:+.0f} ms (p={b.p_wall:.2g})"


def layer_line(s: NightlySummary) -> str:
    """What the layer bought, measured: the model's table against the online counter, per case
    (median wall ms; negative: time saved)."""
    if not s.seed_cases:
        if s.seed_lines:  # a summary made before the figures were kept: the text lines
            return f"Layer: measured on {len(s.seed_lines)} case(s): see the full summary."
        off = "not measured tonight (the `seeds` option is off)"
        return f"Layer: {_not_run(s, 'seeds', off)}."
    short = short_case_names([c.case for c in s.seed_cases])
    cells = [f"{short[c.case]} {ms_text(pair_bought(c, VS_COUNTER))}" for c in s.seed_cases]
    rounds = min(c.repetitions for c in s.seed_cases)
    decided = [
        b
        for c in s.seed_cases
        if (b := pair_bought(c, VS_COUNTER)) is not None and b.p_wall < P_DECIDES
    ]
    if rounds < 5:
        noise = f"{rounds} rounds: too few for the rank test"
    else:
        noise = f"{rounds} rounds, {len(decided)} of {len(s.seed_cases)} beyond the noise"
    return f"Layer, the model's table vs the online counter ({noise}): " + ", ".join(cells) + "."


def one_line(text: str, limit: int | None = None) -> str:
    """`text` on one line (its whitespace runs as one space), cut to `limit` with an ellipsis."""
    flat = " ".join(str(text).split())
    if limit is not None and len(flat) > limit:
        return flat[: limit - 1] + ELLIPSIS
    return flat
