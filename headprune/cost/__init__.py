"""What a command will cost, said before it is spent: FLOPs counted from the model (:mod:`.flops`), this machine's
measured pace (:mod:`.rate`), the estimates each command prints (:mod:`.estimate`) and the run's token budget
(:mod:`.budget`)."""

from headprune.cost.budget import (
    MIN_SEQ_LEN,
    MIN_WINDOWS,
    REFERENCE_RATE,
    RUN_BUDGET_SECONDS,
    Budget,
    RunPlan,
    estimate_run,
    fixed_seconds,
    patching_seconds,
    run_budget,
    run_fe,
    run_lines,
    run_seconds,
)
from headprune.cost.estimate import (
    ESTIMATE_SPREAD,
    WARN_SECONDS,
    Estimate,
    cheaper_hint,
    duration,
    estimate_context,
    estimate_curves,
    estimate_layers,
    estimate_patching,
    estimate_scoring,
    estimate_verify,
    patching_fe,
    scoring_lines,
)
from headprune.cost.flops import (
    ablation_fe,
    block_flops,
    forward_flops,
    head_flops,
    layers_fe,
    methods_fe,
    verify_fe,
)
from headprune.cost.rate import CALIBRATION_REPEATS, Pace, measured_rate

__all__ = ["CALIBRATION_REPEATS", "ESTIMATE_SPREAD", "MIN_SEQ_LEN", "MIN_WINDOWS", "REFERENCE_RATE",
           "RUN_BUDGET_SECONDS", "WARN_SECONDS", "Budget", "Estimate", "Pace", "RunPlan", "ablation_fe",
           "block_flops", "cheaper_hint", "duration", "estimate_context", "estimate_curves", "estimate_layers",
           "estimate_patching", "estimate_run", "estimate_scoring", "estimate_verify", "fixed_seconds", "forward_flops",
           "head_flops",
           "layers_fe", "measured_rate", "methods_fe", "patching_fe", "patching_seconds", "run_budget", "run_fe",
           "run_lines", "run_seconds", "scoring_lines", "verify_fe"]
