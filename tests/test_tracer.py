"""The tracer on tiny random checkpoints of all five MoE classes, through the command a user runs.

The recorded ids must equal the top-m of the router logits the model itself returns (output_router_logits on
one unchunked forward pass), selected by each class's own rule, re-derived here independently of the
tracer's hooks. Tokens whose m-th and (m+1)-th scores lie closer than a float tolerance are ambiguous (the
chunked and unchunked passes may round differently) and are skipped; there must be few of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moespec import cli
from moespec.formats.trace import load_trace
from moespec.model.spec import SUPPORTED_MODEL_TYPES
from moespec.routing import documents, tracer

DOCS = [
    " = The Cat = \n the cat sat on the mat and the dog ran to the park . \n",
    " = Trees = \n a bird sang in the tall tree while rain fell . \n = = Rain = = \n the rain fell on the park "
    "and the cat ran to the tall tree . \n",
    " = Experts = \n experts route tokens to layers of a model ; each layer picks a few of many experts "
    "for every token . the dog sat . \n",
]
TIE_TOLERANCE = 1e-4  # score gaps below this may flip between chunked and unchunked float arithmetic
CHUNK = "7"  # small, so every document spans several chunks and the KV cache must carry across them


@pytest.fixture()
def wikitext(tmp_path: Path) -> Path:
    path = tmp_path / "wiki.txt"
    path.write_text("\n" + "".join(DOCS))  # a leading blank line, as in WikiText raw files
    return path


def trace(model: Path, out: Path, *args: str) -> int:
    return cli.main(["trace", "--model", str(model), "--out", str(out), "--chunk", CHUNK, *args])


def reference(model_type: str, config, logits):
    """(ids sorted [T, m], weights in the same order, ambiguity margin [T]) from one layer's router logits."""
    import torch

    m, n = config.num_experts_per_tok, logits.shape[-1]
    logits = logits.float()
    if model_type == "gpt_oss":  # top-m of the (biased) logits, softmax over the selected ones
        scores = logits
        top, ids = scores.topk(m)
        weights = top.softmax(-1)
    else:
        scores = logits.softmax(-1)
        group_margin = torch.full(scores.shape[:1], float("inf"))
        if model_type == "deepseek_v2" and config.topk_method == "group_limited_greedy":
            groups = scores.view(-1, config.n_group, n // config.n_group).max(-1).values
            best = groups.sort(-1, descending=True).values
            group_margin = best[:, config.topk_group - 1] - best[:, config.topk_group]
            keep = torch.zeros_like(groups, dtype=torch.bool).scatter(1, groups.topk(config.topk_group).indices, True)
            scores = scores.masked_fill(~keep.repeat_interleave(n // config.n_group, dim=1), 0.0)
        weights, ids = scores.topk(m)
        if model_type == "deepseek_v2":
            weights = weights * config.routed_scaling_factor
        elif model_type == "mixtral" or config.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
    ranked = scores.sort(-1, descending=True).values
    margin = ranked[:, m - 1] - ranked[:, m]
    if model_type == "deepseek_v2":
        margin = torch.minimum(margin, group_margin)
    order = ids.argsort(-1)
    return ids.gather(-1, order).numpy(), weights.gather(-1, order).numpy(), margin.numpy()


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_trace_matches_model_router(model_type, tiny_checkpoints, wikitext, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_checkpoints[model_type]
    out = tmp_path / "trace.npz"
    assert trace(folder, out, "--text", str(wikitext)) == 0
    t = load_trace(out)
    assert not out.with_name(out.name + ".partial").exists()

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    lengths = [len(tokenizer(d)["input_ids"]) for d in DOCS]
    assert t.doc_starts.tolist() == np.cumsum([0, *lengths]).tolist()
    assert t.meta["synthetic"] is False and t.meta["model_type"] == model_type
    assert t.meta["source"].startswith("wiki.txt:") and t.meta["tokenizer"]
    spec = t.meta["spec"]
    assert t.num_layers == spec["layers"] - len(spec["dense_layers"]) == 2  # deepseek, qwen3: 3 with one dense

    ambiguous = checked = 0
    for doc, (start, stop) in enumerate(t.documents()):
        ids = torch.tensor(tokenizer(DOCS[doc])["input_ids"])[None]
        with torch.no_grad():
            router_logits = model(ids, output_router_logits=True).router_logits
        assert len(router_logits) == t.num_layers  # dense layers have no router
        for layer, logits in enumerate(router_logits):
            want_ids, want_w, margin = reference(model_type, model.config, logits)
            got = t.experts[start:stop, layer].astype(np.int64)
            order = got.argsort(-1)
            got_ids = np.take_along_axis(got, order, -1)
            got_w = np.take_along_axis(t.weights[start:stop, layer], order, -1)
            clear = margin > TIE_TOLERANCE
            ambiguous += int((~clear).sum())
            checked += int(clear.sum())
            np.testing.assert_array_equal(got_ids[clear], want_ids[clear])
            np.testing.assert_allclose(got_w[clear], want_w[clear], rtol=1e-4, atol=1e-5)
            # stored by decreasing router weight
            assert np.all(np.diff(t.weights[start:stop, layer], axis=-1) <= 0)
    assert ambiguous <= 0.05 * (ambiguous + checked)


def test_resume_after_interruption_equals_uninterrupted_run(tiny_checkpoints, wikitext, tmp_path, monkeypatch):
    folder = tiny_checkpoints["olmoe"]
    whole = tmp_path / "whole.npz"
    assert trace(folder, whole, "--text", str(wikitext)) == 0

    real = tracer.trace_document
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "resumed.npz"
    monkeypatch.setattr(tracer, "trace_document", interrupted)
    assert trace(folder, out, "--text", str(wikitext)) == 130
    partial = out.with_name(out.name + ".partial")
    assert sorted(p.name for p in partial.iterdir()) == ["doc_000000.npz", "state.json"] and not out.exists()

    calls.clear()
    monkeypatch.setattr(tracer, "trace_document", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert trace(folder, out, "--text", str(wikitext)) == 0
    assert len(calls) == len(DOCS) - 1  # the finished document was not traced again
    a, b = load_trace(whole), load_trace(out)
    np.testing.assert_array_equal(a.experts, b.experts)
    np.testing.assert_array_equal(a.doc_starts, b.doc_starts)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not partial.exists()


def test_partial_run_with_other_inputs_is_refused(tiny_checkpoints, wikitext, tmp_path, monkeypatch, capsys):
    folder = tiny_checkpoints["olmoe"]
    out = tmp_path / "t.npz"

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tracer, "trace_document", stop)
    assert trace(folder, out, "--text", str(wikitext), "--max-tokens", "20") == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert trace(folder, out, "--text", str(wikitext)) == 2
    assert "unfinished run with other inputs" in capsys.readouterr().err


def test_wikitext_split():
    text = "\n preface line \n" + "".join(DOCS) + " = \n = = = Deep = = = \n"
    docs = documents.split_wikitext(text)
    assert docs[0] == "\n preface line \n" and docs[1:3] == DOCS[:2]
    assert " = = Rain = = " in docs[2]  # a sub-heading does not split
    assert docs[3] == DOCS[2] + " = \n = = = Deep = = = \n"  # neither does a lone "=" or a level-3 heading
    assert documents.split_wikitext("no headings at all\nsecond line\n") == ["no headings at all\nsecond line\n"]
    assert documents.split_wikitext(" \n\n") == []


def test_jsonl_list_field_and_max_tokens(tiny_checkpoints, tmp_path):
    from transformers import AutoTokenizer

    folder = tiny_checkpoints["mixtral"]
    records = [{"turns": ["the cat sat on the mat .", "and the dog ran ."]}, {"turns": "a bird sang in the tree"},
               {"turns": ["experts route tokens"]}]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = ["the cat sat on the mat .\n\nand the dog ran .", "a bird sang in the tree", "experts route tokens"]
    lengths = [len(tokenizer(x)["input_ids"]) for x in texts]

    out = tmp_path / "j.npz"
    assert trace(folder, out, "--jsonl", str(path), "--field", "turns") == 0
    t = load_trace(out)
    assert t.document_lengths.tolist() == lengths and t.meta["source"].endswith("#turns")

    cap = lengths[0] + 2  # stops inside the second document
    assert trace(folder, out, "--jsonl", str(path), "--field", "turns", "--max-tokens", str(cap)) == 0
    assert load_trace(out).document_lengths.tolist() == [lengths[0], 2]


def _no_moe_checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    return folder


@pytest.mark.parametrize("case, needle", [
    ("missing model", "no such directory"),
    ("not moe", "not a supported MoE"),
    ("empty text", "no documents"),
    ("missing text", "no such file"),
    ("bad jsonl", "q.jsonl:2: not readable JSON"),
    ("missing field", "field 'turns' missing"),
    ("bad chunk", "argument --chunk: expected an integer in 1.."),
])
def test_bad_inputs_exit_2_with_one_line(case, needle, tiny_checkpoints, wikitext, tmp_path, capsys):
    model, source = tiny_checkpoints["olmoe"], ["--text", str(wikitext)]
    extra: list[str] = []
    if case == "missing model":
        model = tmp_path / "nowhere"
    elif case == "not moe":
        model = _no_moe_checkpoint(tmp_path)
    elif case == "empty text":
        (tmp_path / "empty.txt").write_text("\n  \n")
        source = ["--text", str(tmp_path / "empty.txt")]
    elif case == "missing text":
        source = ["--text", str(tmp_path / "none.txt")]
    elif case in ("bad jsonl", "missing field"):
        (tmp_path / "q.jsonl").write_text('{"turns": ["a"]}\n' + ("{oops\n" if case == "bad jsonl" else '{"x": 1}\n'))
        source = ["--jsonl", str(tmp_path / "q.jsonl"), "--field", "turns"]
    elif case == "bad chunk":
        extra = ["--chunk", "0"]
    try:
        rc = cli.main(["trace", "--model", str(model), *source, "--out", str(tmp_path / "o.npz"), *extra])
    except SystemExit as e:  # argparse rejects bad flag values itself
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "o.npz").exists()
