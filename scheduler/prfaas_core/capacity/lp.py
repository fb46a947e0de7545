"""A small linear program solver for the fleet planner: maximise ``c·x`` subject to ``A x <= b``, ``x >= 0``, with
``b >= 0`` (the origin is feasible, so one phase suffices). Dense tableau simplex with Bland's rule (no cycling on
the degenerate vertices a transport problem is full of). Pure; sized for tens of variables and constraints."""

from __future__ import annotations

from collections.abc import Sequence

EPS = 1e-12


def maximize(c: Sequence[float], a: Sequence[Sequence[float]], b: Sequence[float]) -> tuple[float, list[float]]:
    """(the optimum, an optimal ``x``). Raises ValueError on a negative ``b`` or an unbounded program."""
    m, n = len(a), len(c)
    if any(v < 0 for v in b):
        raise ValueError("maximize: b must be >= 0 (the origin must be feasible)")
    # rows: [A | I | b]; the objective row: [-c | 0 | 0]
    rows = [[*map(float, a[i]), *(1.0 if j == i else 0.0 for j in range(m)), float(b[i])] for i in range(m)]
    obj = [*(-float(v) for v in c), *([0.0] * m), 0.0]
    basis = [n + i for i in range(m)]
    for _ in range(50 * (n + m) + 100):
        enter = next((j for j in range(n + m) if obj[j] < -EPS), None)  # Bland: the lowest index improving
        if enter is None:
            break
        best: tuple[float, int, int] | None = None
        for i, row in enumerate(rows):
            if row[enter] > EPS:
                key = (row[-1] / row[enter], basis[i], i)
                if best is None or key[:2] < best[:2]:
                    best = key
        if best is None:
            raise ValueError("maximize: the program is unbounded")
        pivot = best[2]
        prow = rows[pivot]
        pv = prow[enter]
        rows[pivot] = prow = [v / pv for v in prow]
        for i, row in enumerate(rows):
            if i != pivot and abs(row[enter]) > EPS:
                f = row[enter]
                rows[i] = [v - f * p for v, p in zip(row, prow, strict=True)]
        f = obj[enter]
        obj = [v - f * p for v, p in zip(obj, prow, strict=True)]
        basis[pivot] = enter
    x = [0.0] * n
    for i, var in enumerate(basis):
        if var < n:
            x[var] = max(0.0, rows[i][-1])
    return sum(ci * xi for ci, xi in zip(c, x, strict=True)), x
