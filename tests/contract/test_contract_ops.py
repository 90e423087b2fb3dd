"""Every backend of every registered op equals the op's reference, forward and backward; causal paths read no later
token; token-by-token decoding equals the causal forward.

Parameters come from the registry (:mod:`contract_checks`): each registered mechanism's selftest cases, their
configs and shapes (one token, odd lengths, a head dimension that is not a power of two, lengths across the CPU
kernels' blocks), float64 and float32 inputs, and each backend that runs here. A mechanism registered with a case is
covered without an edit here; one without a case fails ``test_every_mechanism_declares_cases``.
"""

from __future__ import annotations

import pytest
import torch
from contract_checks import backend_errors, decode_errors, failures, leak_errors, op_cases

from attnzoo.layers import attention_info, list_attentions

DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,backend", op_cases())
def test_backend_equals_the_reference(case, backend, dtype):
    errors = backend_errors(case, backend, dtype)
    assert errors and not failures(errors, dtype), failures(errors, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "case,backend", [c for c in op_cases() if any(x.get("causal") for x in c.values[0].configs(False))]
)
def test_causal_backend_reads_no_later_token(case, backend, dtype):
    errors = leak_errors(case, backend, dtype)
    assert errors and not failures(errors, dtype), failures(errors, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case,backend", [c for c in op_cases() if c.values[0].step is not None])
def test_step_equals_the_causal_forward(case, backend, dtype):
    errors = decode_errors(case, backend, dtype)
    assert errors and not failures(errors, dtype), failures(errors, dtype)


@pytest.mark.parametrize("name", list_attentions())
def test_every_mechanism_declares_cases(name):
    # the parameters above are read from these: a mechanism without cases would go untested
    assert attention_info(name).mechanism.check_cases(), f"{name} declares no selftest cases (Mechanism.checks)"
