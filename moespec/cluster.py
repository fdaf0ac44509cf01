"""moespec's work on a Ray cluster (the optional extra `moespec[ray]`): the one module that imports Ray.

`--ray ADDRESS` runs a command's units on Ray: ADDRESS is `local` (a Ray instance started on this machine for the
command and stopped after it), `auto` (the cluster this machine joined with `ray start`), `HOST:PORT` (a head node's
GCS address) or `ray://HOST:PORT` (Ray Client). Every node needs moespec installed in the same environment and the
command's input files at the same paths (a shared file system), as Ray's own batch jobs do.

Workers are Ray actors that hold their expensive state (a model) once and take units one after another. A worker
whose process dies (killed, out of memory, its node lost) is restarted by Ray, which retries the unit it held
(RETRIES times): the caller sees every unit finish once, and checkpoints each as it arrives, so nothing finished is
lost and a rerun resumes. Units are handed out one per worker at a time, so a slow node takes fewer.

Tasks (`submit`) are single calls with their resource request, each started once the tasks it waits for are done
(a graph of units: `moespec sweep`) and retried as a worker's units are; what one writes names the command of the
driver that submitted it, as if it had run there.

Whole-node units (`on_whole_nodes`: a sweep's benches and runs, which time) are dealt out by the driver: each to a
free live node of its own, pinned there and asking for all of that node's CPUs (and a GPU where it needs one), so
every node times, whatever its size, two such units never share a node and no other task runs beside one. A unit
whose node is lost is dealt again to another node (RETRIES times).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from moespec import MoespecError

LOCAL = "local"
# A lost worker's unit is retried on its restarted worker this many times before the command fails.
RETRIES = 3
ADDRESS = re.compile(r"^(local|auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")
# How long a connection to a given address may take before it is refused as unreachable.
CONNECT_TIMEOUT_S = 20


def check_address(address: str) -> str:
    """The --ray argument, checked before any work: local, auto, HOST:PORT or ray://HOST:PORT."""
    if not isinstance(address, str) or not ADDRESS.match(address):
        raise MoespecError(f"--ray {address!r}: give local, auto, HOST:PORT or ray://HOST:PORT")
    return address


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MoespecError("--ray needs Ray: pip install 'moespec[ray]'") from None
    return ray


@contextmanager
def connected(address: str) -> Iterator[Any]:
    """The `ray` module connected to `address` (module docstring; a local instance takes this machine's CPUs); one line
    naming the address when no cluster answers there. A connection this call made is closed on exit; one that was
    already open (a driver's own session) is used as it is."""
    ray = _ray()
    check_address(address)
    if ray.is_initialized():
        yield ray
        return
    options = dict(log_to_driver=False, configure_logging=False)
    quiet = logging.getLogger("ray")  # its start-up notices would break a command's one-line errors on stderr
    level, quiet.level = quiet.level, logging.ERROR
    try:
        if address == LOCAL:
            ray.init(include_dashboard=False, **options)
        else:
            _reachable(address)
            ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise MoespecError(f"--ray {address}: no Ray cluster answers there ({_first_line(e)[:160]})") from None
    finally:
        quiet.setLevel(level)
    try:
        yield ray
    finally:
        ray.shutdown()


def _reachable(address: str) -> None:
    """Refuse a HOST:PORT nothing listens on within CONNECT_TIMEOUT_S (Ray itself retries for minutes)."""
    if address == "auto":
        return
    import socket
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConnectionError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None


def cluster_cpus(ray: Any) -> int:
    """The CPUs the cluster offers (all its nodes)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def cluster_gpus(ray: Any) -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def workers(ray: Any, cls: type, args: tuple, count: int, num_cpus: float = 1, num_gpus: float = 0) -> list[Any]:
    """`count` actors of `cls(*args)`, each with its resource request, restarted by Ray when their process dies
    (their pending units retried, RETRIES times)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    remote = ray.remote(max_restarts=RETRIES, max_task_retries=RETRIES)(cls)
    return [remote.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(*args) for _ in range(count)]


