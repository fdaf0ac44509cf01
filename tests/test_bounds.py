"""Every bound of Table 2 (17)-(21) holds under random bandwidth errors |e| <= eps (Section 3.5, Appendix C)."""

import math
from fractions import Fraction as F

from hypothesis import given, settings
from hypothesis import strategies as st

from moespec import theory

pos = st.floats(0.05, 20.0)
nonneg = st.floats(0.0, 5.0)


@st.composite
def instances(draw):
    """True time model (5) per pass size n = 1..kmax+1, estimated bandwidths beta (1 + e), |e| <= eps."""
    kmax = draw(st.integers(1, 8))
    eps = draw(st.floats(0.0, 0.45))
    err = lambda: draw(st.floats(-eps, eps))  # noqa: E731 - one fresh error per bandwidth
    t0, betaD = draw(nonneg), draw(pos)
    rows = []
    for n in range(1, kmax + 2):
        D_n = draw(nonneg) + n * draw(st.floats(0, 0.2))
        E_slot = draw(pos) * n
        E_dedup = E_slot if n == 1 else E_slot * draw(st.floats(0.2, 1.0))
        b_slot = draw(pos)
        b_dedup = b_slot if n == 1 else draw(pos)
        phi = draw(nonneg)
        rows.append(dict(D=D_n, Es=E_slot, Ed=E_dedup, bs=b_slot, bd=b_dedup, phi=phi, es=err(), ed=err()))
    return t0, betaD, err(), eps, rows


def tau(t0, D, bD, E, b, phi):
    return theory.verify_time(t0, D, bD, E, b, phi)


@settings(max_examples=200, deadline=None)
@given(instances(), st.floats(0.0, 0.99))
def test_table2_bounds_hold(inst, a):
    t0, bD, eD, eps, rows = inst
    slack = 1 + 1e-9  # float rounding only
    V, V_hat = [], []
    for r in rows:
        bDh, bsh, bdh = bD * (1 + eD), r["bs"] * (1 + r["es"]), r["bd"] * (1 + r["ed"])
        t_s, t_d = tau(t0, r["D"], bD, r["Es"], r["bs"], 0), tau(t0, r["D"], bD, r["Ed"], r["bd"], 0)
        th_s, th_d = tau(t0, r["D"], bDh, r["Es"], bsh, 0), tau(t0, r["D"], bDh, r["Ed"], bdh, 0)
        M_s, M_d = r["D"] / bD + r["Es"] / r["bs"], r["D"] / bD + r["Ed"] / r["bd"]
        assert abs(th_s - t_s) <= theory.verify_time_bound(eps, M_s) * slack + 1e-12  # (17)
        assert abs(th_d - t_d) <= theory.verify_time_bound(eps, M_d) * slack + 1e-12
        S, S_hat = t_s - t_d, th_s - th_d
        bound = theory.saving_bound(eps, r["Es"] / r["bs"], r["Ed"] / r["bd"])  # (18)
        assert abs(S_hat - S) <= bound * slack + 1e-12
        u, r_hat = r["Ed"] / r["Es"], bdh / bsh
        if eps < 0.45 and theory.kernel_margin(u, r_hat, eps) > 1e-9:  # (19): the sign is decided
            assert (S_hat > 0) == (S > 0)
        V.append(t_d + r["phi"])
        V_hat.append(th_d + r["phi"])
    delta = theory.delta_from_eps(eps)
    assert all((1 - delta) * v / slack <= vh <= (1 + delta) * v * slack for v, vh in zip(V, V_hat))
    k, k_hat = theory.best_draft_length(V, a), theory.best_draft_length(V_hat, a)
    T = lambda W, j: theory.throughput(W, a, j)  # noqa: E731
    if delta < 1:
        assert T(V, k_hat) >= theory.throughput_floor(delta) * T(V, k) / slack  # (20)
        assert math.isclose(theory.throughput_loss_bound(delta), 2 * delta / (1 + delta))
        if theory.separated(V_hat, a, delta * slack):
            assert k_hat == k
        if theory.separated(V, a, delta * slack):
            assert k_hat == k
        lo, hi = theory.speedup_band(theory.speedup(V_hat, a, k_hat), delta)  # (21)
        assert lo / slack <= theory.speedup(V, a, k) <= hi * slack


def test_bounds_reject_bad_eps():
    for bad in (-0.1, 1.0, 1.5):
        try:
            theory.delta_from_eps(bad)
        except ValueError:
            continue
        raise AssertionError(f"eps={bad} accepted")


def test_common_factor_leaves_kstar():
    V = [F(3), F(4), F(6), F(9)]
    for a in theory.PAPER_ACCEPTANCES:
        assert theory.best_draft_length(V, a) == theory.best_draft_length([7 * v for v in V], a)
