"""CSP circular-shift schedules (CSP §3.2.2, Figure 2)."""

from __future__ import annotations

import math

import torch

from attnzoo._checks import check_choice, check_positive_int

__all__ = ["csp_shifts", "SHIFT_SCHEDULES"]

#: "linear": J_c = (c-1)·ceil(N/C) (N ≈ C); "power": J^(g-1) - 1 over all L·C channels of the
#: model with a real base J = N^(1/(LC-1)) (N >> C, the "Exp" of CSP Table 7); "none": no shifting
#: (complete sorting, CSP Table 6 "—").
SHIFT_SCHEDULES = ("linear", "power", "none")


def csp_shifts(
    N: int,
    C: int,
    schedule: str = "linear",
    *,
    layer: int = 0,
    num_layers: int = 1,
    base: int | None = None,
) -> torch.Tensor:
    """Per-channel circular shift steps ``J_c`` of CSP eq 4 as a LongTensor ``(C,)`` with values in ``[0, N)``.

    * ``"linear"`` (§3.2.2, N ≈ C): ``J_c = (c-1)·ceil(N/C) mod N`` for 1-based ``c``, so channel 0 (the
      sorting reference, ``P_1 = I``) is unshifted. The paper prints ``c·ceil(N/C)``; we use ``c-1`` as in
      Table 1's ``S_{(c-1) mod N}`` so that ``P_1 = I_N`` holds as eq 5 states. ``layer``/``num_layers``
      are ignored.
    * ``"power"`` (§3.2.2, N >> C): the ``L·C`` channels of all ``L = num_layers`` layers are numbered
      ``g = 1..LC`` (layer ``layer``, 0-based, owns ``g = layer·C + 1 .. (layer+1)·C``) and channel ``g`` is
      shifted by ``round(J^(g-1)) - 1`` with the real base ``J = N^(1/(LC-1))``: the shifts grow
      geometrically from 0 (channel 1 of layer 1 is the unshifted reference) to exactly ``N - 1`` (the
      paper's ``J^(LC-1) - 1 ≈ N - 1``), never decreasing. With ``LC == 1`` the single shift is 0.

      Deviation from the paper's literal ``J = floor(N^(1/(LC-1)))``: that floor is 1 whenever
      ``LC - 1 > log2 N``, and then every shift is 0 (N=16384, L=4, C=128, the Path-X setting: one
      distinct shift instead of a spread over the sequence). The real base keeps the paper's intent,
      shifts spread geometrically up to N-1; it gives 355 distinct shifts there, as many as the
      authors' code (``ceil(N^(g/(LC)))``, g = 0..LC-1).

      ``base`` (an integer J) restores the literal formula ``(J^(g-1) - 1) mod N`` with that J.
    * ``"none"``: all zeros (complete sorting makes shifting redundant, §3.2.2).
    """
    check_positive_int("N", N)
    check_positive_int("C", C)
    check_choice("schedule", schedule, SHIFT_SCHEDULES)
    check_positive_int("num_layers", num_layers)
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < num_layers:
        raise ValueError(f"layer must be an integer in [0, num_layers={num_layers}), got {layer!r}")
    if base is not None:
        if schedule != "power":
            raise ValueError(f"base={base!r} only applies to schedule='power', got schedule={schedule!r}")
        check_positive_int("base", base)

    if schedule == "none":
        steps = [0] * C
    elif schedule == "linear":
        stride = -(-N // C)  # ceil(N / C)
        steps = [(c * stride) % N for c in range(C)]
    else:
        total = num_layers * C
        first = layer * C
        if base is not None:
            # pow(J, g, N) keeps J^g small for large g; (J^g - 1) mod N is the circular step.
            steps = [(pow(base, g, N) - 1) % N for g in range(first, first + C)]
        elif total == 1:
            steps = [0]
        else:
            # N ** (g / (LC-1)) rather than J ** g: exact at both ends (1 and N), so the last shift is N-1.
            # Half-up rounding, clamped in case float error crosses an end.
            steps = [min(N - 1, max(0, math.floor(N ** (g / (total - 1)) + 0.5) - 1)) for g in range(first, first + C)]
    return torch.tensor(steps, dtype=torch.long)