def each(ray: Any, actors: list[Any], method: str, units: Iterable[tuple]) -> Iterator[Any]:
    """Call `method(*unit)` of the actors for every unit, one unit per actor at a time, yielding each result as it
    finishes (in finishing order). A unit that fails after Ray's retries raises MoespecError naming it."""
    pending: dict[Any, tuple[Any, tuple]] = {}
    todo = iter(units)

    def hand(actor: Any) -> None:
        unit = next(todo, None)
        if unit is not None:
            pending[getattr(actor, method).remote(*unit)] = (actor, unit)

    for actor in actors:
        hand(actor)
    while pending:
        [done], _ = ray.wait(list(pending), num_returns=1)
        actor, unit = pending.pop(done)
        result = _got(ray, done, f"{method} of unit {unit[0]!r}")
        hand(actor)
        yield result


def submit(ray: Any, fn: Callable[..., Any], args: tuple, after: Sequence[Any] = (), num_cpus: float = 1,
           num_gpus: float = 0) -> Any:
    """`fn(*args)` as a Ray task of `num_cpus` CPUs and `num_gpus` GPUs, started once every task of `after` (their
    refs) has finished and retried RETRIES times when its worker dies; its ref (`results` waits for it). A task
    waiting for `after` holds no resources: Ray resolves a task's inputs before it grants the task its CPUs."""
    if not (num_cpus >= 0 and num_gpus >= 0):
        raise ValueError(f"num_cpus and num_gpus must be >= 0, got {num_cpus!r} and {num_gpus!r}")
    remote = ray.remote(max_retries=RETRIES)(_after)
    return remote.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(fn, args, sys.argv, *after)


def _after(fn: Callable[..., Any], args: tuple, argv: list[str], *finished: Any) -> Any:
    """The body of a `submit` task: Ray has resolved `finished` (the tasks it waits for) before calling it. The
    files it writes name the command that submitted it (moespec.formats.files.provenance reads sys.argv, which in
    a worker is Ray's own)."""
    own, sys.argv = sys.argv, list(argv)
    try:
        return fn(*args)
    finally:
        sys.argv = own


def results(ray: Any, refs: Sequence[Any], what: str) -> list[Any]:
    """The results of the tasks `refs` in their order; one line naming `what` when one fails."""
    return _got(ray, list(refs), what)


def tasks(ray: Any, fn: Callable[..., Any], calls: Sequence[tuple], num_cpus: float = 1,
          num_gpus: Sequence[float] | None = None) -> list[Any]:
    """`fn(*args)` for every args of `calls` as Ray tasks (each `num_cpus` CPUs and its num_gpus[i] GPUs, retried
    RETRIES times when their worker dies), their results in the order of `calls`."""
    gpus = num_gpus or [0] * len(calls)
    return results(ray, [submit(ray, fn, args, num_cpus=num_cpus, num_gpus=g) for args, g in zip(calls, gpus)],
                   fn.__name__)


def _got(ray: Any, refs: Any, what: str) -> Any:
    """ray.get(refs); a problem the work itself named (MoespecError) as its one line, a lost worker after Ray's
    retries as one line naming `what`."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, MoespecError):
            raise MoespecError(str(e.cause)) from None
        raise
    except ray.exceptions.RayError as e:
        raise MoespecError(f"{what} failed on the cluster after {RETRIES} retries: {_first_line(e)[:200]}") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def call(ray: Any, actor: Any, method: str, *args: Any) -> Any:
    """One call of an actor's method, its result."""
    return _got(ray, getattr(actor, method).remote(*args), method)



@dataclass(frozen=True)
class Node:
    """A live node as a whole-node unit takes it: Ray's node id, its CPUs and GPUs."""

    id: str
    cpus: int
    gpus: int


def live_nodes(ray: Any) -> list[Node]:
    """The cluster's live nodes that run tasks (a node of no CPU, such as a head started with --num-cpus 0, runs
    none), in Ray's order."""
    return [Node(n["NodeID"], int(n["Resources"]["CPU"]), int(n["Resources"].get("GPU", 0))) for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]


