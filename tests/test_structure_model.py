"""The structural model of the expert kernels (moespec.kernels.structure) on synthetic device profiles, exact; `bench
--predict` writes a bench that validates and plans; its refusals (issue 35)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from cli_cases import one_line, refused, run_cli
from test_state_probe import LOOPY, takes

from moespec import ArgumentError, MoespecError, cli
from moespec.formats.benchfile import load_bench
from moespec.formats.devicefile import FORMAT_NAME, FORMAT_VERSION, load_profile
from moespec.kernels.peers import GGML_PEERS
from moespec.measure.contention import default_threads
from moespec.measure.timing import device_name
from moespec.predict.checks import profile_checks
from moespec.kernels.structure import Rates, groups, hit_share, pass_time
from moespec.measure import state_probe
from moespec.measure.bench import BenchConfig
from moespec.predict.structure_bench import predict_bench
from moespec.routing.synth import synthesize

RATES = Rates(G=(1, 2, 4), hot_s_per_byte=(1e-11, 2e-11, 4e-11), cold_excess_s_per_byte=(5e-12, 1e-11, 2e-11),
              group_s=1e-6, pass_s=1e-4)


def test_per_byte_roofline_interpolated_and_past_the_grid() -> None:
    assert RATES.per_byte(1, 50.0) == pytest.approx(2e-11 + 5e-12)  # memory 1 / 50 GB/s plus the loop's excess
    assert RATES.per_byte(1, 25.0) == pytest.approx(4e-11 + 5e-12)  # half the ceiling: the stream's part doubles
    assert RATES.per_byte(1, 400.0) == pytest.approx(2.5e-12 + 5e-12)  # the hot rate 1e-11 is no floor
    assert RATES.per_byte(1, 50.0, cold=False) == pytest.approx(1e-11)
    assert RATES.per_byte(3, 50.0) == pytest.approx(2e-11 + 1.5e-11)  # halfway between G = 2 and 4
    assert RATES.per_byte(6, 50.0) == pytest.approx(2e-11 + 3e-11)  # past the grid: x on its line through G = 2, 4
    assert RATES.per_byte(8, 50.0, cold=False) == pytest.approx(8e-11)  # and kappa on its own


def test_groups_in_kernel_order() -> None:
    ids = np.array([[3, 1], [3, 2]])
    assert groups("slot", ids) == [(3, 1), (1, 1), (3, 1), (2, 1)]
    assert groups("dedup", ids) == [(1, 1), (2, 1), (3, 2)]


def test_hit_share_by_distinct_bytes_since_the_last_read() -> None:
    order = [(0, 1), (1, 1), (0, 1), (2, 1), (3, 1), (0, 1)]
    assert hit_share(order, 10.0, 20.0) == pytest.approx([0, 0, 1, 0, 0, 2 / 3])  # {1, 0} fit; {2, 3, 0}: 20 of 30
    assert hit_share(order, 10.0, 40.0) == pytest.approx([0, 0, 1, 0, 0, 1])  # after {2, 3}: 3 experts fit
    assert hit_share(order, 10.0, 10.0) == pytest.approx([0, 0, 1 / 2, 0, 0, 1 / 3])
    assert hit_share(order, 10.0, 0.0) == [0.0] * 6


def test_pass_time_exact() -> None:
    ids, b, c = np.array([[0, 1], [0, 2]]), 1e6, 40.0
    cold1, hot1, cold2 = RATES.per_byte(1, c), RATES.per_byte(1, c, cold=False), RATES.per_byte(2, c)
    # slot: 4 groups of one token; expert 0's second slot finds it cached (experts {1, 0} = 2 MB fit 2 MB), or half
    # of it in a 1 MB cache
    assert pass_time(RATES, "slot", ids, b, 700, c, 2e6) == pytest.approx(1e-4 + 4e-6 + b * (3 * cold1 + hot1))
    assert pass_time(RATES, "slot", ids, b, 700, c, 1e6) == pytest.approx(1e-4 + 4e-6 + b * (3.5 * cold1 + hot1 / 2))
    assert pass_time(RATES, "slot", ids, b, 700, c, 0.0) == pytest.approx(1e-4 + 4e-6 + b * 4 * cold1)
    # dedup: expert 0 on 2 tokens, 1 and 2 on one each, every expert read once from memory; no row_s: rows cost 0
    assert pass_time(RATES, "dedup", ids, b, 700, c, 1e9) == pytest.approx(1e-4 + 3e-6 + b * (cold2 + 2 * cold1))
    # a fixed time per token adds it once per token of the pass, either kernel
    per_token = dataclasses.replace(RATES, token_s=5e-6)
    for kind in ("slot", "dedup"):
        assert pass_time(per_token, kind, ids, b, 700, c, 1e6) == pytest.approx(
            pass_time(RATES, kind, ids, b, 700, c, 1e6) + 2 * 5e-6)


def test_pass_time_pays_a_hits_own_group_time() -> None:
    """A group whose expert the cache holds pays hot_group_s, a cold one group_s, a partial hit each by its share;
    without hot_group_s a hit pays group_s; from_profile reads it where the entry has it."""
    ids, b, c = np.array([[0, 1], [0, 2]]), 1e6, 40.0
    hot = dataclasses.replace(RATES, hot_group_s=2.5e-7)
    assert hot.group_hot == 2.5e-7 and RATES.group_hot == RATES.group_s
    # slot: three cold groups and expert 0's second read, all of it cached (2 MB) or half of it (1 MB)
    assert pass_time(hot, "slot", ids, b, 700, c, 2e6) == pytest.approx(
        pass_time(RATES, "slot", ids, b, 700, c, 2e6) - (1e-6 - 2.5e-7))
    assert pass_time(hot, "slot", ids, b, 700, c, 1e6) == pytest.approx(
        pass_time(RATES, "slot", ids, b, 700, c, 1e6) - (1e-6 - 2.5e-7) / 2)
    assert pass_time(hot, "dedup", ids, b, 700, c, 1e9) == pass_time(RATES, "dedup", ids, b, 700, c, 1e9)  # no hit
    entry = {"G": [1], "hot_s_per_byte": [1e-11], "cold_excess_s_per_byte": [0.0], "group_s": 1e-6, "pass_s": 1e-4}
    assert Rates.from_profile(entry).hot_group_s is None
    assert Rates.from_profile(entry | {"hot_group_s": 3e-7}, "slot").group_hot == 3e-7


def test_pass_time_reads_each_expert_at_its_placement() -> None:
    """With a placement, expert e's cold bytes read at C p_e (its memory's rate), its cached bytes at kappa as
    before; all p_e = 1 is the pass without one; a placement short of an id or not positive is refused."""
    ids, b, c = np.array([[0, 1], [0, 2]]), 1e6, 40.0
    placed = [0.5, 2.0, 1.0]
    cold = {e: RATES.per_byte(g, c * placed[e]) for e, g in ((0, 2), (1, 1), (2, 1))}
    assert pass_time(RATES, "dedup", ids, b, 700, c, 1e9, placed) == pytest.approx(
        1e-4 + 3e-6 + b * (cold[0] + cold[1] + cold[2]))
    slot_cold = {e: RATES.per_byte(1, c * placed[e]) for e in range(3)}
    assert pass_time(RATES, "slot", ids, b, 700, c, 2e6, placed) == pytest.approx(  # expert 0's second slot cached
        1e-4 + 4e-6 + b * (slot_cold[0] + slot_cold[1] + slot_cold[2] + RATES.per_byte(1, c, cold=False)))
    for kind in ("slot", "dedup"):
        assert pass_time(RATES, kind, ids, b, 700, c, 1e6, [1.0] * 3) == pass_time(RATES, kind, ids, b, 700, c, 1e6)
    for bad in ([1.0, 1.0], [1.0, 0.0, 1.0]):
        with pytest.raises(ArgumentError, match="placement"):
            pass_time(RATES, "dedup", ids, b, 700, c, 1e6, bad)


def test_pass_time_pays_the_mean_cold_start_of_its_groups() -> None:
    """F(G), what a cold pass's first W bytes cost past its rate: the mean over its groups of F at each group's G,
    each by the share of its expert read from memory (a cached re-read pays nothing), all of it from W cold bytes
    and that share of it below; interpolated on G, its last value past the grid."""
    ramped = dataclasses.replace(RATES, ramp_s=(1e-4, 2e-4, 4e-4), ramp_bytes=2e6)
    ids, b, c = np.array([[0, 1], [0, 2]]), 1e6, 40.0
    assert ramped.ramp(3) == pytest.approx(3e-4) and ramped.ramp(9) == 4e-4 and RATES.ramp(1) == 0.0
    # dedup: groups at G = 2, 1, 1, all cold, 3 MB past W
    assert pass_time(ramped, "dedup", ids, b, 700, c, 1e9) == pytest.approx(
        pass_time(RATES, "dedup", ids, b, 700, c, 1e9) + (2e-4 + 2 * 1e-4) / 3)
    # slot: four groups at G = 1, expert 0's second read all cached (2 MB cache): 3 MB cold
    assert pass_time(ramped, "slot", ids, b, 700, c, 2e6) == pytest.approx(
        pass_time(RATES, "slot", ids, b, 700, c, 2e6) + 3 * 1e-4 / 4)
    # one token on one expert: 1 MB cold, half of W
    assert pass_time(ramped, "dedup", ids[:1, :1], b, 700, c, 1e9) == pytest.approx(
        pass_time(RATES, "dedup", ids[:1, :1], b, 700, c, 1e9) + 1e-4 / 2)


GGML = Rates(G=(1, 2), hot_s_per_byte=(3e-11, 4e-11), cold_excess_s_per_byte=(2e-11, 3e-11), group_s=2e-6,
             pass_s=2e-4, node_s=5e-6, row_s=(1e-8, 3e-8))  # ggml's pair: its own rates, fixed costs per node and row


def test_pass_time_of_ggml_pair_exact() -> None:
    """ggml-per-slot runs one node per token (n - 1 nodes past the first), ggml-mul_mat_id one node for the pass;
    every group pays its expert's rows at r(G), cached or not."""
    ids, b, rows, c = np.array([[0, 1], [0, 2], [3, 1]]), 1e6, 600, 40.0
    cold1, hot1, cold2 = GGML.per_byte(1, c), GGML.per_byte(1, c, cold=False), GGML.per_byte(2, c)
    assert cold1 == pytest.approx(1 / 40e9 + 2e-11) and hot1 == 3e-11 and cold2 == pytest.approx(1 / 40e9 + 3e-11)
    row1, row2 = 600 * 1e-8, 600 * 3e-8
    # per slot: 6 groups; expert 0's second read after {1, 0} (2 MB) and 1's after {2, 0, 3, 1} (4 MB) in a 2 MB cache
    assert pass_time(GGML, "slot", ids, b, rows, c, 2e6) == pytest.approx(
        2e-4 + 2 * 5e-6 + 6 * (2e-6 + row1) + b * (4 * cold1 + hot1 + (cold1 + hot1) / 2))
    # dedup: experts 0 and 1 on two tokens each, 2 and 3 on one; one node
    assert pass_time(GGML, "dedup", ids, b, rows, c, 2e6) == pytest.approx(
        2e-4 + 4 * 2e-6 + 2 * row2 + 2 * row1 + b * (2 * cold2 + 2 * cold1))
    assert pass_time(GGML, "slot", ids[:1], b, rows, c, 0.0) == pytest.approx(
        2e-4 + 2 * (2e-6 + row1 + b * cold1))  # one node


