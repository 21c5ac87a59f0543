"""Which heads matter for a behaviour: activation patching on clean/corrupt prompt pairs, exact and approximate.

    pairs        PromptPairs, read_pairs (JSONL)            tasks        induction, ioi, brackets (task_pairs)
    metrics      logit_diff, logprob, kl; normalise         exact        patch_z, patch (z, q, k, v, pattern)
    attribution  atp_z, atp_star_z (GradDrop)               table        patch_table, position_table, agreement
    of q and k   atp_qk, atp_qkfix (QK-fix), atp_star_qk (QK-fix + GradDrop)
    missed       missed_bound (Subsampling): what the unverified heads can still hide (AtP*'s subsampling diagnostic)
"""

from headprune.patching.attribution import atp_star_z, atp_z
from headprune.patching.attribution_qk import atp_k, atp_q, atp_qk, atp_qkfix, atp_star_qk
from headprune.patching.exact import ACTIVATIONS, DIRECTIONS, Patching, PatchOptions, Runs, patch, patch_z, run_pairs
from headprune.patching.metrics import DEFAULT_METRIC, METRICS, normalise
from headprune.patching.missed import MissedBound, Subsampling, missed_bound
from headprune.patching.pairs import PromptPairs, read_pairs
from headprune.patching.table import agreement, patch_table, position_table
from headprune.patching.tasks import TASKS, task_pairs

__all__ = ["ACTIVATIONS", "DEFAULT_METRIC", "DIRECTIONS", "METRICS", "TASKS", "MissedBound", "PatchOptions",
           "Patching", "PromptPairs", "Runs", "Subsampling", "agreement", "atp_k", "atp_q", "atp_qk", "atp_qkfix",
           "atp_star_qk", "atp_star_z", "atp_z", "missed_bound", "normalise", "patch", "patch_table", "patch_z",
           "position_table", "read_pairs", "run_pairs", "task_pairs"]