class Nodes:
    """Which node each whole-node unit holds, without Ray: units wait in the order they become ready; `place` gives
    each a free live node that suits it (one with a GPU for a GPU unit; a CPU unit takes a node without a GPU first,
    so a GPU unit finds one free), in the order of the node list, and a node holds one unit until `release`."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.live = list(nodes)
        self.held: dict[str, Node] = {}
        self.queue: list[tuple[str, bool]] = []

    def ready(self, unit: str, gpu: bool, again: bool = False) -> None:
        """`unit` waits for a node (one with a GPU where `gpu`): last, or first when it is dealt `again`."""
        if unit in self.held or any(unit == u for u, _ in self.queue):
            raise ValueError(f"unit {unit!r} is already placed or waiting")
        self.queue.insert(0 if again else len(self.queue), (unit, bool(gpu)))

    def place(self) -> list[tuple[str, Node]]:
        """The waiting units given a free node now, each with its node, in queue order; one line naming a unit no
        live node suits."""
        busy = {n.id for n in self.held.values()}
        placed = []
        for unit, gpu in list(self.queue):
            suits = [n for n in self.live if n.gpus >= 1 or not gpu]
            if not suits:
                raise MoespecError(f"{unit}: no live node of the Ray cluster {'has a GPU' if gpu else 'is left'}")
            free = sorted((n for n in suits if n.id not in busy), key=lambda n: n.gpus >= 1)  # stable: list order
            if free:
                busy.add(free[0].id)
                self.held[unit] = free[0]
                self.queue.remove((unit, gpu))
                placed.append((unit, free[0]))
        return placed

    def release(self, unit: str) -> Node:
        """The node `unit` held, free again."""
        if unit not in self.held:
            raise ValueError(f"unit {unit!r} holds no node")
        return self.held.pop(unit)

    def refresh(self, nodes: Sequence[Node]) -> None:
        """The live nodes now: a lost one takes no further unit, a new one takes the next."""
        self.live = list(nodes)


@dataclass(frozen=True)
class WholeNode:
    """A unit of `on_whole_nodes`: fn(*args), on a node with a GPU where `gpu`, once the tasks `after` (their refs,
    by the names a failure of theirs is said with) are done."""

    args: tuple
    gpu: bool = False
    after: dict[str, Any] = field(default_factory=dict, hash=False)


def on_whole_nodes(ray: Any, fn: Callable[..., Any], units: dict[str, WholeNode]) -> Iterator[tuple[str, Any]]:
    """`fn(*unit.args)` for every unit (by name), each once its `after` tasks are done, on a free live node of its
    own (Nodes) that it holds whole: a Ray task pinned there and asking for all of that node's CPUs, so nothing else
    runs there while it does. Pinned by NodeAffinitySchedulingStrategy(node_id, soft=False), which per Ray's docs
    schedules the task on that node only, waiting there until its resources are free, and fails it when the node no
    longer exists (https://docs.ray.io/en/latest/ray-core/api/doc/
    ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy.html). Its worker dying is retried there
    RETRIES times by Ray; its node lost, it is dealt to another node, RETRIES times. Yields (name, result) as each
    finishes; a unit's own problem, or one of a task it waits for, is its one line (as `results`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    remote = ray.remote(max_retries=RETRIES)(_after)
    book = Nodes(live_nodes(ray))
    waiting = dict(units)
    running: dict[Any, str] = {}
    dealt: Counter[str] = Counter()
    while waiting or book.queue or running:
        after = list(dict.fromkeys(ref for unit in waiting.values() for ref in unit.after.values()))  # unique
        done, unresolved = ray.wait(after, num_returns=len(after), timeout=0) if after else ([], [])
        for name, unit in list(waiting.items()):
            if all(ref in done for ref in unit.after.values()):
                for what, ref in unit.after.items():
                    _got(ray, ref, what)
                book.ready(name, waiting.pop(name).gpu)
        for name, node in book.place():
            pinned = NodeAffinitySchedulingStrategy(node.id, soft=False)
            running[remote.options(num_cpus=node.cpus, num_gpus=int(units[name].gpu),
                                   scheduling_strategy=pinned).remote(fn, units[name].args, sys.argv)] = name
        if not running and not unresolved:
            continue
        [ref], _ = ray.wait([*running, *unresolved], num_returns=1)
        if ref not in running:
            continue
        name = running.pop(ref)
        node = book.release(name)
        book.refresh(live_nodes(ray))
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as e:
            if _lost(ray, e, node, book.live) and dealt[name] < RETRIES:
                dealt[name] += 1
                book.ready(name, units[name].gpu, again=True)
                continue
            result = _got(ray, ref, name)
        yield name, result


def _lost(ray: Any, e: BaseException, node: Node, live: Sequence[Node]) -> bool:
    """Whether a unit failed because its node is gone, not by its own doing."""
    if isinstance(e, ray.exceptions.RayTaskError):
        return False
    return isinstance(e, (ray.exceptions.NodeDiedError, ray.exceptions.TaskUnschedulableError)) or \
        node.id not in {n.id for n in live}
