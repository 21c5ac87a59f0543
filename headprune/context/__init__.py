"""Which KV heads need the whole context: the streaming curve (:mod:`.curve`), the largest share that can stream
and the held-out choice (:mod:`.choice`), the pattern users take away (:mod:`.pattern`) and the study's sentences
(:mod:`.summary`). The stage that composes them: :mod:`headprune.stages.context`."""
