"""Private entities linked to public items: unit ``entity_public_items``, mechanism ``entity_items`` (Δ = C·i),
the datamodule (entity-as-example or relation sampling), a plain ranking module, the DP popularity baseline."""

from lightning_dprel.methods.entity_items.accounting import ENTITY_PUBLIC_ITEMS, MECHANISM
from lightning_dprel.methods.entity_items.capping import keyed_cap
from lightning_dprel.methods.entity_items.datamodule import RECIPES, EntityItemDataModule, entity_split
from lightning_dprel.methods.entity_items.evaluation import fast_ranking_metrics, ranking_metrics
from lightning_dprel.methods.entity_items.module import EntityItemRanker
from lightning_dprel.methods.entity_items.popularity import dp_item_popularity

__all__ = ["ENTITY_PUBLIC_ITEMS", "MECHANISM", "keyed_cap", "RECIPES", "EntityItemDataModule", "entity_split",
           "ranking_metrics", "fast_ranking_metrics", "EntityItemRanker", "dp_item_popularity"]