def test_stream_share_in_the_cold_rate_exact() -> None:
    """cold = max(s / C + x, 1 / C), s interpolated on G (its last value past the grid), 1 where absent."""
    rates = Rates((1, 2, 4), (1e-11, 2e-11, 4e-11), (3e-11, 4e-11, 5e-11), 0.0, 0.0, stream_share=(0.5, 0.7, 0.9))
    assert rates.per_byte(1, 25.0) == pytest.approx(0.5 / 25e9 + 3e-11)
    assert rates.per_byte(3, 25.0) == pytest.approx(0.8 / 25e9 + 4.5e-11)
    assert rates.per_byte(8, 400.0) == pytest.approx(0.9 / 400e9 + 7e-11)  # x on its last line past the grid
    fast = Rates((1,), (1e-12,), (0.0,), 0.0, 0.0, stream_share=(0.2,))
    assert fast.per_byte(1, 50.0) == pytest.approx(1 / 50e9)  # never faster than the stream itself
    assert RATES.per_byte(1, 50.0) == pytest.approx(1 / 50e9 + 5e-12)  # no stream_share: all of the stream


def test_with_share_keeps_the_cost_at_its_ceiling_and_follows_the_new_share() -> None:
    """A pinned profile's rates (s = 1, taken at 50 GB/s) given another profile's share: the same cost per byte at
    50 GB/s, and s' of the stream's change elsewhere; x' is floored at 0 where s' exceeds s."""
    shares = dataclasses.replace(RATES, G=(1, 2), hot_s_per_byte=(1e-11, 1e-11), cold_excess_s_per_byte=(0, 0),
                                 stream_share=(0.2, 0.0))
    moved = RATES.with_share(shares, 50.0)
    assert moved.stream_share == (0.2, 0.0, 0.0)  # G = 4 past shares' grid: its last value
    for g in (1, 2, 4):
        assert moved.per_byte(g, 50.0) == pytest.approx(RATES.per_byte(g, 50.0))
    assert moved.per_byte(1, 40.0) - moved.per_byte(1, 50.0) == pytest.approx(0.2 * (1 / 40e9 - 1 / 50e9))
    assert moved.per_byte(2, 40.0) == pytest.approx(moved.per_byte(2, 50.0))  # s' = 0: the loop's time, not C's
    back = moved.with_share(RATES, 50.0)  # the share of 1 again: the original rates
    assert back.stream_share == (1.0, 1.0, 1.0)
    assert back.cold_excess_s_per_byte == pytest.approx(RATES.cold_excess_s_per_byte)
    assert shares.with_share(RATES, 50.0).cold_excess_s_per_byte == (0.0, 0.0)  # 0 - 0.8 / C: floored
    with pytest.raises(ArgumentError, match="ceiling_gbps"):
        RATES.with_share(shares, 0.0)


