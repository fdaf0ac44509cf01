"""Traces: construction, windows inside documents, bitsets, save/load round trip, and rejection of every kind of
malformed file with one line naming it (plus a hypothesis fuzz of the loader)."""

from __future__ import annotations

import json
import zipfile
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moespec import MoespecError
from moespec.formats.trace import FORMAT_VERSION, Trace, chunk_masks, concatenate, load_trace, popcount


def random_trace(rng: np.random.Generator, lengths=(5, 1, 12), layers=3, n_exp=10, m=3, weights=False) -> Trace:
    t = sum(lengths)
    experts = np.argsort(rng.random((t, layers, n_exp)), axis=-1)[..., :m]
    w = rng.random((t, layers, m)).astype(np.float32) if weights else None
    return Trace.from_arrays(experts, np.cumsum([0, *lengths]), n_exp, weights=w, meta={"model": "toy"})


def write_raw(path, experts, doc_starts, header: dict, weights=None) -> None:
    """A trace file written without validation, to test the loader."""
    arrays = {"experts": np.asarray(experts), "doc_starts": np.asarray(doc_starts),
              "header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
    if weights is not None:
        arrays["weights"] = np.asarray(weights)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def valid_header(trace: Trace) -> dict:
    return trace.header()


def test_shape_properties_and_meta():
    t = random_trace(np.random.default_rng(0))
    assert (t.num_tokens, t.num_layers, t.m, t.num_documents) == (18, 3, 3, 3)
    assert t.documents() == [(0, 5), (5, 6), (6, 18)]
    assert t.experts.dtype == np.uint8 and t.doc_starts.dtype == np.int64
    assert t.meta["model"] == "toy" and t.meta["format"] == "moespec-trace" and t.meta["version"] == FORMAT_VERSION
    assert (t.meta["num_experts"], t.meta["m"], t.meta["num_layers"]) == (10, 3, 3)
    assert t.meta["synthetic"] is False and t.meta["source"] is None
    with pytest.raises(ValueError):
        t.experts[0, 0, 0] = 1  # read-only: validation stays true


def test_large_expert_counts_stored_as_int16():
    rng = np.random.default_rng(1)
    experts = np.argsort(rng.random((4, 1, 300)), axis=-1)[..., :5]
    assert Trace.from_arrays(experts, [0, 4], 300).experts.dtype == np.int16


def test_windows_stay_inside_documents():
    t = random_trace(np.random.default_rng(2))
    for n in (1, 2, 5, 6, 12, 13):
        starts = t.window_starts(n)
        expected = [s for a, b in t.documents() for s in range(a, b - n + 1)]
        assert starts.tolist() == expected
        assert t.window_counts(n).sum() == len(expected)
        w = t.windows(1, n)
        assert w.shape == (len(expected), n, 3)
        if len(expected):
            assert np.array_equal(w[0], t.experts[expected[0]:expected[0] + n, 1])
    with pytest.raises(MoespecError):
        t.window_starts(0)
    with pytest.raises(MoespecError):
        t.windows(3, 2)


@pytest.mark.parametrize("n_exp", [2, 3, 63, 64, 65, 128, 200, 256, 300, 1000])
def test_bitsets_match_sets(n_exp):
    rng = np.random.default_rng(n_exp)
    m = min(5, n_exp - 1)
    ids = np.argsort(rng.random((50, 2, n_exp)), axis=-1)[..., :m]
    ids[:, :, 0] = rng.choice([0, n_exp - 1, 63 % n_exp, 64 % n_exp], size=(50, 2))  # word edges
    masks = chunk_masks(ids, n_exp, length=53)
    assert masks.shape == (-(-n_exp // 64), 53, 2) and not masks[:, 50:].any()
    for t in range(50):
        for layer in range(2):
            bits = {w * 64 + b for w in range(masks.shape[0]) for b in range(64) if int(masks[w, t, layer]) >> b & 1}
            assert bits == set(ids[t, layer].tolist())
            assert popcount(masks[:, t, layer]).sum() == len(bits)


def test_save_load_round_trip(tmp_path):
    t = random_trace(np.random.default_rng(3), weights=True)
    path = t.save(tmp_path / "sub" / "t.npz")
    u = load_trace(path)
    assert np.array_equal(u.experts, t.experts) and np.array_equal(u.doc_starts, t.doc_starts)
    assert np.array_equal(u.weights, t.weights) and u.meta == t.meta and u.num_experts == 10
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.npz"]  # atomic: no temp file left
    t.save(tmp_path / "plain")  # a name without .npz is kept as given
    assert load_trace(tmp_path / "plain").num_tokens == t.num_tokens


def test_incremental_building_and_concatenation():
    rng = np.random.default_rng(4)
    full = random_trace(rng, lengths=(4, 7), weights=True)
    grown = Trace.empty(10, 3, 3, meta={"model": "toy"}, with_weights=True)
    assert grown.num_tokens == 0 and grown.num_documents == 0
    for a, b in full.documents():
        grown = grown.append_document(full.experts[a:b], full.weights[a:b])
    assert np.array_equal(grown.experts, full.experts) and np.array_equal(grown.doc_starts, full.doc_starts)
    parts = [Trace.from_arrays(full.experts[a:b], [0, b - a], 10, full.weights[a:b]) for a, b in full.documents()]
    joined = concatenate(parts, meta={"model": "toy"})
    assert np.array_equal(joined.doc_starts, full.doc_starts) and np.array_equal(joined.weights, full.weights)
    with pytest.raises(MoespecError, match="router weights"):
        grown.append_document(full.experts[:2])
    with pytest.raises(MoespecError):
        concatenate([])


BAD_ARRAYS = [
    (lambda e, s: (np.where(e == 0, 10, e), s), "ids must lie in \\[0, 10\\)"),
    (lambda e, s: (np.where(e == 0, -1, e).astype(np.int64), s), "ids must lie"),
    (lambda e, s: (np.concatenate([e[..., :1], e[..., :2]], axis=-1), s), "repeats an expert id"),
    (lambda e, s: (e, [0, 5, 18 - 1]), "do not add up"),
    (lambda e, s: (e, [0, 5, 5, 18]), "do not add up"),
    (lambda e, s: (e, [1, 18]), "do not add up"),
    (lambda e, s: (e[:, 0], s), "shape"),
    (lambda e, s: (e.astype(float), s), "integers"),
]


@pytest.mark.parametrize("corrupt,message", BAD_ARRAYS)
def test_from_arrays_rejects(corrupt, message):
    t = random_trace(np.random.default_rng(5))
    experts, starts = corrupt(t.experts.astype(np.int64), t.doc_starts)
    with pytest.raises(MoespecError, match=message):
        Trace.from_arrays(experts, starts, 10)


def test_repeated_id_found_in_any_validation_chunk():
    t = random_trace(np.random.default_rng(13))
    experts = t.experts.copy()
    experts[16, 2, 2] = experts[16, 2, 0]
    with mock.patch("moespec.formats.trace._MASK_CHUNK", 3), \
            pytest.raises(MoespecError, match="token 16 layer 2 repeats"):
        Trace.from_arrays(experts, t.doc_starts, 10)


def test_from_arrays_rejects_bad_sizes_and_weights():
    t = random_trace(np.random.default_rng(6))
    with pytest.raises(MoespecError, match="below N"):
        Trace.from_arrays(np.zeros((1, 1, 3), int) + [0, 1, 2], [0, 1], 3)
    with pytest.raises(MoespecError, match="number of experts"):
        Trace.from_arrays(t.experts, t.doc_starts, 1)
    with pytest.raises(MoespecError, match="weights"):
        Trace.from_arrays(t.experts, t.doc_starts, 10, weights=np.ones((18, 3, 2), np.float32))
    with pytest.raises(MoespecError, match="NaN"):
        Trace.from_arrays(t.experts, t.doc_starts, 10, weights=np.full((18, 3, 3), np.nan, np.float32))
    with pytest.raises(MoespecError, match="header says m"):
        Trace.from_arrays(t.experts, t.doc_starts, 10, meta={"m": 4})


def _file_cases(trace: Trace):
    e, s, h = trace.experts, trace.doc_starts, valid_header(trace)
    bad_ids = e.copy()
    bad_ids[3, 1, 0] = 12
    repeated = e.copy()
    repeated[2, 0, 1] = repeated[2, 0, 0]
    return {
        "out-of-range": ((bad_ids, s, h), "ids must lie in"),
        "repeated": ((repeated, s, h), "token 2 layer 0 repeats"),
        "wrong m": ((e, s, h | {"m": 4}), "header says m = 4"),
        "N below the ids": ((e, s, h | {"num_experts": 5}), "ids must lie in \\[0, 5\\)"),
        "wrong version": ((e, s, h | {"version": 2}), "version 2 is not supported"),
        "no version": ((e, s, {k: v for k, v in h.items() if k != "version"}), "version None"),
        "other format": ((e, s, h | {"format": "npz"}), "not a moespec trace"),
        "docs do not add up": ((e, s[:-1], h), "do not add up"),
        "doc count": ((e, s, h | {"num_documents": 2}), "header says num_documents"),
        "token count": ((e, s, h | {"num_tokens": 17}), "header says num_tokens"),
        "weights flag": ((e, s, h | {"has_weights": True}), "header says has_weights"),
        "N not int": ((e, s, h | {"num_experts": "10"}), "must be an integer"),
    }


@pytest.mark.parametrize("case", list(_file_cases(random_trace(np.random.default_rng(7)))))
def test_load_rejects_malformed_file(tmp_path, case):
    trace = random_trace(np.random.default_rng(7))
    args, message = _file_cases(trace)[case]
    path = tmp_path / "bad.npz"
    write_raw(path, *args)
    with pytest.raises(MoespecError, match=message) as err:
        load_trace(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_load_rejects_bad_weights_missing_arrays_and_non_archives(tmp_path):
    trace = random_trace(np.random.default_rng(8))
    path = tmp_path / "w.npz"
    write_raw(path, trace.experts, trace.doc_starts, valid_header(trace) | {"has_weights": True},
              weights=np.ones((18, 3, 2), np.float32))
    with pytest.raises(MoespecError, match="weights must be floats"):
        load_trace(path)
    with open(path, "wb") as f:
        np.savez(f, experts=trace.experts)
    with pytest.raises(MoespecError, match="missing doc_starts, header"):
        load_trace(path)
    path.write_text("hello")
    with pytest.raises(MoespecError, match="not an .npz"):
        load_trace(path)
    with pytest.raises(MoespecError, match="no such trace file"):
        load_trace(tmp_path / "absent.npz")


def test_load_rejects_truncated_file(tmp_path):
    path = random_trace(np.random.default_rng(9)).save(tmp_path / "t.npz")
    data = path.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(MoespecError, match=str(path)):
            load_trace(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6))
def test_fuzz_byte_corruption(tmp_path, edits):
    """Any corruption of a valid file loads as a valid trace or fails with a one-line MoespecError."""
    path = tmp_path / "f.npz"
    data = bytearray(random_trace(np.random.default_rng(10), weights=True).save(path).read_bytes())
    for pos, value in edits:
        data[pos % len(data)] = value
    path.write_bytes(bytes(data))
    _load_or_error(path)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=3), max_leaves=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["format", "version", "num_experts", "num_layers", "m", "num_tokens", "num_documents",
                            "has_weights", "model", "meta", "synthetic"]),
       value=JSON_VALUES, drop=st.booleans())
def test_fuzz_header_edits(tmp_path, key, value, drop):
    trace = random_trace(np.random.default_rng(11))
    header = valid_header(trace)
    if drop:
        header.pop(key, None)
    else:
        header[key] = value
    path = tmp_path / "h.npz"
    write_raw(path, trace.experts, trace.doc_starts, header)
    loaded = _load_or_error(path)
    if loaded is not None:
        assert np.array_equal(loaded.experts, trace.experts)


def _load_or_error(path):
    try:
        loaded = load_trace(path)
    except MoespecError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return None
    assert isinstance(loaded, Trace)
    Trace.from_arrays(loaded.experts, loaded.doc_starts, loaded.num_experts, loaded.weights, loaded.meta)
    return loaded


def test_zip_with_unknown_member_rejected(tmp_path):
    trace = random_trace(np.random.default_rng(12))
    path = trace.save(tmp_path / "t.npz")
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("extra.npy", np.save.__doc__ or "x")
    with pytest.raises(MoespecError):
        load_trace(path)
