"""The deduplicating engine (Section 3.4, Appendix B.2): thresholds (14)/(16), speedup (15), worked examples."""

from fractions import Fraction as F

from hypothesis import given, settings
from hypothesis import strategies as st

from moespec import theory

pos = st.builds(F, st.integers(1, 40), st.integers(1, 8))
nonneg = st.builds(F, st.integers(0, 40), st.integers(1, 8))
unit = st.builds(F, st.integers(0, 100), st.just(100))


def periodic_reuse(pattern: str, n: int) -> F:
    """rho(n) (1) of a periodic one-expert pattern started at a uniformly random phase (m = 1)."""
    P = len(pattern)
    hits = sum(pattern[(t + n - 1) % P] in {pattern[(t + i) % P] for i in range(n - 1)} for t in range(P))
    return F(hits, P)


@st.composite
def engines(draw):
    """A random deduplicating engine whose step times are positive by construction (time model (5))."""
    kmax = draw(st.integers(1, 8))
    mW, beta1, betaD = draw(pos), draw(pos), draw(pos)
    t0, D1, phi1 = draw(nonneg), draw(nonneg), draw(nonneg)
    tau1 = t0 + D1 / betaD + mW / beta1 + phi1
    B = [beta1] + [draw(pos) for _ in range(kmax)]
    dD = [F(0)] + [draw(nonneg) for _ in range(kmax)]
    dphi = [F(0)] + [draw(nonneg) - phi1 * draw(unit) for _ in range(kmax)]  # phi_dedup(k+1) >= 0
    rho_bars = [draw(unit) for _ in range(kmax)]
    return theory.DedupEngine(mW, tau1, beta1, betaD, B, dD, dphi), rho_bars


@settings(max_examples=150, deadline=None)
@given(engines(), st.builds(F, st.integers(0, 99), st.just(100)))
def test_time_threshold_is_the_speedup_condition(instance, a):
    engine, rho_bars = instance
    V = engine.step_times(rho_bars)
    assert all(v > 0 for v in V)
    for k, rb in enumerate(rho_bars, start=1):
        faster = theory.beats_plain(V, a, k)
        assert faster == (rb > engine.threshold(a, k))  # (14) <=> (8)
        assert engine.speedup(a, k, rb) == theory.speedup(V, a, k)  # (15) == (9)
        # rho*_k(a) falls strictly as a rises
        assert engine.threshold(min(a + F(1, 100), F(99, 100)), k) <= engine.threshold(a, k)


@settings(max_examples=100, deadline=None)
@given(pos, nonneg, st.lists(nonneg, min_size=2, max_size=9), st.builds(F, st.integers(0, 99), st.just(100)))
def test_byte_threshold_is_the_one_bandwidth_time_threshold(mW, D, kv_increments, a):
    kv = [sum(kv_increments[: i + 1]) for i in range(len(kv_increments))]
    kmax = len(kv) - 1
    # one bandwidth beta = 1, t0 = phi = 0: tau(1) = D + mW + kv(0), dD_k = kv(k) - kv(0)
    engine = theory.DedupEngine(mW, D + mW + kv[0], 1, 1, [1] * (kmax + 1), [x - kv[0] for x in kv], [0] * (kmax + 1))
    for k in range(1, kmax + 1):
        assert theory.reuse_threshold_bytes(a, k, mW, D, kv) == engine.threshold(a, k)
    rho_bars = [F(1, 3)] * kmax
    assert theory.byte_step_times(mW, D, kv, rho_bars) == engine.step_times(rho_bars)


def test_no_single_threshold_example_of_appendix_b2():
    a, mW, D, kv = F(13, 20), 1, 0, [0, 0, 0]  # N = 3, L = 1, m = 1, w = 1, kmax = 2
    assert theory.reuse_threshold_bytes(a, 1, mW, D, kv) == F(7, 20)
    assert theory.reuse_threshold_bytes(a, 2, mW, D, kv) == F(371, 800)
    expected = {"01": (F(0), F(1, 2), True), "00012": (F(2, 5), F(2, 5), True), "00102": (F(1, 5), F(2, 5), False)}
    for pattern, (rb1, rb2, helps) in expected.items():
        rho = [[None, F(0)] + [periodic_reuse(pattern, n) for n in (2, 3)]]
        rho_bars = [theory.mean_drafted_reuse(rho, [1], k) for k in (1, 2)]
        assert rho_bars == [rb1, rb2], pattern
        V = theory.byte_step_times(mW, D, kv, rho_bars)
        assert theory.speculation_helps(V, a) == helps, pattern
        by_threshold = any(rb > theory.reuse_threshold_bytes(a, k, mW, D, kv) for k, rb in enumerate(rho_bars, 1))
        assert by_threshold == helps
    # "01" helps only at k = 2, "00012" at k = 1: no single rule rho_bar_k > c decides both.


def test_union_bytes_and_saving_sign():
    assert theory.union_bytes(8, 3, F(1, 2)) == 8 + 8 * 3 * F(1, 2)  # (12)
    # (6)/(7): bytes alone do not decide; the saving is positive exactly when u < r
    for u, r in [(F(7, 10), F(1, 2)), (F(7, 10), F(9, 10)), (F(1, 2), F(1, 2))]:
        S = theory.saving(100, 10, u, r)
        assert (S > 0) == theory.dedup_faster(u, r) == (u < r)
    assert theory.verify_time(1, 10, 5, 20, 4, 2) == 1 + 2 + 5 + 2  # (5)