def test_capped_hot_rate_no_slower_than_the_profiles_cold_rate_exact() -> None:
    """kappa(G) = min(kappa(G), max(s(G) / C_p + x(G), 1 / C_p)): a hot pass slower per byte than a cold one at the
    profile's ceiling C_p is held to the cold rate; faster ones stay; the excess and the share do not move."""
    at_50, at_100 = RATES.capped(50.0), RATES.capped(100.0)
    assert at_50.hot_s_per_byte == RATES.hot_s_per_byte  # cold 2.5e-11, 3e-11, 4e-11 at 50 GB/s: none faster
    assert at_100.hot_s_per_byte == pytest.approx((1e-11, 2e-11, 3e-11))  # G = 4: cold 1e-11 + 2e-11 under 4e-11
    assert at_100.cold_excess_s_per_byte == RATES.cold_excess_s_per_byte
    assert at_100.per_byte(4, 100.0) == pytest.approx(3e-11) == at_100.per_byte(4, 100.0, cold=False)
    assert RATES.per_byte(4, 100.0, cold=False) == pytest.approx(4e-11)  # uncapped: a hit slower than a cold read
    assert at_100.per_byte(4, 400.0) == pytest.approx(2.5e-12 + 2e-11)  # kappa is no floor under the cold rate
    shared = Rates((1,), (6e-11,), (3e-11,), 0.0, 0.0, stream_share=(0.5,)).capped(25.0)
    assert shared.hot_s_per_byte == pytest.approx((0.5 / 25e9 + 3e-11,))  # half the stream's 4e-11, plus x
    floor = Rates((1,), (5e-11,), (0.0,), 0.0, 0.0, stream_share=(0.2,)).capped(50.0)
    assert floor.hot_s_per_byte == pytest.approx((2e-11,))  # the cold rate is never under the stream itself


def test_loop_scaled_times_every_term_but_the_stream() -> None:
    """Rates.loop_scaled(k): x, kappa, r, F and every fixed time times k, the stream s / C and the grid kept, so a pass
    whose stream is all of the ceiling (s = 1) costs its stream plus k times the rest, exactly; k = 1 is the same."""
    rates = Rates((1, 2), (2e-11, 3e-11), (1e-11, 2e-11), 2e-6, 1e-4, node_s=5e-6, row_s=(1e-9, 2e-9),
                  token_s=3e-6, ramp_s=(1e-5, 2e-5), ramp_bytes=1e6, hot_group_s=1e-6)
    assert rates.loop_scaled(1.0) == rates
    twice = rates.loop_scaled(2.0)
    assert twice.G == rates.G and twice.stream_share == rates.stream_share and twice.ramp_bytes == rates.ramp_bytes
    assert twice.hot_group_s == 2e-6 and twice.row_s == (2e-9, 4e-9) and twice.node_s == 1e-5
    ids = np.array([[0, 1], [0, 2], [3, 1]])
    for kind in ("slot", "dedup"):
        stream = pass_time(rates.loop_scaled(1e-12), kind, ids, 2e6, 100, 40.0, 0)
        assert pass_time(twice, kind, ids, 2e6, 100, 40.0, 0) - stream == pytest.approx(
            2 * (pass_time(rates, kind, ids, 2e6, 100, 40.0, 0) - stream))
    for bad in (0.0, -1.0, float("inf"), True, "2"):
        with pytest.raises(ArgumentError, match="k must be"):
            rates.loop_scaled(bad)


def test_per_row_interpolated_and_past_the_grid() -> None:
    """r(G) on the profile's G as kappa is: linear between, on the line of the last two past the grid; none: 0."""
    rates = Rates((1, 2, 4), (1e-11, 2e-11, 4e-11), (0.0,) * 3, 0.0, 0.0, row_s=(1e-8, 2e-8, 3e-8))
    assert [rates.per_row(g) for g in (1, 3, 4, 6)] == pytest.approx([1e-8, 2.5e-8, 3e-8, 4e-8])
    assert RATES.per_row(3) == 0.0 and Rates.from_profile({**Q8_0, "row_s": [1e-8] * 5}).row_s == (1e-8,) * 5
    assert Rates.from_profile(Q8_0).row_s == ()  # a version-2 entry: no per-row time


