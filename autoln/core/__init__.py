"""The machinery under every job, which knows nothing of layer norms.

- :mod:`~autoln.core.errors`: the errors a user sees as one line (ConfigError, DataError, ...).
- :mod:`~autoln.core.io`: atomic writes (JSON, text, figures, torch files).
- :mod:`~autoln.core.locks`: one run folder, one process.
- :mod:`~autoln.core.signals`, :mod:`~autoln.core.commands`: which signals stop a run; the
  ``next:`` and resume command lines printed for the user.
- :mod:`~autoln.core.distributed`: data-parallel training with ``torch.distributed`` (torchrun).
- :mod:`~autoln.core.tb`: TensorBoard logging.

Imports nothing else of autoln: every other folder may use it.
"""
