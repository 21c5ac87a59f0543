"""Which KV heads need the whole context: the streaming curve (:mod:`.curve`), the largest share that can stream
and the held-out choice (:mod:`.choice`), the pattern users take away (:mod:`.pattern`) and the study's sentences
(:mod:`.summary`). The stage that composes them: :mod:`headprune.stages.context`. Torch-free at import (the
command's help and the report's section read these)."""

#: The default long window, the model's context up to this: SmolLM2's whole stage in 12.4 minutes on 2 AMD EPYC cores
#: (at 2,048 about 34 on 2 Intel Xeon cores, over the 30 it should take; the committed studies ask for 2,048).
MAX_SEQ_LEN = 1024

#: Shares of KV heads made streaming on the curve (besides 0, the full model).
DEFAULT_SHARES = (0.1, 0.25, 0.5, 0.75, 1.0)
