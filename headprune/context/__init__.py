"""Which KV heads need the whole context: the streaming curve (:mod:`.curve`), the largest share that can stream
and the held-out choice (:mod:`.choice`), the pattern users take away (:mod:`.pattern`) and the study's sentences
(:mod:`.summary`). The stage that composes them: :mod:`headprune.stages.context`. Torch-free at import (the
command's help reads :data:`DEFAULT_SHARES`)."""

#: Shares of KV heads made streaming on the curve (besides 0, the full model).
DEFAULT_SHARES = (0.1, 0.25, 0.5, 0.75, 1.0)
