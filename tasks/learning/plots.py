"""The plots logged next to every model, as PNG files (matplotlib, Agg backend, no display).

Each function takes plain arrays, writes one PNG and returns its path, so it is tested without
MLflow or Keras. Token labels follow tasks/dataset/tokens.py: `a<k>` an allocation of size class k
(bit length), `f<k>` a free of a block of size class k.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tasks.dataset.tokens import FREE_OFFSET, N_TOKENS


def token_label(t: int) -> str:
    return f"f{t - FREE_OFFSET}" if t >= FREE_OFFSET else f"a{t}"


def _pyplot():
    # deferred: imported on first use, for start-up time
    import matplotlib

    matplotlib.use("Agg", force=True)
    # deferred: imported on first use, for start-up time
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def confusion_matrix_png(confusion: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Row-normalised confusion matrix (true x predicted) over the classes that occur."""
    plt = _pyplot()
    # deferred: imported on first use, for start-up time
    from matplotlib.colors import LogNorm

    c = np.asarray(confusion, dtype=np.float64)
    if c.shape != (N_TOKENS, N_TOKENS):
        raise ValueError(f"confusion matrix: expected {N_TOKENS}x{N_TOKENS}, got {c.shape}")
    used = np.flatnonzero((c.sum(axis=0) + c.sum(axis=1)) > 0)
    if used.size == 0:
        used = np.arange(N_TOKENS)
    sub = c[np.ix_(used, used)]
    rows = sub.sum(axis=1, keepdims=True)
    frac = np.divide(sub, rows, out=np.zeros_like(sub), where=rows > 0)
    n = len(used)
    fig, ax = plt.subplots(figsize=(max(5, 0.22 * n + 2), max(4.5, 0.22 * n + 1.5)))
    shown = np.where(frac > 0, frac, np.nan)
    im = ax.imshow(shown, cmap="viridis", norm=LogNorm(vmin=1e-4, vmax=1), interpolation="nearest")
    labels = [token_label(int(t)) for t in used]
    ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    ax.set_xlabel("predicted token")
    ax.set_ylabel("true token")
    total = c.sum()
    acc = np.trace(c) / total if total else float("nan")
    ax.set_title(
        title or f"Model confusion (row-normalised), top-1 {acc:.3f}, {int(total)} positions"
    )
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true token's row")
    return _save(fig, path)


def per_class_accuracy_png(
    per_class: Mapping[str, np.ndarray],
    support: np.ndarray | None,
    path: str | Path,
    title: str = "",
) -> Path:
    """Top-1 accuracy per true token, one bar series per predictor (model and baselines).

    `support` (occurrences per class, e.g. the confusion matrix's row sums) is drawn under the
    bars on a log scale; classes that never occur are left out.
    """
    plt = _pyplot()
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in per_class.items()}
    occurs = np.zeros(N_TOKENS, dtype=bool)
    for a in arrays.values():
        occurs |= ~np.isnan(a)
    if support is not None:
        occurs &= np.asarray(support) > 0
    classes = np.flatnonzero(occurs)
    if classes.size == 0:
        classes = np.arange(N_TOKENS)
    n, k = len(classes), max(1, len(arrays))
    width = 0.8 / k
    rows = 2 if support is not None else 1
    fig, axes = plt.subplots(
        rows,
        1,
        figsize=(max(7, 0.3 * n + 2), 5 if rows == 2 else 3.8),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1]} if rows == 2 else None,
        squeeze=False,
    )
    ax = axes[0, 0]
    x = np.arange(n)
    for i, (name, a) in enumerate(arrays.items()):
        ax.bar(x + (i - (k - 1) / 2) * width, np.nan_to_num(a[classes]), width, label=name)
    ax.set_ylim(0, 1.18)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("top-1 accuracy")
    ax.legend(fontsize=8, ncol=k, loc="upper center")
    ax.set_title(title or "Accuracy per true token (unseen runs, all workloads)")
    if support is not None:
        s = np.asarray(support, dtype=np.float64)[classes]
        axes[1, 0].bar(x, np.maximum(s, 0.5), color="grey")
        axes[1, 0].set_yscale("log")
        axes[1, 0].set_ylabel("occurrences")
    bottom = axes[-1, 0]
    bottom.set_xticks(x, [token_label(int(t)) for t in classes], rotation=90, fontsize=7)
    bottom.set_xlabel("true token")
    return _save(fig, path)


def learning_curves_png(history: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Per-epoch curves: losses on one axis, accuracies on another; val_ curves dashed."""
    plt = _pyplot()
    losses = {k: v for k, v in history.items() if "loss" in k}
    others = {k: v for k, v in history.items() if "loss" not in k}
    panels = [p for p in (losses, others) if p] or [{}]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, curves in zip(axes[0], panels):
        for name, values in sorted(curves.items()):
            v = np.asarray(values, dtype=np.float64)
            ax.plot(
                np.arange(len(v)),
                v,
                "--" if name.startswith("val_") else "-",
                marker="o",
                markersize=3,
                label=name,
            )
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if curves:
            ax.legend(fontsize=8)
    axes[0, 0].set_title("Learning curves")
    return _save(fig, path)


def token_histogram_png(histogram: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Token counts of the training data: allocations (a<k>) and frees (f<k>), log scale."""
    plt = _pyplot()
    h = np.asarray(histogram, dtype=np.float64)
    if h.shape != (N_TOKENS,):
        raise ValueError(f"token histogram: expected {N_TOKENS} counts, got shape {h.shape}")
    fig, ax = plt.subplots(figsize=(11, 3.8))
    x = np.arange(N_TOKENS)
    colors = ["tab:blue" if t < FREE_OFFSET else "tab:orange" for t in x]
    ax.bar(x, np.where(h > 0, h, np.nan), color=colors)
    if (h > 0).any():
        ax.set_yscale("log")
    ax.set_xticks(x, [token_label(int(t)) for t in x], rotation=90, fontsize=6)
    ax.set_ylabel("tokens")
    total = h.sum()
    ax.set_title(
        title
        or f"Training tokens: {int(total)} ({int((h > 0).sum())} of {N_TOKENS} classes"
        " occur; blue: allocations, orange: frees)"
    )
    return _save(fig, path)
