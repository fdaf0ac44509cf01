"""moespec.cluster on a local Ray instance of 2 CPUs: addresses checked before any work, an address nothing answers
at refused in one line, a worker that dies restarted with its unit retried and nothing lost, a task's own problem
surfacing as its one line, a task started after the tasks it waits for and naming the driver's command, and a
missing Ray named."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from moespec import MoespecError, cli
from moespec.cluster import check_address, connected, each, results, submit, tasks, workers


@pytest.mark.parametrize("address", ["local", "auto", "10.0.0.5:6379", "ray://head.example:10001", "[::1]:6379"])
def test_addresses_a_cluster_answers_at(address: str) -> None:
    assert check_address(address) == address


@pytest.mark.parametrize("address", ["", "head", "head:port", "http://head:6379", "local;rm", "head:123456"])
def test_other_addresses_are_refused_before_any_work(address: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(MoespecError, match="give local, auto, HOST:PORT or ray://HOST:PORT"):
        check_address(address)
    assert cli.main(["reuse", str(tmp_path / "missing.npz"), "--ray", address]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_an_address_nothing_answers_at_is_one_line(tmp_path: Path, capsys) -> None:
    pytest.importorskip("ray")
    from moespec.routing.synth import synthesize
    synthesize("olmoe-1b-7b", "uniform", 300, 3, seed=0).save(tmp_path / "t.npz")
    assert cli.main(["reuse", str(tmp_path / "t.npz"), "--ray", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray 127.0.0.1:1: no Ray cluster answers there" in err


def test_a_missing_ray_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MoespecError, match=r"--ray needs Ray: pip install 'moespec\[ray\]'"):
        with connected("local"):
            pass


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_a_worker_that_dies_is_restarted_and_its_unit_retried(ray, tmp_path: Path) -> None:
    marker = str(tmp_path / "died")

    class Flaky:  # defined here: Ray ships it by value
        def square(self, i: int) -> int:
            if i == 3 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # the worker's process dies with unit 3 in hand
            return i * i

    actors = workers(ray, Flaky, (), 2)
    assert sorted(each(ray, actors, "square", [(i,) for i in range(8)])) == [i * i for i in range(8)]
    assert os.path.exists(marker)  # the worker did die, and unit 3 came back from its restart


def test_a_tasks_own_problem_is_its_one_line(ray, tmp_path: Path) -> None:
    def refuse(path: str) -> None:
        raise MoespecError(f"{path}: not a moespec trace")

    with pytest.raises(MoespecError, match=r"^x.npz: not a moespec trace$"):
        tasks(ray, refuse, [("x.npz",)])
    assert tasks(ray, lambda a, b: a + b, [(1, 2), (3, 4)]) == [3, 7]
    with pytest.raises(ValueError, match="count must be >= 1"):
        workers(ray, dict, (), 0)


def test_a_task_starts_after_the_tasks_it_waits_for_and_names_the_drivers_command(ray, tmp_path: Path) -> None:
    marker = tmp_path / "first"

    def first() -> None:
        time.sleep(0.5)  # on 2 CPUs the second task would start meanwhile if it did not wait
        marker.write_text("done")

    def second() -> tuple[str, list[str]]:
        return marker.read_text(), sys.argv

    ref = submit(ray, second, (), [submit(ray, first, ())])
    assert results(ray, [ref], "second") == [("done", sys.argv)]
    with pytest.raises(ValueError, match="num_cpus and num_gpus must be >= 0"):
        submit(ray, first, (), num_cpus=-1)
