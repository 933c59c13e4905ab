"""Lightning notices that say nothing about a lightning_dprel run, silenced narrowly (issue 21).

Each filter names one message of Lightning's own that fires on every run of this library whatever the user does;
everything else Lightning, torch or this library warns about still shows. :func:`silence_lightning_notices` runs on
import of :mod:`lightning_dprel.core` (every module, datamodule and CLI run imports it); it is idempotent.

Under pytest, warning filters installed at import are dropped after collection, so ``pyproject.toml`` repeats the two
warning filters for the test suite; ``tests/test_warnings.py`` checks that a plain run prints none of these notices.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["LIGHTNING_WARNINGS", "LITLOGGER_TIP", "silence_lightning_notices"]

#: (message regex, category) of Lightning warnings that a run of this library cannot act on.
LIGHTNING_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    # Lightning's own pytree helper (``utilities/_pytree.py``) uses torch's deprecated ``LeafSpec``: Lightning's to fix.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # Our streams (TupleStream, RankingStream, the DP-GCN steps) are IterableDatasets whose ``__len__`` is exact (steps
    # per epoch, evaluation batches) and whose loaders use num_workers=0: the multi-worker caveat does not apply.
    (r"Your `IterableDataset` has `__len__` defined", UserWarning),
)
#: The start of Lightning's advertisement, logged (INFO) at every ``Trainer(...)`` without a LitLogger.
LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"


class _DropLitLoggerTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LITLOGGER_TIP)


def silence_lightning_notices() -> None:
    """Ignore :data:`LIGHTNING_WARNINGS` and drop the LitLogger tip from Lightning's rank-zero log."""
    for message, category in LIGHTNING_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    # pytorch_lightning.utilities.rank_zero points rank_zero_info at this logger; a filter on it sees the record.
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if not any(isinstance(f, _DropLitLoggerTip) for f in logger.filters):
        logger.addFilter(_DropLitLoggerTip())
