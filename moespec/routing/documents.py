"""The documents a trace is recorded on, and their tokens.

WikiText raw files are split at top-level headings (a line " = Title = "; " = = Sub = = " does not split); a JSONL
file gives one document per record, from a string field or a list of strings (MT-Bench "turns", joined by blank
lines). Each document is tokenized with the checkpoint's own tokenizer; a tokenizer's identity (class, size, a
hash of its vocabulary) and a source file's (name, sha256 prefix) go into the trace's metadata.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.formats.files import check_input, parse_json, sha256_file

HASH_CHARS = 16  # hex digits of sha256 kept in source and tokenizer ids: collisions are not a concern


_HEADING = re.compile(r"= (?!=).*(?<!=) =")  # a stripped top-level WikiText heading line, "= Title ="


# -- documents ---------------------------------------------------------------------------------------
def split_wikitext(text: str) -> list[str]:
    """Documents of a WikiText raw text: each top-level heading starts one; text before the first is its own."""
    docs: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _HEADING.fullmatch(line.strip()):
            docs.append([])
        docs[-1].append(line)
    return [d for d in ("".join(lines) for lines in docs) if d.strip()]


def read_jsonl(path: Path, field: str) -> list[str]:
    """One document per JSONL record: `field` is a string or a list of strings (joined by blank lines)."""
    docs = []
    for number, line in enumerate(_read_text(path, "--jsonl").splitlines(), 1):
        if not line.strip():
            continue
        record = parse_json(line.encode(), f"--jsonl {path}:{number}")
        value = record.get(field) if isinstance(record, dict) else None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = "\n\n".join(value)
        if not isinstance(value, str):
            raise MoespecError(f"--jsonl {path}:{number}: field {field!r} missing or not a string / list of strings")
        if value.strip():
            docs.append(value)
    return docs


def _read_text(path: Path, flag: str) -> str:
    if path.exists():
        check_input(path, "text")  # a FIFO or a device is refused: reading one would wait forever
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MoespecError(f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MoespecError(f"{flag} {path}: cannot read as UTF-8 text ({e})") from None


def load_documents(text: str | Path | None = None, jsonl: str | Path | None = None,
                   field: str = "text") -> tuple[list[str], str]:
    """The documents of a raw text file (`text`, WikiText headings split it) or of a JSONL file (`jsonl`, one per
    record's `field`) and a source id (file name, sha256 prefix, and the JSONL field)."""
    if (text is None) == (jsonl is None):
        raise MoespecError("give exactly one of a text file and a JSONL file")
    if jsonl is not None:
        path, flag = Path(jsonl), "--jsonl"
        docs = read_jsonl(path, field)
    else:
        path, flag = Path(text), "--text"
        docs = split_wikitext(_read_text(path, flag))
    if not docs:
        raise MoespecError(f"{flag} {path}: no documents (the file is empty or only whitespace)")
    source = f"{path.name}:{sha256_file(path)[:HASH_CHARS]}"
    return docs, source + (f"#{field}" if jsonl is not None else "")


def tokenize(encode: Callable[[str], Sequence[int]], docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
    """Token ids per document, `encode` turning one document's text into ids (a Hugging Face tokenizer, or
    llama.cpp's), truncated to max_tokens in all; documents without tokens are dropped."""
    out: list[np.ndarray] = []
    left = max_tokens
    for doc in docs:
        ids = np.asarray(encode(doc), dtype=np.int64)
        if left is not None:
            ids, left = ids[:left], left - min(left, ids.size)
        if ids.size:
            out.append(ids)
        if left == 0:
            break
    return out


def tokenizer_id(tokenizer: Any) -> str:
    """Class, vocabulary size and a hash of the vocabulary: identical ids mean identical tokenization tables."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    return f"{type(tokenizer).__name__}:{len(tokenizer)}:{hashlib.sha256(vocab).hexdigest()[:HASH_CHARS]}"