@pytest.mark.parametrize("call", [
    lambda: RATES.per_byte(0, 50.0), lambda: RATES.per_byte(1, 0.0), lambda: groups("both", np.zeros((1, 2))),
    lambda: groups("slot", np.zeros((0, 2))), lambda: pass_time(RATES, "slot", np.zeros((1, 2), int), 0.0, 10, 50, 0),
    lambda: pass_time(RATES, "slot", np.zeros((1, 2), int), 1.0, 0, 50, 0), lambda: RATES.per_row(0),
    lambda: Rates((1, 2), (1e-11, 1e-11), (0.0, 0.0), 0.0, 0.0, row_s=(1e-9,)),
    lambda: Rates((1,), (1e-11,), (0.0,), 0.0, 0.0, row_s=(-1e-9,)),
    lambda: Rates((1, 2), (1e-11, 1e-11), (0.0, 0.0), 0.0, 0.0, stream_share=(0.5,)),
    lambda: Rates((1,), (1e-11,), (0.0,), 0.0, 0.0, stream_share=(1.5,)),
    lambda: hit_share([(0, 1)], 1.0, -1.0), lambda: Rates((2, 3), (1e-11, 1e-11), (0.0, 0.0), 0.0, 0.0),
    lambda: Rates((1,), (0.0,), (0.0,), 0.0, 0.0), lambda: Rates((1,), (1e-11,), (-1e-12,), 0.0, 0.0),
    lambda: Rates((1, 2), (1e-11,), (0.0, 0.0), 0.0, 0.0), lambda: Rates((1,), (1e-11,), (0.0,), 0.0, 0.0, -1e-6),
    lambda: Rates((1,), (1e-11,), (0.0,), 0.0, 0.0, ramp_s=(-1e-6,), ramp_bytes=1.0),
    lambda: Rates((1,), (1e-11,), (0.0,), 0.0, 0.0, ramp_s=(1e-6,)), lambda: RATES.ramp(0), lambda: RATES.capped(0.0),
    lambda: Rates((1,), (1e-11,), (0.0,), 0.0, 0.0, hot_group_s=-1e-7)])
def test_domain(call) -> None:
    with pytest.raises(ArgumentError):
        call()


# ---- bench --predict ----------------------------------------------------------------------------------------
def profile_doc(**changes) -> dict:
    """A valid device.json of this machine and the threads a bench runs by default (default_threads), with hand-set
    rates (G = 1, 2, 4, 8, 16)."""
    g = [1, 2, 4, 8, 16]
    threads = default_threads()
    device = f"{device_name().rsplit(',', 1)[0]}, {threads} threads"
    doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "device": device, "device_kind": "cpu",
           "threads": threads, "ceiling_kind": "streaming read", "ceiling_gbps": 50.0,
           "ceiling_iqr_gbps": 1.0, "cache_bytes": 16 << 20, "cache_nominal_bytes": 32 << 20,
           "dtypes": {"bf16": {"G": g, "hot_s_per_byte": [1e-11 * max(1, x / 4) for x in g],
                               "cold_excess_s_per_byte": [5e-12, 1e-11, 2e-11, 3e-11, 4e-11], "group_s": 1e-6,
                               "pass_s": 1e-4,
                               "matmul_peak_gflops": 500.0}},
           "self_check": {"slot": {"median": 0.02, "max": 0.05, "passes": 9},
                          "dedup": {"median": 0.03, "max": 0.06, "passes": 9}},
           "protocol": {"reps": 5, "flush_bytes": 64 << 20, "timer": "perf_counter"}, "provenance": {}}
    return doc | changes


Q8_0 = {"G": [1, 2, 4, 8, 16], "hot_s_per_byte": [3e-11, 3e-11, 4e-11, 8e-11, 16e-11],
        "cold_excess_s_per_byte": [2e-11, 3e-11, 4e-11, 8e-11, 16e-11], "group_s": 2e-6, "pass_s": 2e-4, "node_s": 5e-6,
        "matmul_peak_gflops": 300.0}  # ggml's pair on q8_0 blocks, less its per-row time
ROW_S = [1e-8, 2e-8, 3e-8, 4e-8, 5e-8]  # ggml's fixed seconds per weight row


def ggml_doc(**changes) -> dict:
    """profile_doc with q8_0 timed (ggml's pair) beside bf16, and each format's own self-check."""
    doc = profile_doc()
    doc["dtypes"]["q8_0"] = Q8_0 | {"row_s": ROW_S}
    doc["self_check_by_dtype"] = {"bf16": doc["self_check"],
                                  "q8_0": {"slot": {"median": 0.04, "max": 0.09, "passes": 9},
                                           "dedup": {"median": 0.05, "max": 0.11, "passes": 9}}}
    return doc | changes


@pytest.fixture(scope="module")
def olmoe_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "olmoe.npz"
    synthesize("olmoe-1b-7b", "calibrated", 4000, 20, 0).save(path)
    return path


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


PREDICT = ["bench", "--model", "olmoe-1b-7b", "--layers", "0", "--windows", "4", "--u-values", "3"]


def test_predicted_bench_validates_and_plans(tmp_path: Path, olmoe_trace: Path) -> None:
    profile = write(tmp_path / "device.json", profile_doc())
    out = tmp_path / "bench.json"
    code, err = run_cli([*PREDICT, "--trace", olmoe_trace, "--predict", profile, "--out", out])
    assert code == 0, err
    bench = load_bench(out)
    assert bench["predicted"] is True and bench["ceiling_gbps"] == 50.0 and bench["n"] == list(range(1, 10))
    prediction = bench["prediction"]
    assert prediction["error"] == {"slot": 0.02, "dedup": 0.03} and prediction["ceiling_source"] == "profile"
    for kernel, fit_eps in prediction["fit_eps"].items():
        assert bench["eps"][kernel] == pytest.approx(fit_eps + prediction["error"][kernel])
    # the one-token pass: 8 cold groups of one token, exactly the model's time
    b = bench["expert_bytes"]["0"]
    one = 1e-4 + 8 * (1e-6 + b * (1 / 50e9 + 5e-12))
    assert bench["per_layer"]["0"]["one_token_s"]["measured_s"] == pytest.approx(one)
    code, err = run_cli(["plan", "--bench", out, "--trace", olmoe_trace, "--tau1", "0.05", "--out",
                         tmp_path / "plan.json"])
    assert code == 0, err
    assert json.loads((tmp_path / "plan.json").read_text())["crossover"] == bench["crossover"]
    # at another ceiling: a memory-bound group's streaming part scales with it, the loop's excess stays
    code, err = run_cli([*PREDICT, "--trace", olmoe_trace, "--predict", profile, "--ceiling", "25",
                         "--out", tmp_path / "half.json"])
    assert code == 0, err
    half = load_bench(tmp_path / "half.json")
    assert half["per_layer"]["0"]["one_token_s"]["measured_s"] == pytest.approx(
        1e-4 + 8 * (1e-6 + b * (1 / 25e9 + 5e-12)))
    assert half["prediction"]["ceiling_source"] == "given"


