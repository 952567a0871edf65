"""Each HTTP/2 attack family of issue 17 §3 against the engine adapter + budgets, in memory.

The frames come from python-hyper's hyperframe/hpack (tests/h2frames.py); the driver and the table are the
ones ``python -m bench.h2_engines`` prints into bench/README.md, so the documented answers are the tested
ones. For each family and both read sizes: the documented answer (an engine limit or one of our budgets),
within its bound of bytes read, the server's CPU bounded, and nothing raised.
"""

from __future__ import annotations

import pytest

from bench.h2_engines import FAMILIES, READ_SIZES, drive

CPU_BOUND_S = 2.0  # server CPU until the answer; the slowest (8 MiB of padded DATA) takes ~0.5 s on 2 cores


@pytest.mark.parametrize("read_size", READ_SIZES)
@pytest.mark.parametrize(("name", "make", "expected", "bound"), [(f[0], f[2], f[3], f[4]) for f in FAMILIES])
def test_attack_family_is_answered_within_bounded_bytes(name, make, expected, bound, read_size):
    answer, read, _sent, cpu = drive(make(), read_size=read_size)
    assert answer == expected[read_size], name
    assert read <= bound, (name, read)
    assert cpu < CPU_BOUND_S, (name, cpu)
