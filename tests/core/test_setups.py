from __future__ import annotations

import pytest

from app.core.errors import SetupError
from app.core.setups import Sampling, grammar, parse_setup
from app.lanes.baseline import Baseline
from app.lanes.draft import DraftModel
from app.lanes.hf_library import HFAssisted, HFLookup
from app.lanes.ngram import NGram
from app.lanes.trtllm import TRTLLM


@pytest.mark.parametrize(
    "text, expected",
    [
        ("baseline", Baseline()),
        ("draft:qwen,k=4", DraftModel("qwen", 4, "constant")),
        ("draft:qwen", DraftModel("qwen", 4, "constant")),
        ("draft:qwen,k=6,schedule=heuristic", DraftModel("qwen", 6, "heuristic")),
        (" draft: /tmp/m.gguf , k=2 ", DraftModel("/tmp/m.gguf", 2)),
        ("draft:qwen,k=8,stop=0.4", DraftModel("qwen", 8, "constant", 0.4)),
        ("draft:qwen,k=8,dtype=int8", DraftModel("qwen", 8, "constant", 0.0, dtype="int8")),
        ("draft:qwen,k=20,cstop=0.4,dtype=int8", DraftModel("qwen", 20, dtype="int8", cstop=0.4)),
        ("hf-assisted:qwen,dtype=bfloat16", HFAssisted("qwen", None, "bfloat16")),
        ("ngram", NGram(3, 8)),
        ("ngram:n=2", NGram(2, 8)),
        ("ngram:n=4,k=10", NGram(4, 10)),
        ("hf-assisted:qwen", HFAssisted("qwen", None)),
        ("hf-assisted:qwen,k=5", HFAssisted("qwen", 5)),
        ("hf-lookup", HFLookup(10)),
        ("hf-lookup:k=3", HFLookup(3)),
        ("trtllm:llama-eagle3", TRTLLM("llama-eagle3")),
    ],
)
def test_parse(text, expected):
    s = parse_setup(text)
    assert s == expected
    assert parse_setup(s.label) == s  # labels round-trip


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("greedy", "unknown method"),
        ("draft", "needs an engine"),
        ("draft:k=4", "needs an engine"),
        ("draft:q,k=0", "k must be in [1, 256]"),
        ("draft:q,k=-2", "k must be in [1, 256]"),
        ("draft:q,k=two", "integer"),
        ("draft:q,schedule=fast", "schedule"),
        ("draft:q,stop=1.5", "stop must be in [0, 1)"),
        ("draft:q,stop=high", "stop must be a number"),
        ("draft:q,cstop=1", "cstop must be in [0, 1)"),
        ("draft:q,kk=3", "unknown parameter"),
        ("draft:q,k=3,k=4", "twice"),
        ("ngram:n=0", "n must be in [1, 16]"),
        ("ngram:3", "key=value"),
        ("baseline:k=2", "no parameters"),
        ("hf-lookup:n=2", "unknown parameter"),
        ("trtllm:", "engine name"),
        ("draft:q,dtype=int4", "dtype must be one of"),
        ("hf-assisted:q,dtype=fp8", "dtype must be one of"),
    ],
)
def test_bad_setups_carry_the_grammar(text, why):
    with pytest.raises(SetupError) as e:
        parse_setup(text)
    msg = str(e.value)
    assert why in msg
    assert grammar() in msg


def test_sampling_validation():
    assert Sampling().validated().greedy
    for bad, word in [(Sampling(temperature=-0.1), "temperature"), (Sampling(top_p=0.0), "top-p"), (Sampling(top_p=1.5), "top-p"), (Sampling(top_k=-1), "top-k"), (Sampling(max_new_tokens=0), "max new tokens")]:
        with pytest.raises(SetupError, match=word):
            bad.validated()
