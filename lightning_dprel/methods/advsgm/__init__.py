"""AdvSGM (Zhang et al.): private skip-gram node embeddings; provable mode by default, the paper's labelled (``docs/advsgm.md``)."""

from lightning_dprel.methods.advsgm import accounting  # noqa: F401 - registers its units and mechanisms first
from lightning_dprel.methods.advsgm.datamodule import (
    AdvSGMPaperDataModule, EdgeSkipGramDataModule, PrivateIdsSkipGramDataModule, SkipGramDataModule,
)
from lightning_dprel.methods.advsgm.encoder import NodeIdEmbedding
from lightning_dprel.methods.advsgm.module import DPSkipGramModule
from lightning_dprel.methods.advsgm.paper import PaperStop

__all__ = [
    "AdvSGMPaperDataModule", "DPSkipGramModule", "EdgeSkipGramDataModule", "NodeIdEmbedding", "PaperStop", "PrivateIdsSkipGramDataModule",
    "SkipGramDataModule",
]
