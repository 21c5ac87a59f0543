"""Analysis stages: each a function of typed inputs returning a typed result, composed by ``run``
(:mod:`headprune.pipeline`), the commands in :mod:`headprune.cli` and the studies in ``analyses/``, so that no
command rebuilds what another stage does. :mod:`.patching`: a patching study as the report shows it;
:mod:`.compensation`: the fills a compensated curve folds into b_O, fitted on the scoring split."""
