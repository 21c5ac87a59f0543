"""The one method table (schema.METHOD_TABLE): every view derived from it says what the spread-out definitions said
(pinned literally here), the scorers, colours and run settings agree with it, and method specs are parsed once."""

from __future__ import annotations

import dataclasses

import pytest

from headprune import schema
from headprune.errors import HeadpruneError
from headprune.schema import METHOD_SPECS, METHOD_TABLE, check_methods, method_family, parse_methods


def test_derived_views_pinned():
    assert schema.WEIGHT_METHODS == ("wo_fro", "wo_spec", "ov_fro", "ov_spec")
    assert schema.ACTIVATION_METHODS == ("out_norm", "fluct", "entropy")
    assert schema.GRADIENT_METHODS == ("grad", "taylor")
    assert schema.ABLATION_METHODS == ("abl_zero", "abl_zero_folded", "abl_mean", "abl_opt")
    assert schema.RESAMPLE_METHODS == ("abl_resample",)
    assert schema.CONTEXT_METHODS == ("ctx_stream", "ctx_gate", "ctx_retrieval")
    assert schema.LEARNED_METHODS == ("gate",)
    assert schema.METHODS == (schema.WEIGHT_METHODS + schema.ACTIVATION_METHODS + schema.GRADIENT_METHODS
                              + schema.ABLATION_METHODS + schema.RESAMPLE_METHODS + schema.CONTEXT_METHODS)
    assert schema.ALL_METHODS == schema.METHODS + ("gate",)
    assert schema.DATA_METHODS == (schema.ACTIVATION_METHODS + schema.GRADIENT_METHODS + schema.ABLATION_METHODS
                                   + schema.RESAMPLE_METHODS + schema.CONTEXT_METHODS)
    assert schema.OPT_IN == ("abl_zero_folded", "abl_opt", "abl_resample", "ctx_stream", "ctx_gate", "ctx_retrieval")
    assert schema.DESCRIPTIVE == ("entropy",)
    assert schema.IMPORTANCE_METHODS == tuple(m for m in schema.METHODS if m != "entropy")
    assert schema.RANKABLE_METHODS == schema.IMPORTANCE_METHODS + ("gate",)
    assert list(schema.METHOD_FAMILIES) == ["weights", "activations", "gradients", "ablation", "resample",
                                           "context", "learned"]
    weight, delta = "weight norm", "ΔNLL, nats/token"
    assert schema.METHOD_UNITS == {
        "wo_fro": weight, "wo_spec": weight, "ov_fro": weight, "ov_spec": weight,
        "out_norm": "residual-stream norm", "fluct": "residual-stream norm²", "entropy": "nats",
        "grad": "nats/token per unit gate", "taylor": "nats/token",
        "abl_zero": delta, "abl_zero_folded": delta, "abl_mean": delta, "abl_opt": delta, "abl_resample": delta,
        "ctx_stream": delta, "ctx_gate": delta, "ctx_retrieval": "share of copy events", "gate": "P(gate open)"}


def test_table_rows():
    assert len({s.name for s in METHOD_TABLE}) == len(METHOD_TABLE) == 18
    assert all(s.label and s.unit for s in METHOD_TABLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        METHOD_SPECS["wo_fro"].opt_in = True  # type: ignore[misc]
    # the family of a table method, of a layer-normalized ranking, of random and of names outside the table
    assert [method_family(m) for m in ("fluct", "ov_spec@layer", "gate", "random", "wo_custom", "abl_x", "foo")] == [
        "activations", "weights", "learned", "random", "weights", "ablation", "other"]


def test_scorers_match_the_table():
    from headprune.scoring import FAMILY_SCORERS

    scored = {name: f.methods for name, f in FAMILY_SCORERS.items() if f.methods}
    assert scored == {f: m for f, m in schema.METHOD_FAMILIES.items() if f != "learned"}
    assert list(FAMILY_SCORERS) == ["weights", "activations", "gradients", "optimal fit", "ablation",
                                   "resample", "context"]  # run order
    assert all(f.needs_data == any(METHOD_SPECS[m].data_dependent for m in f.methods)
               for f in FAMILY_SCORERS.values() if f.methods)


def test_every_family_has_a_colour():
    from headprune.report.plots.common import FAMILY_COLORS, curve_styles, method_color

    assert set(schema.METHOD_FAMILIES) <= set(FAMILY_COLORS)
    assert method_color("abl_mean@layer") == method_color("abl_zero") == FAMILY_COLORS["ablation"]
    assert method_color("gate") == method_color("someone_elses") == "#D55E00"  # learned: the colour of "other"
    styles = curve_styles(["wo_fro", "grad", "wo_spec"])
    assert styles["wo_fro"]["ls"] != styles["wo_spec"]["ls"] and styles["wo_fro"]["ls"] == styles["grad"]["ls"]


def test_each_score_record_says_what_it_costs_and_whether_it_is_cheap_or_exact():
    """The record is complete: every computed method pays either a shared pass of its family or sweeps of its own;
    the cheap ones are exactly the families without an ablation sweep, the exact ones the ablations."""
    for spec in schema.METHOD_TABLE:
        if spec.family == "learned":
            assert spec.shared_fe is None and spec.sweeps == 0.0 and not spec.cheap
            continue
        assert (spec.shared_fe is None) != (spec.sweeps == 0.0), spec.name
        # the context family: its gate gradient and retrieval score share a pass, its exact sweep does not
        assert spec.cheap == (spec.family in ("weights", "activations", "gradients")
                              or spec.name in ("ctx_gate", "ctx_retrieval")), spec.name
        assert spec.exact == spec.name.startswith("abl_"), spec.name
        assert spec.color == schema.FAMILY_COLORS[spec.family]
    # forward passes as the scorers make them: none for the weights, one forward for activations, a forward and a
    # backward for gradients; abl_opt's fit ≈ 3 rounds × 16 ablation sweeps
    assert [METHOD_SPECS[m].shared_fe for m in ("wo_fro", "out_norm", "grad")] == [0.0, 1.0, 2.0]
    assert METHOD_SPECS["abl_opt"].sweeps == 48.0
    assert schema.is_cheap("wo_spec@layer") and not schema.is_cheap("abl_zero@layer") and not schema.is_cheap("x")


def test_parse_once_at_the_edge():
    from headprune.stages.settings import RunSettings

    assert parse_methods(["taylor,wo_fro", "abl_zero"]) == ["wo_fro", "taylor", "abl_zero"]
    assert check_methods(["abl_zero", "wo_fro"]) == ["wo_fro", "abl_zero"]  # names: checked and ordered, no "all"
    with pytest.raises(HeadpruneError, match="all"):
        check_methods(["all"])
    s = RunSettings(model="m", methods=("grad, wo_fro",), optimal=True)
    assert s.methods == ("wo_fro", "grad", "abl_opt")
    assert RunSettings(model="m").methods == tuple(m for m in schema.METHODS if m not in schema.OPT_IN)
    assert dataclasses.replace(s).methods == s.methods  # idempotent
    with pytest.raises(HeadpruneError, match="magic"):
        RunSettings(model="m", methods=("wo_fro,magic",))