def test_a_bench_predicted_at_each_ns_ceiling(tmp_path: Path, olmoe_trace: Path) -> None:
    """A ceiling per n (a measured bench's ceiling_by_n_gbps, for a side by side): each n's passes at its own, the
    file's ceiling their median; a mapping that misses an n of the bench, or a ceiling not positive, is refused."""
    profile = write(tmp_path / "device.json", profile_doc())
    config = BenchConfig(out=str(tmp_path / "bench.json"), model="olmoe-1b-7b", layers=(0,), trace=str(olmoe_trace),
                         windows=4, u_values=3)
    ceilings = {n: 25.0 if n == 1 else 50.0 for n in config.n}
    bench = predict_bench(config, str(profile), ceilings)
    b = bench["expert_bytes"]["0"]
    assert bench["per_layer"]["0"]["one_token_s"]["measured_s"] == pytest.approx(
        1e-4 + 8 * (1e-6 + b * (1 / 25e9 + 5e-12)))  # n = 1 at 25 GB/s
    assert bench["ceiling_by_n_gbps"] == {str(n): c for n, c in ceilings.items()} and bench["ceiling_gbps"] == 50.0
    assert bench["prediction"]["ceiling_source"] == "given per n"
    at_50 = predict_bench(dataclasses.replace(config, out=str(tmp_path / "at50.json")), str(profile), 50.0)
    two = [bench["per_layer"]["0"]["kernels"][k]["2"]["measured_mean_s"] for k in ("slot", "dedup")]
    assert two == pytest.approx([at_50["per_layer"]["0"]["kernels"][k]["2"]["measured_mean_s"]
                                 for k in ("slot", "dedup")])
    for bad in ({n: 50.0 for n in range(1, 9)}, {**ceilings, 2: 0.0}, {**ceilings, 2: float("nan")}, {},
                {**ceilings, 2: True}):
        with pytest.raises(MoespecError, match="ceiling"):
            predict_bench(config, str(profile), bad)


def test_a_bench_predicted_at_a_measured_placement(tmp_path: Path, olmoe_trace: Path) -> None:
    """A measured bench's placement (p_e per expert of each layer): each expert's cold bytes read at C p_e, so a
    placement of 1/2 everywhere is the whole bench at half the ceiling; a layer the bench has not is refused."""
    profile = write(tmp_path / "device.json", profile_doc())
    config = BenchConfig(out=str(tmp_path / "bench.json"), model="olmoe-1b-7b", layers=(0,), trace=str(olmoe_trace),
                         windows=4, u_values=3)
    half = predict_bench(config, str(profile), 50.0, placement={0: [0.5] * 64})
    at_25 = predict_bench(dataclasses.replace(config, out=str(tmp_path / "at25.json")), str(profile), 25.0)
    times = lambda bench: [v["measured_mean_s"] for by_n in bench["per_layer"]["0"]["kernels"].values()  # noqa: E731
                           for v in by_n.values()]
    assert times(half) == pytest.approx(times(at_25)) and half["prediction"]["placement"] is True
    assert at_25["prediction"]["placement"] is False
    with pytest.raises(MoespecError, match="placement: layers of the bench"):
        predict_bench(config, str(profile), 50.0, placement={3: [0.5] * 64})


def test_a_bench_predicted_at_a_probed_loop(tmp_path: Path, olmoe_trace: Path) -> None:
    """A loop factor k (moespec.measure.state_probe): every pass at the profile's rates with their loop times k, the
    stream at the ceiling given; the file records k (null without one); k not a positive number is refused."""
    profile = write(tmp_path / "device.json", profile_doc())
    config = BenchConfig(out=str(tmp_path / "bench.json"), model="olmoe-1b-7b", layers=(0,), trace=str(olmoe_trace),
                         windows=4, u_values=3)
    slow = predict_bench(config, str(profile), 50.0, loop_factor=1.5)
    b = slow["expert_bytes"]["0"]
    assert slow["per_layer"]["0"]["one_token_s"]["measured_s"] == pytest.approx(
        1.5e-4 + 8 * (1.5e-6 + b * (1 / 50e9 + 1.5 * 5e-12)))  # the loop's terms 1.5x, the stream's not
    assert slow["prediction"]["loop_factor"] == 1.5
    plain = predict_bench(dataclasses.replace(config, out=str(tmp_path / "plain.json")), str(profile), 50.0)
    assert plain["prediction"]["loop_factor"] is None
    for bad in (0.0, -2.0, float("nan"), True):
        with pytest.raises(ArgumentError, match="loop_factor"):
            predict_bench(config, str(profile), 50.0, loop_factor=bad)


