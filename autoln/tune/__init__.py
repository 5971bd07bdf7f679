"""TODO face of tune."""

from autoln.tune._tune import (  # noqa: F401
    StorageGone,
    admitted,
    census,
    journal_backend,
    open_storage,
    open_study,
    outcome,
    run_tune,
    write_hparams,
)
