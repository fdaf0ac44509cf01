"""moespec.cluster on a local Ray instance of 2 CPUs: addresses checked before any work, an address nothing answers
at refused in one line, a worker that dies restarted with its unit retried and nothing lost, a task's own problem
surfacing as its one line, a task started after the tasks it waits for and naming the driver's command, and a
missing Ray named; whole-node units dealt over the nodes of a cluster of mixed sizes (Ray's own test cluster, and
the bookkeeping on a fake node list)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from moespec import MoespecError, cli
from moespec.cluster import (Node, Nodes, WholeNode, check_address, connected, each, live_nodes, on_whole_nodes,
                             results, submit, tasks, workers)


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


def test_whole_node_units_hold_each_node_of_a_mixed_cluster_and_a_lost_nodes_unit_moves(tmp_path: Path) -> None:
    """Three nodes on this machine (Ray's own test cluster: 1, 3 and 2 CPUs): every node takes units, each unit
    asking for all of its node's CPUs and never beside another there; the node of 2 CPUs is removed with a unit in
    hand, which is dealt again to a node still alive and finishes there. Runs before this module's local Ray."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    assert not ray.is_initialized()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=3)
    doomed = cluster.add_node(num_cpus=2)
    marker = tmp_path / "lost"
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        cpus = {n.id: n.cpus for n in live_nodes(ray)}
        assert sorted(cpus.values()) == [1, 2, 3]
        lost = doomed.node_id

        def unit(i: int) -> tuple[str, float, float, float]:
            node, start = ray.get_runtime_context().get_node_id(), time.time()
            if node == lost and not marker.exists():
                marker.write_text(str(i))
                time.sleep(60)  # its node is removed meanwhile
            time.sleep(0.2)
            return node, start, time.time(), ray.get_runtime_context().get_assigned_resources()["CPU"]

        def remove() -> None:
            while not marker.exists():
                time.sleep(0.05)
            cluster.remove_node(doomed)

        threading.Thread(target=remove, daemon=True).start()
        first = submit(ray, time.sleep, (0.1,))  # every unit waits for it
        done = dict(on_whole_nodes(ray, unit, {f"u{i}": WholeNode((i,), after={"first": first}) for i in range(8)}))
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert sorted(done) == [f"u{i}" for i in range(8)] and marker.exists()
    assert done[f"u{marker.read_text()}"][0] != lost  # the lost node's unit finished elsewhere
    assert {node for node, *_ in done.values()} == set(cpus) - {lost}
    for node, start, end, held in done.values():
        assert held == cpus[node]
        assert not any(o == node and s < end and start < e for o, s, e, _ in done.values() if (s, e) != (start, end))


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


def test_whole_node_units_on_one_node_and_their_problems_in_one_line(ray) -> None:
    """On the local node of 2 CPUs each unit holds both; a unit's own problem, or that of a task it waits for, is its
    one line; a unit that needs a GPU on a cluster without one is refused."""
    def refuse(path: str) -> None:
        raise MoespecError(f"{path}: not a moespec trace")

    def held() -> float:
        return ray.get_runtime_context().get_assigned_resources()["CPU"]

    assert dict(on_whole_nodes(ray, held, {"a": WholeNode(()), "b": WholeNode(())})) == {"a": 2.0, "b": 2.0}
    with pytest.raises(MoespecError, match=r"^x.npz: not a moespec trace$"):
        list(on_whole_nodes(ray, refuse, {"the bench x": WholeNode(("x.npz",))}))
    with pytest.raises(MoespecError, match=r"^t.npz: not a moespec trace$"):
        list(on_whole_nodes(ray, held, {"the bench y": WholeNode((), after={"the trace t": submit(ray, refuse,
                                                                                                 ("t.npz",))})}))
    with pytest.raises(MoespecError, match=r"^the bench z: no live node of the Ray cluster has a GPU$"):
        list(on_whole_nodes(ray, held, {"the bench z": WholeNode((), gpu=True)}))


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


MIXED = [{"NodeID": "small", "Alive": True, "Resources": {"CPU": 2.0}},
         {"NodeID": "gpu", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}},
         {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 16.0}},
         {"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0}},
         {"NodeID": "mid", "Alive": True, "Resources": {"CPU": 4.0}}]


class FakeCluster:
    def nodes(self) -> list[dict]:
        return MIXED


def test_whole_node_units_go_to_every_node_one_at_a_time_and_cuda_only_to_the_gpu_node() -> None:
    """Nodes of 2, 8 (with a GPU) and 4 CPUs (a dead node and a head of no CPU take nothing): the first units fill
    every node, a CPU unit the GPU node last; a cuda unit waits for the GPU node while CPU units behind it go on; a
    node freed takes the next unit; no node ever holds two units, and a node lost takes no more."""
    nodes = live_nodes(FakeCluster())
    assert nodes == [Node("small", 2, 0), Node("gpu", 8, 1), Node("mid", 4, 0)]
    book = Nodes(nodes)
    for name, gpu in [("a", False), ("b", False), ("c", False), ("x", True), ("d", False), ("y", True)]:
        book.ready(name, gpu)
    assert [(u, n.id) for u, n in book.place()] == [("a", "small"), ("b", "mid"), ("c", "gpu")]
    assert book.place() == []  # every node is held
    book.release("c")
    assert [(u, n.id) for u, n in book.place()] == [("x", "gpu")]  # the cuda unit before d, which waits
    book.release("a")
    assert [(u, n.id) for u, n in book.place()] == [("d", "small")]
    book.release("x")
    assert [(u, n.id) for u, n in book.place()] == [("y", "gpu")]
    held = [n.id for n in book.held.values()]
    assert sorted(held) == ["gpu", "mid", "small"] and book.queue == []

    book.refresh([Node("small", 2, 0), Node("gpu", 8, 1)])  # mid is lost with b in hand: b is dealt again
    book.release("b")
    book.ready("b", False, again=True)
    book.ready("e", False)
    assert book.place() == []  # small and gpu are held, mid is gone
    book.release("d")
    assert [(u, n.id) for u, n in book.place()] == [("b", "small")]
    with pytest.raises(ValueError, match="already placed or waiting"):
        book.ready("b", False)
    with pytest.raises(ValueError, match="holds no node"):
        book.release("zzz")

    no_gpu = Nodes([Node("small", 2, 0), Node("mid", 4, 0)])
    no_gpu.ready("the bench x", True)
    with pytest.raises(MoespecError, match="^the bench x: no live node of the Ray cluster has a GPU$"):
        no_gpu.place()


def test_dealt_at_random_no_node_ever_holds_two_units() -> None:
    rng = np.random.default_rng(0)
    book = Nodes(live_nodes(FakeCluster()))
    gpu = {f"u{i}": bool(rng.random() < 0.3) for i in range(40)}
    for name, g in gpu.items():
        book.ready(name, g)
    placed: list[str] = []
    while book.queue or book.held:
        for name, node in book.place():
            placed.append(name)
            assert node.gpus >= 1 or not gpu[name]
        ids = [n.id for n in book.held.values()]
        assert len(ids) == len(set(ids)) <= 3
        book.release(list(book.held)[int(rng.integers(len(book.held)))])
    assert sorted(placed) == sorted(gpu)