def test_predicted_bench_reads_the_slot_kernels_own_rates(tmp_path: Path, olmoe_trace: Path) -> None:
    """A profile whose per-slot kernel has rates of its own (dtypes.bf16.slot: the Triton kernels on a GPU): the slot
    kernel's passes are predicted at those, the dedup kernel's at the entry's."""
    entry = profile_doc()["dtypes"]["bf16"]
    slot = {"G": [1], "hot_s_per_byte": [2e-11], "cold_excess_s_per_byte": [7e-12], "group_s": 2e-6, "pass_s": 1.5e-4}
    profile = write(tmp_path / "device.json", profile_doc(dtypes={"bf16": entry | {"slot": slot}}))
    out = tmp_path / "bench.json"
    code, err = run_cli([*PREDICT, "--trace", olmoe_trace, "--predict", profile, "--out", out])
    assert code == 0, err
    bench = load_bench(out)
    b = bench["expert_bytes"]["0"]
    one = {row["U"]: row["median_s"] for row in bench["windows"]["0"]["1"]}[8]  # one token: 8 cold groups
    assert one["dedup"] == pytest.approx(1e-4 + 8 * (1e-6 + b * (1 / 50e9 + 5e-12)))
    assert one["slot"] == pytest.approx(1.5e-4 + 8 * (2e-6 + b * (1 / 50e9 + 7e-12)))


def test_plan_refuses_a_prediction_too_uncertain(tmp_path: Path, capsys, olmoe_trace: Path) -> None:
    """A profile whose self-check missed by 60% in median: its predicted bench's eps carries that stated error past
    1/2, and plan refuses in one line that names the profile's error and says to re-take the profile, not to rerun a
    bench."""
    doc = profile_doc(self_check={k: {"median": 0.6, "max": 0.7, "passes": 9} for k in ("slot", "dedup")})
    out = tmp_path / "bench.json"
    code, err = run_cli([*PREDICT, "--trace", olmoe_trace, "--predict", write(tmp_path / "device.json", doc),
                         "--out", out])
    assert code == 0, err
    assert load_bench(out)["too_small"]["flag"]
    err = refused(["plan", "--bench", out, "--trace", olmoe_trace, "--tau1", "0.05", "--out", tmp_path / "plan.json"],
                  capsys, tmp_path)
    one_line(err, "predicted times are too uncertain", "stated error", "re-take the device profile")


def test_the_stated_error_is_the_self_checks_median(tmp_path: Path, olmoe_trace: Path) -> None:
    """A self-check that misses few of its passes by 60% (per-slot re-reads of a few cached experts, say) and the rest
    by 4%: the predicted bench states the median, as the paper's eps is a median, so its eps stays under the 1/2 a
    plan refuses past, and the profile is not flagged for those few passes."""
    doc = profile_doc(self_check={k: {"median": 0.04, "max": 0.6, "passes": 9} for k in ("slot", "dedup")})
    out = tmp_path / "bench.json"
    code, err = run_cli([*PREDICT, "--trace", olmoe_trace, "--predict", write(tmp_path / "device.json", doc),
                         "--out", out])
    assert code == 0, err
    bench = load_bench(out)
    assert bench["prediction"]["error"] == {"slot": 0.04, "dedup": 0.04}
    assert "median" in bench["prediction"]["error_source"] and max(bench["eps"].values()) < 0.5
    assert bench["prediction"]["profile_warnings"] == []


def test_predicted_bench_of_ggml_pair_validates_and_plans(tmp_path: Path, olmoe_trace: Path) -> None:
    """--dtype q8_0 predicts the kernels a measured q8_0 bench times (ggml's pair, the pair a plan reads) from the
    profile's q8_0 rates, with the q8_0 self-check as the stated error."""
    profile = write(tmp_path / "device.json", ggml_doc())
    out = tmp_path / "bench.json"
    code, err = run_cli([*PREDICT, "--dtype", "q8_0", "--trace", olmoe_trace, "--predict", profile, "--out", out])
    assert code == 0, err
    bench = load_bench(out)
    assert bench["predicted"] is True and bench["dtype"] == "q8_0" and bench["pair"] == list(GGML_PEERS)
    assert bench["kernels"]["ggml-mul_mat_id"]["implementation"] == "llama.cpp ggml, predicted"
    assert bench["prediction"]["error"] == {"ggml-per-slot": 0.04, "ggml-mul_mat_id": 0.05}
    assert bench["eps_engine"] == {"llama.cpp ggml": max(bench["eps"].values())}  # ggml's pair, not ours
    b = bench["expert_bytes"]["0"]
    assert b == 3 * 2048 * 1024 // 32 * 34  # OLMoE's expert in q8_0 blocks
    # one token: one node, 8 cold groups of one token, each OLMoE's 2 x 1024 + 2048 rows at r(1)
    one = 2e-4 + 8 * (2e-6 + 4096 * 1e-8 + b * (1 / 50e9 + 2e-11))
    assert bench["per_layer"]["0"]["one_token_s"]["measured_s"] == pytest.approx(one)
    by_n = {str(n): [row["median_s"]["ggml-per-slot"] for row in bench["windows"]["0"][str(n)]] for n in (1, 9)}
    assert min(by_n["9"]) > max(by_n["1"]) + 8 * 5e-6  # nine tokens: eight more nodes, and more groups
    code, err = run_cli(["plan", "--bench", out, "--trace", olmoe_trace, "--tau1", "0.05", "--out",
                         tmp_path / "plan.json"])
    assert code == 0, err
    assert json.loads((tmp_path / "plan.json").read_text())["crossover"] == bench["crossover"]


