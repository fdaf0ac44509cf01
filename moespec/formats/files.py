"""What every result file shares: the output check (and that no output is one of the command's inputs), the lock
held while it is written (moespec.formats.lock), atomic writes (temp file + rename, so a crash never leaves a
half-written result; any failed write one line), the one JSON reader, a file's sha256, the provenance block every
result file carries (device, dtype, versions, time, the exact command), the one walker of dotted keys with its type
check, and `Record`, the typed record a format's loader returns (the validated document, read like the JSON object
it is)."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from moespec import MoespecError, __version__
from moespec.arguments import show
from moespec.defaults import MAGNITUDE_LIMIT
from moespec.formats.lock import locked


def os_reason(e: OSError) -> str:
    """An OSError in the words of a one-line message ("no space left on the device", "file name too long")."""
    if e.errno == errno.ENOSPC:
        return "no space left on the device"
    text = e.strerror or type(e).__name__
    return text[:1].lower() + text[1:]


def absolute(path: str | os.PathLike, name: str) -> Path:
    """`path` made absolute; one line naming it (`name`) when it is relative and the working folder is gone."""
    path = Path(path)
    try:
        return path if path.is_absolute() else Path(os.getcwd()) / path
    except OSError:
        raise MoespecError(f"{name}: a relative path, and the working folder no longer exists") from None


def check_output(path: str | os.PathLike, flag: str | None = "--out") -> Path:
    """`path` as a place moespec may write a result: a new name or a regular file, in a folder that exists or can be
    made and is writable. Called before any work, so a bad --out costs nothing; one line naming the flag otherwise.
    A directory, a device, a FIFO or a symlink is never replaced (writing /dev/full as root would destroy it)."""
    if not str(path):
        raise MoespecError(f"{flag or 'output'}: an empty path")
    name = f"{flag} {path}" if flag else str(path)
    if str(path).endswith(("/", os.sep)):  # Path() drops the slash: a file named after the folder would be written
        raise MoespecError(f"{name}: ends in a slash, a folder; give the name of the file to write")
    path = Path(path)
    absolute(path, name)  # a relative path with the working folder gone: one line
    try:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            kind = "a symlink" if path.is_symlink() else "a directory" if path.is_dir() else "not a regular file"
            raise MoespecError(f"{name}: {kind}; moespec writes only new names or regular files")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:  # atomic_write makes the missing folders
            folder = folder.parent
        writable = folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
    except OSError as e:  # a name too long, a folder this user may not search
        raise MoespecError(f"{name}: {os_reason(e)}") from None
    if not writable:
        raise MoespecError(f"{name}: {folder} is not a folder this user can write in")
    return path


def _same(a: Path, b: Path) -> bool:
    """Whether the absolute paths `a` and `b` are one file (through symlinks and hard links too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing or unreachable: one file only under one name
        return os.path.realpath(a) == os.path.realpath(b)


def check_apart(outputs: Mapping[str, str | os.PathLike | None],
                inputs: Mapping[str, Iterable[str | os.PathLike]]) -> None:
    """Refuse, before any work, an output that is the same file as one the command reads (through a symlink or a
    hard link too), or as another of its outputs: writing it would destroy the input, or one output would replace
    the other. `outputs`: flag -> the path given (None: none); `inputs`: flag -> the files read through it. One
    line naming both flags."""
    taken = [(f"{flag} {file}", absolute(file, f"{flag} {file}")) for flag, files in inputs.items() for file in files]
    for flag, given in outputs.items():
        if given is None:
            continue
        name = f"{flag} {given}"
        path = absolute(given, name)
        clash = next((other for other, file in taken if _same(path, file)), None)
        if clash:
            raise MoespecError(f"{name}: the same file as {clash}, which writing it would destroy")
        taken.append((name, path))


@contextmanager
def writing(*paths: str | os.PathLike | None, flag: str | None = "--out") -> Iterator[None]:
    """Hold the outputs `paths` (None entries skipped) for the block: each checked (check_output), its missing
    folders made and its lock taken, so a second moespec process writing one of them is refused in one line. A
    job holds its outputs for its whole run (checkpoint included); atomic_write holds its file while it writes.
    Folders made here and left empty are removed again at the end."""
    made: list[Path] = []
    with ExitStack() as stack:
        try:
            for path in (check_output(p, flag) for p in paths if p is not None):
                name = f"{flag} {path}" if flag else str(path)
                try:
                    folder = path.parent
                    while not folder.exists():
                        made.append(folder)
                        folder = folder.parent
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise MoespecError(f"{name}: cannot make its folder ({os_reason(e)})") from None
                stack.enter_context(locked(path, name))
            yield
        finally:
            stack.close()
            for folder in made:  # deepest first
                try:
                    folder.rmdir()
                except OSError:
                    break


Job = TypeVar("Job", bound=Callable[..., Any])


def holds_outputs(outputs: Callable[[Any], Iterable[str | os.PathLike | None]]) -> Callable[[Job], Job]:
    """Decorate a job `job(config, ...)` so the outputs `outputs(config)` are held (writing) while it runs: a second
    process writing one of them is refused before it does any work."""
    def decorate(job: Job) -> Job:
        @functools.wraps(job)
        def held(config: Any, *args: Any, **kwargs: Any) -> Any:
            with writing(*outputs(config)):
                return job(config, *args, **kwargs)
        return held  # type: ignore[return-value]
    return decorate


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary path in the target's folder, then rename it onto `path`.

    The rename is atomic on POSIX, so readers see either the old file or the whole new one. The file gets the
    permissions a plain open() would (0666 less the umask), a target that is not a regular file is refused
    (check_output), another moespec process writing it is refused (writing), and a failed write (a full disk, a name
    too long, a file the system will not replace) is one line naming the file."""
    with writing(path, flag=None):
        _replace(Path(path), write)
    return Path(path)


def _replace(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) then the rename onto `path` (atomic_write); any OSError on the way (a full disk, a file too
    large, a target the system refuses to replace) is one line naming `path`, and the temporary file is removed."""
    tmp: str | None = None
    try:
        # the temporary name stays within the 255 bytes a name may have, however long the target's is
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=path.suffix[:16])
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
        write(Path(tmp))
        check_output(path, None)  # nothing took the name's place meanwhile
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with suppress(OSError):
                Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise MoespecError(f"{path}: cannot write it ({os_reason(e)})") from None
        raise


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write `obj` as indented JSON."""
    return atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=1) + "\n"))


def check_input(path: str | os.PathLike, what: str) -> Path:
    """`path` as a `what` file to read: one line naming it when it is missing, a directory or not a regular file
    (reading a FIFO would wait forever)."""
    path = Path(path)
    if not path.exists():
        raise MoespecError(f"{path}: no such {what} file")
    if not path.is_file():
        raise MoespecError(f"{path}: {'a directory' if path.is_dir() else 'not a regular file'}, not a {what} file")
    return path


NESTING_LIMIT = 100  # JSON nested deeper is refused: moespec's files nest a few levels, and its validators recurse


def _looks_like(raw: bytes) -> str | None:
    """What a file given where JSON is expected is instead, by its first bytes; None where it may be JSON."""
    if raw.startswith(b"GGUF"):
        return "a GGUF file"
    if raw.startswith(b"PK\x03\x04"):
        return "a zip archive (an .npz trace?)"
    if len(raw) > 8 and raw[8:9] == b"{" and int.from_bytes(raw[:8], "little") <= len(raw) - 8:
        return "a safetensors file"  # an 8-byte little-endian header length, then the JSON header
    if b"\0" in raw[:4096]:
        return "a binary file"
    return None


def _depth(doc: Any) -> int:
    """How deep `doc` nests (a scalar: 0), counted without recursion and only up to past NESTING_LIMIT."""
    deepest, stack = 0, [(doc, 1)]
    while stack and deepest <= NESTING_LIMIT:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json(raw: bytes, where: str) -> Any:
    """The JSON document in `raw`, the bytes of `where` (a file, a line of one); one line naming `where` for
    anything else: another format (by its first bytes), bad UTF-8, a syntax error, an integer past Python's digit
    limit, nesting deeper than NESTING_LIMIT."""
    kind = _looks_like(raw)
    if kind:
        raise MoespecError(f"{where}: {kind}, not JSON")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError and the digit limit are ValueErrors
        raise MoespecError(f"{where}: not readable JSON ({' '.join(str(e).split())[:120]})") from None
    if _depth(doc) > NESTING_LIMIT:
        raise MoespecError(f"{where}: not readable JSON (nested deeper than {NESTING_LIMIT} levels)")
    return doc


def read_json_bytes(path: str | os.PathLike, what: str) -> tuple[Any, bytes]:
    """The JSON document in `path` (a `what` file) and the exact bytes it was read from (for a sha256); one line
    naming the file when it is missing, unreadable or not JSON (parse_json)."""
    path = check_input(path, what)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise MoespecError(f"{path}: cannot read it ({os_reason(e)})") from None
    return parse_json(raw, str(path)), raw


def format_problem(doc: Any, what: str, name: str, current: int, label: str | None = None) -> str | None:
    """Why `doc` is not a JSON object of format `name` (a moespec `label`, default "`what` file") at a version this
    moespec reads (version_problem), or None: the first check of every loader."""
    if not isinstance(doc, dict) or doc.get("format") != name:
        return f"not a moespec {label or what + ' file'} (format is not {name!r})"
    return version_problem(doc, what, current)


def version_problem(doc: Mapping[str, Any], what: str, current: int) -> str | None:
    """Why `doc` (a `what` file) has a format version this moespec does not read, or None. At 0.x a loader reads
    its format's current version and the one before it (what the previous release wrote, results/ included), filling
    the keys the older one lacks; a format change moves its version and the package's minor version."""
    version = doc.get("format_version")
    if isinstance(version, bool) or version not in (current - 1, current):
        return f"{what} format version {show(version)} is not supported (this moespec reads versions " \
               f"{current - 1} and {current})"
    return None


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 (hex) of the bytes of the file at `path`, read in blocks (a trace may be large)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON document in `path` (a `what` file); one line naming the file when it is missing or unreadable."""
    return read_json_bytes(path, what)[0]


@functools.lru_cache(maxsize=1)
def source_commit() -> dict[str, Any] | None:
    """The git commit of the moespec source that runs, and whether its tracked files differ from it (`dirty`);
    None where moespec is not run from a git checkout (an installed wheel) or git is absent."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or status.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def provenance(device: str = "cpu", dtype: str | None = None) -> dict[str, Any]:
    """Who made a result and how: device, dtype, library versions, the source's git commit (source_commit), UTC
    timestamp and the exact command."""
    versions = {"moespec": __version__, "python": platform.python_version()}
    for name in ("numpy", "torch", "transformers", "triton", "ggml", "llama_cpp"):  # loaded: the kernels timed
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    if "torch" in sys.modules and sys.modules["torch"].version.cuda:
        versions["cuda"] = sys.modules["torch"].version.cuda
    return {
        "device": device,
        "host": f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores",
        "dtype": dtype,
        "versions": versions,
        "git": source_commit(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }



NUMBER = (int, float)


def field(doc: Any, where: str, keys: str, kind: type | tuple[type, ...] = NUMBER) -> Any:
    """doc[k1][k2]... for keys "k1.k2..."; one line naming the file (`where`) and the key when it is absent or of the
    wrong kind (bools are not numbers; numbers must be finite, of magnitude at most MAGNITUDE_LIMIT)."""
    node = doc
    parts = keys.split(".")
    for i, key in enumerate(parts):
        if not isinstance(node, Mapping) or key not in node:
            raise MoespecError(f"{where}: missing key {'.'.join(parts[:i + 1])!r}")
        node = node[key]
    if isinstance(node, bool) or not isinstance(node, kind) or (kind is NUMBER and not is_number(node)):
        raise MoespecError(f"{where}: {keys} has the wrong type or value ({node!r})")
    return node


def positive(doc: Any, where: str, keys: str) -> float:
    """field(doc, where, keys): a finite number > 0 (a time, a bandwidth); one line naming the file and the key."""
    value = field(doc, where, keys)
    if not value > 0:
        raise MoespecError(f"{where}: {keys} = {value!r} must be positive")
    return value


def check_level_record(doc: Mapping[str, Any], where: str) -> None:
    """doc["level"] where present (bench.json, runs.json; written by moespec.measure.level.Level.record): an
    object whose pinned_gbps is null or positive and whose band, wait_s and waited_s are finite numbers >= 0."""
    level = doc.get("level")
    if level is None:
        return
    if not isinstance(level, Mapping):
        raise MoespecError(f"{where}: level must be an object, got {type(level).__name__}")
    if level.get("pinned_gbps") is not None and not (is_number(level["pinned_gbps"]) and level["pinned_gbps"] > 0):
        raise MoespecError(f"{where}: level.pinned_gbps = {level['pinned_gbps']!r} must be null or positive")
    for key in ("band", "wait_s", "waited_s"):
        if not (is_number(level.get(key)) and level[key] >= 0):
            raise MoespecError(f"{where}: level.{key} = {level.get(key)!r} must be a number >= 0")


CONTENTION_COUNTS = ("cores", "threads", "calls", "contended", "fewer_threads", "others_max")


def check_contention_record(record: Any, where: str, key: str) -> None:
    """A contention record where present (bench.json `contention`, runs.json `contention.verify` and
    `.throughput`; written by moespec.measure.contention.Cores.take): null, or an object of whole counts >= 0 (at
    most `calls` contended or on fewer threads) and a wait_share_max >= 0."""
    if record is None:
        return
    if not isinstance(record, Mapping):
        raise MoespecError(f"{where}: {key} must be an object or null, got {type(record).__name__}")
    for name in CONTENTION_COUNTS:
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MoespecError(f"{where}: {key}.{name} = {value!r} must be a whole number >= 0")
    if record["contended"] > record["calls"] or record["fewer_threads"] > record["calls"]:
        raise MoespecError(f"{where}: {key} counts more contended calls than its {record['calls']} calls")
    if not (is_number(record.get("wait_share_max")) and record["wait_share_max"] >= 0):
        raise MoespecError(f"{where}: {key}.wait_share_max = {record.get('wait_share_max')!r} must be a number >= 0")


def check_numbers(doc: Any, where: str, keys: str, positive: bool) -> None:
    """Every leaf of the object or list at doc[k1][k2]... a finite number (> 0 where `positive`, e.g. times); one
    line naming the file and the dotted key of the first that is not."""
    def walk(node: Any, key: str) -> None:
        if isinstance(node, (Mapping, list)):
            for k, v in (node.items() if isinstance(node, Mapping) else enumerate(node)):
                walk(v, f"{key}.{k}")
        elif not (is_number(node) and (node > 0 or not positive)):
            raise MoespecError(f"{where}: {key} = {node!r} must be a {'positive ' if positive else ''}finite number")
    walk(field(doc, where, keys, (dict, list)), keys)


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool) of magnitude at most MAGNITUDE_LIMIT."""
    # an int is finite however long (np.isfinite and math.isfinite refuse one past a float's range)
    return (isinstance(x, NUMBER) and not isinstance(x, bool) and (isinstance(x, int) or math.isfinite(x))
            and abs(x) <= MAGNITUDE_LIMIT)


def is_interval(x: Any) -> bool:
    """A [lo, hi] pair of numbers (is_number), as results files write 95% intervals."""
    return isinstance(x, list) and len(x) == 2 and all(is_number(v) for v in x)


class Record(dict):
    """A validated result document and the file it came from. It is the JSON object itself (a dict: read it as
    `rec["key"]`, write it with json); a format's subclass adds typed accessors for what later stages decide on."""

    def __init__(self, doc: dict[str, Any], path: str | os.PathLike | None = None) -> None:
        super().__init__(doc)
        self.path = None if path is None else str(path)

    @property
    def model(self) -> str:
        """The model the file is of (every moespec result file names it)."""
        return self["model"]

    @property
    def device_kind(self) -> str | None:
        return self.get("device_kind")

    @property
    def dtype(self) -> str | None:
        return self.get("dtype")

    @property
    def crossover(self) -> int | None:
        """The file's crossover n (bench, plan, runs), None where there is none."""
        return self.get("crossover")

    @property
    def doc(self) -> dict[str, Any]:
        """The document as a plain dict."""
        return dict(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path or 'in memory'})"

    @staticmethod
    def n_map(values: Mapping[str, Any]) -> dict[int, Any]:
        """A JSON object keyed by pass size or draft length ("1", "2", ...) with int keys."""
        return {int(n): v for n, v in values.items()}


def timestamp(doc: Any, where: str) -> datetime:
    """When a result file was made: its provenance timestamp (ISO; UTC where it names no zone)."""
    text = field(doc, where, "provenance.timestamp", str)
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise MoespecError(f"{where}: provenance.timestamp {text!r} is not an ISO time") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)  # moespec writes UTC
