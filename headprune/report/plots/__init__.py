"""The report's figures, by what they draw: :mod:`.curves` (perplexity and ΔNLL against heads pruned),
:mod:`.maps` (layer x head heatmaps, the pruning order), :mod:`.scatters` (scores against abl_zero, rank
correlations), on what :mod:`.common` shares (PNG rendering, method colours from the method table, ranks);
:mod:`.figures` assembles them for the report."""

from headprune.report.plots.common import SCALES, Picture
from headprune.report.plots.figures import make_pictures

__all__ = ["SCALES", "Picture", "make_pictures"]