@pytest.mark.parametrize("doc, extra, words", [
    (profile_doc(threads=default_threads() + 1), [], ["threads"]),
    (profile_doc(device="cpu: another CPU, 2 threads"), [], ["another device"]),
    (profile_doc(device_kind="cuda"), [], ["cuda"]),
    (profile_doc(), ["--dtype", "fp32"], ["fp32"]),
    (profile_doc(), ["--dtype", "q8_0"], ["q8_0"]),
    (profile_doc(), ["--kernels", "slot,torch-dedup"], ["covers slot, dedup"]),
    (profile_doc(), ["--kernels", "ggml-per-slot,ggml-mul_mat_id"], ["at bf16", "covers slot, dedup"]),
    (ggml_doc(), ["--dtype", "q4_0"], ["q4_0", "q8_0"]),
    (ggml_doc(), ["--dtype", "q8_0", "--kernels", "dedup"], ["covers ggml-per-slot, ggml-mul_mat_id"]),
    (ggml_doc(), ["--dtype", "q8_0", "--kernels", "ggml-per-slot,hf-eager"], ["at q8_0"]),
    (ggml_doc(dtypes={"q8_0": {k: v for k, v in (Q8_0 | {"row_s": ROW_S}).items() if k != "node_s"}}),
     ["--dtype", "q8_0"], ["node_s"]),
    (ggml_doc(dtypes={"q8_0": Q8_0}), ["--dtype", "q8_0"], ["q8_0.row_s"]),
    (ggml_doc(dtypes={"q8_0": Q8_0 | {"row_s": ROW_S[:4]}}), ["--dtype", "q8_0"], ["row_s", "5 numbers"]),
    (ggml_doc(dtypes={"q8_0": Q8_0 | {"row_s": [-1.0] * 5}}), ["--dtype", "q8_0"], ["row_s", ">= 0"]),
    (ggml_doc(dtypes={"q8_0": Q8_0 | {"row_s": ROW_S, "stream_share": [0.5] * 4}}), ["--dtype", "q8_0"],
     ["stream_share", "5 numbers in [0, 1]"]),
    (ggml_doc(dtypes={"q8_0": Q8_0 | {"row_s": ROW_S, "stream_share": [1.2] * 5}}), ["--dtype", "q8_0"],
     ["stream_share"]),
    (profile_doc(dtypes={"bf16": profile_doc()["dtypes"]["bf16"] | {"cold_excess_s_per_byte": [-1.0] * 5}}), [],
     ["cold_excess_s_per_byte"]),
    (profile_doc(format_version=7), [], ["version"]),
    ({"format": "something else"}, [], ["not a moespec device profile"]),
])
def test_refusals(tmp_path: Path, capsys, olmoe_trace: Path, doc: dict, extra: list[str], words: list[str]) -> None:
    profile = write(tmp_path / "device.json", doc)
    err = refused([*PREDICT, "--trace", olmoe_trace, "--predict", profile, "--out", tmp_path / "b.json", *extra],
                  capsys, tmp_path)
    one_line(err, *words)


def test_profile_checks_flag_a_moving_host(tmp_path: Path) -> None:
    """A quiet profile has no warning; a ceiling that moved while it ran, or a self-check past the limit (of the
    format asked for), one line each naming the file, the last saying what to do."""
    quiet = load_profile(write(tmp_path / "quiet.json", ggml_doc(ceiling_before_after_gbps=[48.0, 53.0])))
    assert profile_checks(quiet, "quiet.json") == []
    moved = load_profile(write(tmp_path / "moved.json", profile_doc(ceiling_before_after_gbps=[35.0, 51.0])))
    [line] = profile_checks(moved, "moved.json")
    assert line.startswith("moved.json: the streaming read moved") and "(50.0 GB/s during its calls, before 35.0 " \
        "GB/s)" in line and "after" not in line and "moespec profile" in line
    doc = ggml_doc()
    doc["self_check_by_dtype"]["q8_0"]["slot"]["max"] = 0.6  # a few passes far off: no state moved
    assert profile_checks(load_profile(write(tmp_path / "few.json", doc)), "few.json", "q8_0") == []
    doc["self_check_by_dtype"]["q8_0"]["slot"]["median"] = 0.3
    bad = load_profile(write(tmp_path / "bad.json", doc))
    [line] = profile_checks(bad, "bad.json", "q8_0")
    assert "misses by 30% in median at q8_0 (over 10%)" in line and "quieter machine" in line
    assert profile_checks(bad, "bad.json", "bf16") == [] and len(profile_checks(bad, "bad.json")) == 1
    pinned = {"pinned_gbps": 48.0, "band": 0.15, "wait_s": 60.0, "waited_s": 60.0, "dropped": 4, "repins": 0,
              "exhausted": True, "calls": 1000}
    held = load_profile(write(tmp_path / "held.json", profile_doc(ceiling_before_after_gbps=[30.0, 52.0],
                                                                  level=pinned | {"kept_off": 100})))
    assert profile_checks(held, "held.json") == []  # pinned: the samples around the calls do not count
    left = load_profile(write(tmp_path / "left.json", profile_doc(level=pinned | {"kept_off": 663})))
    [line] = profile_checks(left, "left.json")
    assert "66% of its calls were kept off the pinned level of 48.0 GB/s" in line and "moespec profile" in line
    apart = load_profile(write(tmp_path / "apart.json", profile_doc(level=pinned | {"pinned_gbps": 33.0,
                                                                                    "kept_off": 100})))
    [line] = profile_checks(apart, "apart.json")  # its calls read 50 GB/s, 52% over the level it pinned
    assert "its calls' streaming read (50.0 GB/s in median) is off its pinned level of 33.0 GB/s" in line \
        and "(15%)" in line and "moespec profile" in line


def test_predict_prints_the_profile_warning(tmp_path: Path, capsys, olmoe_trace: Path) -> None:
    doc = profile_doc(ceiling_before_after_gbps=[30.0, 31.0])
    profile = write(tmp_path / "device.json", doc)
    assert cli.main([str(a) for a in [*PREDICT, "--trace", olmoe_trace, "--predict", profile,
                                      "--out", tmp_path / "b.json"]]) == 0
    assert "warning: " + str(profile) + ": the streaming read moved" in " ".join(capsys.readouterr().out.split())


def test_a_bench_predicted_at_the_state_probed_here(tmp_path: Path, olmoe_trace: Path, monkeypatch) -> None:
    """--probe: the profile's check passes timed here first (the check shape made tiny), the bench predicted at the
    median ceiling their calls met and the loop's k they give, both recorded with every pass's k."""
    shape = (64, 128)
    monkeypatch.setattr(state_probe, "CHECK_SHAPE", shape)
    doc = profile_doc()
    doc["dtypes"]["bf16"] = LOOPY | {"matmul_peak_gflops": 500.0}
    doc["self_check_by_dtype"] = {"bf16": doc["self_check"] | {"passes": [
        p | {"predicted_s": 0.0} for p in takes(LOOPY, 1.0, 40.0, shape)], "placement": None}}
    out = tmp_path / "bench.json"
    code, err = run_cli([*PREDICT, "--trace", olmoe_trace, "--predict", write(tmp_path / "device.json", doc),
                         "--probe", "--out", out])
    assert code == 0, err
    prediction = load_bench(out)["prediction"]
    probe = prediction["probe"]
    assert prediction["ceiling_source"] == "probe" and prediction["loop_factor"] == probe["k"]
    assert len(probe["take"]) == len(probe["passes"]) == 18 and all(p["measured_s"] > 0 for p in probe["take"])
    assert prediction["ceiling_gbps"] == pytest.approx(float(np.median([p["ceiling_gbps"] for p in probe["take"]])))


