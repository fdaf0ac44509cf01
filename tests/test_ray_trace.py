"""`moespec trace --ray`: the documents traced by Ray workers on a local instance of 2 CPUs equal the
single-process trace bit for bit; a worker killed mid-trace loses nothing; an interrupted trace resumes, on either
path."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from moespec import cli
from moespec.formats.checkpoint import Checkpoint
from moespec.formats.trace import load_trace

ray = pytest.importorskip("ray")

WORDS = "the cat sat on the mat while a bird sang in the tall tree and the dog ran to the park".split()
DOCS = 24  # enough documents that a worker holds one when it is killed


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """WikiText-style documents of 40-90 words."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("ray_text") / "wiki.txt"
    path.write_text("\n" + "".join(f" = Doc {i} = \n {' '.join(rng.choice(WORDS, 40 + 2 * i))} . \n"
                                   for i in range(DOCS)))
    return path


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def trace(model: Path, text: Path, out: Path, *extra: str) -> int:
    return cli.main(["trace", "--model", str(model), "--text", str(text), "--out", str(out), "--chunk", "5",
                     "--threads", "1", *extra])


def equal(a: Path, b: Path) -> None:
    x, y = load_trace(a), load_trace(b)
    np.testing.assert_array_equal(x.experts, y.experts)
    np.testing.assert_array_equal(x.weights, y.weights)
    np.testing.assert_array_equal(x.doc_starts, y.doc_starts)
    assert x.meta["model"] == y.meta["model"] and x.meta["tokenizer"] == y.meta["tokenizer"]


@pytest.fixture(scope="module")
def reference(tiny_checkpoints, text: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ray_ref") / "one.npz"
    assert trace(tiny_checkpoints["olmoe"], text, out) == 0
    return out


@pytest.mark.parametrize("model_type", ["olmoe", "deepseek_v2"])
def test_the_ray_trace_equals_the_single_process_trace(cluster, tiny_checkpoints, text, reference, tmp_path,
                                                       model_type: str) -> None:
    one = reference if model_type == "olmoe" else tmp_path / "one.npz"
    if model_type != "olmoe":
        assert trace(tiny_checkpoints[model_type], text, one) == 0
    out = tmp_path / "ray.npz"
    assert trace(tiny_checkpoints[model_type], text, out, "--ray", "local") == 0
    equal(one, out)
    assert not out.with_name(out.name + ".partial").exists()


def _workers() -> list[int]:
    """The pids of this machine's Ray trace workers (Ray titles their processes ray::TraceWorker...)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"TraceWorker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_worker_killed_mid_trace_loses_nothing(cluster, tiny_checkpoints, text, reference, tmp_path) -> None:
    out = tmp_path / "killed.npz"
    partial = out.with_name(out.name + ".partial")
    killed: list[int] = []

    def kill_one_after_the_first_document() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            if partial.is_dir() and any(partial.glob("doc_*.npz")) and _workers():
                killed.append(_workers()[0])
                os.kill(killed[0], signal.SIGKILL)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one_after_the_first_document)
    killer.start()
    assert trace(tiny_checkpoints["olmoe"], text, out, "--ray", "local") == 0
    killer.join()
    assert killed, "no worker was running after the first document: the trace finished too fast to test"
    equal(reference, out)


def test_an_interrupted_ray_trace_resumes(cluster, tiny_checkpoints, text, reference, tmp_path, monkeypatch) -> None:
    out = tmp_path / "resumed.npz"
    real, saved = Checkpoint.save_arrays, []

    def interrupted(self, key, **arrays):
        real(self, key, **arrays)
        saved.append(key)
        if len(saved) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save_arrays", interrupted)
    assert trace(tiny_checkpoints["olmoe"], text, out, "--ray", "local") == 130
    assert len(list(out.with_name(out.name + ".partial").glob("doc_*.npz"))) == 5 and not out.exists()
    monkeypatch.setattr(Checkpoint, "save_arrays", lambda self, key, **arrays: saved.append(key) or
                        real(self, key, **arrays))
    assert trace(tiny_checkpoints["olmoe"], text, out) == 0  # resumed in one process: the same checkpoint
    assert len(saved) == DOCS and sorted(set(saved)) == sorted(saved)  # the five were not traced again
    equal(reference, out)
