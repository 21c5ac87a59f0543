"""Head ids and head specs: round trips, tolerance of spelling, one precise HeadpruneError for anything else."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headprune.errors import HeadpruneError
from headprune.models.gpt2_config import GPT2Config
from headprune.models.heads import check_heads, format_heads, head_id, parse_head_spec

CFG = GPT2Config(vocab_size=100, n_positions=16, d_model=32, n_layers=3, n_heads=4, d_mlp=64)
PRUNED = GPT2Config(vocab_size=100, n_positions=16, d_model=32, n_layers=3, n_heads=4, d_mlp=64,
                     kept_heads=[[0, 2, 3], [], [0, 1, 2, 3]])
heads_st = st.tuples(st.integers(0, CFG.n_layers - 1), st.integers(0, CFG.n_heads - 1))


def test_head_id():
    assert head_id(0, 1) == "L0H1" and head_id(11, 10) == "L11H10"


def test_spelling_whitespace_case_duplicates_order():
    assert parse_head_spec(" l2h3 ,L0H1,L0 H1,  L 1 h 0 ,", CFG) == [(0, 1), (1, 0), (2, 3)]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("L99H0", "no layer 99"),
        ("L-1H0", "no layer -1"),
        ("L0H-1", "no head -1"),
        ("L0H4", "no head 4"),
        ("L0H1,garbage", "bad head id 'garbage'"),
        ("", "names no head"),
        (" , ", "names no head"),
        ("L0H1;L0H2", "bad head id"),
        ("H1L0", "bad head id"),
        ("L0H1\nL0H2", "bad head id"),
    ],
)
def test_bad_specs(spec, words):
    with pytest.raises(HeadpruneError, match=words) as err:
        parse_head_spec(spec, CFG)
    assert "\n" not in str(err.value)


def test_pruned_model_has_lost_heads():
    assert parse_head_spec("L0H2,L2H1", PRUNED) == [(0, 2), (2, 1)]
    with pytest.raises(HeadpruneError, match=r"L0H1 was already pruned.*keeps heads \[0, 2, 3\]"):
        parse_head_spec("L0H1", PRUNED)
    with pytest.raises(HeadpruneError, match="L1H0 was already pruned"):
        parse_head_spec("L1H0", PRUNED)


def test_check_heads_dedups_and_validates():
    assert check_heads(CFG, [(2, 1), (0, 3), (2, 1)]) == [(0, 3), (2, 1)]
    with pytest.raises(HeadpruneError):
        check_heads(CFG, [(3, 0)])


@given(st.lists(heads_st, min_size=1, max_size=12))
def test_round_trip(heads):
    spec = format_heads(heads)
    assert parse_head_spec(spec, CFG) == sorted(set(heads))
    assert parse_head_spec(spec.lower().replace(",", " , "), CFG) == sorted(set(heads))


@given(st.lists(heads_st, min_size=1, max_size=5), st.lists(st.sampled_from([" ", "\t", ""]), min_size=4, max_size=4))
def test_round_trip_with_whitespace(heads, ws):
    a, b, c, d = ws
    spec = ",".join(f"{a}L{b}{layer}{c}h{d}{head}{a}" for layer, head in heads)
    assert parse_head_spec(spec, CFG) == sorted(set(heads))


@settings(max_examples=300)
@given(st.one_of(st.text(), st.text(alphabet="lLhH0123456789-+, \t\n9x"), st.from_regex(r"[lL]-?\d+[hH]-?\d+")))
def test_garbage_only_raises_headprune_error(spec):
    try:
        heads = parse_head_spec(spec, PRUNED)
    except HeadpruneError as err:
        assert "\n" not in str(err)
    else:
        assert heads and all(h in PRUNED.kept_heads[layer] for layer, h in heads)


def test_spec_against_a_loaded_model(tiny_dir):
    from headprune.io.read.loading import load_model
    from headprune.pruning.prune import prune_model

    model = prune_model(load_model(tiny_dir), [(0, 1)])
    assert parse_head_spec("L0H0,L2H3", model) == [(0, 0), (2, 3)]
    with pytest.raises(HeadpruneError, match="already pruned"):
        parse_head_spec("L0H1", model)