def test_refusals_of_files_and_flags(tmp_path: Path, capsys, olmoe_trace: Path) -> None:
    base = [*PREDICT, "--trace", olmoe_trace, "--out", tmp_path / "b.json"]
    one_line(refused([*base, "--predict", tmp_path / "missing.json"], capsys), "missing.json")
    (tmp_path / "corrupt.json").write_text("{not json")
    one_line(refused([*base, "--predict", tmp_path / "corrupt.json"], capsys), "corrupt.json")
    one_line(refused([*base, "--ceiling", "40"], capsys), "--predict")
    profile = write(tmp_path / "device.json", profile_doc())
    one_line(refused([*base, "--predict", profile, "--ceiling", "0"], capsys), "--ceiling")
    one_line(refused([*base, "--predict", profile, "--call-ceilings"], capsys), "--call-ceilings", "--predict")
    for flag in (["--pin-wait", "30"], ["--pin-gbps", "40"]):
        one_line(refused([*base, "--predict", profile, *flag], capsys), flag[0], "--predict", "--ceiling")
    one_line(refused([*base, "--probe"], capsys), "--probe", "--predict")
    one_line(refused([*base, "--predict", profile, "--probe", "--ceiling", "40"], capsys), "--probe", "--ceiling")


def test_loader_names_the_problem(tmp_path: Path) -> None:
    bad = profile_doc()
    bad["dtypes"]["bf16"]["G"] = [2, 4, 8, 16, 32]
    with pytest.raises(Exception, match="ascending whole numbers of tokens per group from 1"):
        load_profile(write(tmp_path / "d.json", bad))
    assert load_profile(write(tmp_path / "ok.json", profile_doc())).self_check() == {"slot": 0.05, "dedup": 0.06}
    negative = profile_doc()
    negative["dtypes"]["bf16"]["hot_group_s"] = -1e-7
    with pytest.raises(Exception, match="hot_group_s"):
        load_profile(write(tmp_path / "neg.json", negative))
    watched = profile_doc()
    watched["protocol"]["contention"] = {"cores": 2, "threads": 2, "fitted": False, "calls": 3, "contended": 5,
                                         "fewer_threads": 0, "others_max": 1, "wait_share_max": 0.1}
    with pytest.raises(Exception, match="protocol.contention"):
        load_profile(write(tmp_path / "watched.json", watched))
    loaded = load_profile(write(tmp_path / "ggml.json", ggml_doc()))
    assert loaded.self_check("q8_0") == {"slot": 0.09, "dedup": 0.11}
    assert loaded.self_check("bf16") == {"slot": 0.05, "dedup": 0.06}
    assert loaded.self_check("q8_0", "median") == {"slot": 0.04, "dedup": 0.05}
    with pytest.raises(ArgumentError, match="statistic"):
        loaded.self_check("q8_0", "mean")
    stray = ggml_doc()
    stray["self_check_by_dtype"]["q4_0"] = stray["self_check_by_dtype"]["q8_0"]
    with pytest.raises(Exception, match="self_check_by_dtype"):
        load_profile(write(tmp_path / "stray.json", stray))
    ramped = profile_doc()
    ramped["dtypes"]["bf16"] |= {"cold_ramp_s": [1e-4] * 5, "cold_ramp_bytes": 48 << 20}
    rates = Rates.from_profile(load_profile(write(tmp_path / "r.json", ramped))["dtypes"]["bf16"])
    assert rates.ramp(2) == 1e-4 and rates.ramp_bytes == 48 << 20
    ramped["dtypes"]["bf16"]["cold_ramp_s"] = [1e-4, -1e-4, 0, 0, 0]
    with pytest.raises(Exception, match=r"r.json: dtypes.bf16.cold_ramp_s must list 5 numbers >= 0"):
        load_profile(write(tmp_path / "r.json", ramped))
    ramped["dtypes"]["bf16"] |= {"cold_ramp_s": [1e-4] * 5, "cold_ramp_bytes": 0}
    with pytest.raises(Exception, match=r"r.json: dtypes.bf16.cold_ramp_bytes = 0 must be a number > 0"):
        load_profile(write(tmp_path / "r.json", ramped))
    with pytest.raises(Exception, match="ok.json: level.pinned_gbps"):
        load_profile(write(tmp_path / "ok.json", profile_doc(level={"pinned_gbps": -3.0})))


def test_loader_reads_the_previous_version(tmp_path: Path) -> None:
    """Version 3 had no measured cache: its cache_bytes (the last-level cache) loads without cache_nominal_bytes;
    version 4 needs the nominal size, at least the measured one; row_s is required of a GGUF format, not of ours;
    version 2 is no longer read."""
    v3 = ggml_doc(format_version=3)
    del v3["cache_nominal_bytes"]
    assert load_profile(write(tmp_path / "v3.json", v3))["cache_bytes"] == 16 << 20
    v4 = load_profile(write(tmp_path / "v4.json", ggml_doc()))
    assert FORMAT_VERSION == 4 and "row_s" not in v4["dtypes"]["bf16"]
    assert Rates.from_profile(v4["dtypes"]["q8_0"]).per_row(2) == 2e-8
    for changes, needle in (({"cache_nominal_bytes": None}, "cache_nominal_bytes"),
                            ({"cache_nominal_bytes": 8 << 20}, "exceeds cache_nominal_bytes")):
        with pytest.raises(Exception, match=needle):
            load_profile(write(tmp_path / "bad.json", ggml_doc() | changes))
    no_rows = ggml_doc()
    no_rows["dtypes"]["q8_0"] = {k: v for k, v in Q8_0.items() if k != "row_s"}
    with pytest.raises(Exception, match="row_s"):
        load_profile(write(tmp_path / "rows.json", no_rows))
    with pytest.raises(Exception, match="version 2 is not supported"):
        load_profile(write(tmp_path / "v2.json", profile_doc(format_version=2)))
