"""Private entities linked to public items (patients and phenotype terms, customers and products): the datamodule.

Unit :data:`~lightning_dprel.methods.entity_items.accounting.ENTITY_PUBLIC_ITEMS`: one entity with all its raw relations.
Each entity keeps ≤ K relations chosen by its own keyed hash (:func:`keyed_cap`), so the guarantee holds for the raw
data. Two samplings of the same relations (``recipe``), both accounted by the ``entity_items`` mechanism:

* ``"entity"`` — entity-as-example (user-level DP-SGD): Poisson entities at q = b/n, one example per entity holding
  its ≤ K items, so one clip per entity (K = 1 in the SamplingSpec: Δ = C); with ``sampled_items`` S, each step also
  draws S items from the public vocabulary, independently of the data, that every entity of the step shares as the
  negatives of a sampled softmax (public randomness: the mechanism and Δ are unchanged);
* ``"relation"`` — the core method's sampling: Poisson relations at γ = b/m, one tuple per relation with k negatives
  drawn from the public item vocabulary (0: the loss ranks all items), Δ = C·i for the entity's i sampled tuples.

Entities are split by a public hash of their id (train private; validation declared public for selection; test).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import HeteroData

from lightning_dprel.core.checks import check_choice, check_int, check_probability
from lightning_dprel.core.datamodule import StepStream, SteppedDataModule
from lightning_dprel.core.example_views import TensorRows
from lightning_dprel.core.randomness import SEEDED_WARNING, KeyedStream
from lightning_dprel.core.specs import SamplingSpec
from lightning_dprel.datamodules.edge_tuples.spec import EdgeTuples
from lightning_dprel.methods.entity_items.accounting import ENTITY_PUBLIC_ITEMS
from lightning_dprel.methods.entity_items.capping import keyed_cap

__all__ = ["EntityItemDataModule", "RECIPES", "entity_split"]

RECIPES = ("entity", "relation")


def _unit_hash(salt: str, key: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{salt}\0{key}".encode()).digest()[:8], "big") / 2.0**64


def entity_split(ids: list[str], fractions: tuple[float, float, float], salt: str = "split") -> Tensor:
    """0 / 1 / 2 (train / validation / test) per entity, from a public hash of its id alone (no cascade)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"`split` must be three fractions >= 0 summing to 1, got {fractions!r}.")
    u = torch.tensor([_unit_hash(salt, i) for i in ids], dtype=torch.float64)
    return (u >= fractions[0]).long() + (u >= fractions[0] + fractions[1]).long()


class EntityItemDataModule(SteppedDataModule):
    """Private entities, public items, from a PyG ``HeteroData``.

    Args:
        data: ``data[relation].edge_index`` ``[2, m]`` (entity row, item row); ``data[entity].ids`` (strings) and
            features ``x`` (or ``names``, embedded by ``transform``); the same for ``data[item]`` (public).
        source: instead of ``data``, an object whose ``load()`` returns it (a config's ``class_path``, e.g.
            :class:`~lightning_dprel.datamodules.datasets.HPODiseasePhenotypes`).
        relation: the edge type (entity type, name, item type), e.g. ``("disease", "has", "phenotype")``.
        recipe: ``"entity"`` (entity-as-example) or ``"relation"`` (the core method's sampling); see the module doc.
        max_relations: K, relations kept per entity (its keyed hash chooses which).
        expected_batch_size: b (entities or relations per step in expectation); the private step divides by b.
        neg_per_pos: k, public negatives per relation tuple (``"relation"`` only; 0: rank all items).
        sampled_items: S, items drawn per step (uniformly, without replacement, from the keyed stream) as the shared
            negatives of a sampled softmax (``"entity"`` only; 0: the loss ranks all items). Batch key ``"sampled"``.
        split: (train, validation, test) fractions of entities; validation entities are declared public.
        train_fraction: keep this share of the training entities (by a second public hash; a data-size curve).
        transform: e.g. :class:`~lightning_dprel.transforms.EmbedText`, for node types without ``x`` (uses ``names``).
        seed: None (secret keyed stream: cap key and samples) or a public seed (reproducible, voids the guarantee, warns).
        eval_batch_size: entities per validation / test batch.
    """

    privacy_unit = ENTITY_PUBLIC_ITEMS.name
    example_view = TensorRows()
    state_version = 1

    def __init__(self, data: HeteroData | None = None, *, source: Any = None, relation: tuple[str, str, str] = ("disease", "has", "phenotype"),
                 recipe: str = "entity", max_relations: int = 20, expected_batch_size: float = 256.0,
                 neg_per_pos: int = 0, sampled_items: int = 0, split: tuple[float, float, float] = (0.8, 0.1, 0.1), train_fraction: float = 1.0,
                 transform: Any = None, seed: int | None = None, eval_batch_size: int = 1024) -> None:
        super().__init__()
        if (data is None) == (source is None):
            raise ValueError("Give `data` (a HeteroData) or `source` (an object whose load() returns one), not both.")
        if source is not None and not callable(getattr(source, "load", None)):
            raise TypeError(f"`source` must have a load() method returning a HeteroData, got {type(source).__name__}.")
        check_choice("recipe", recipe, RECIPES)
        if not (isinstance(relation, (tuple, list)) and len(relation) == 3):
            raise ValueError(f"`relation` must be an edge type (entity type, name, item type), got {relation!r}.")
        self.source, self.relation, self.recipe = source, tuple(relation), recipe
        self.max_relations = check_int("max_relations", max_relations, 1)
        self.neg_per_pos = check_int("neg_per_pos", neg_per_pos, 0)
        if recipe == "entity" and self.neg_per_pos:
            raise ValueError("`neg_per_pos` is for recipe='relation'; the entity recipe takes `sampled_items` (shared "
                             "negatives of a sampled softmax) or ranks all items.")
        self.sampled_items = check_int("sampled_items", sampled_items, 0)
        if recipe == "relation" and self.sampled_items:
            raise ValueError("`sampled_items` is for recipe='entity'; the relation recipe takes `neg_per_pos`.")
        if self.sampled_items:
            self.example_view = TensorRows(shared=("sampled",))
        check_probability("train_fraction", train_fraction, one=True)
        self.b, self.train_fraction = float(expected_batch_size), float(train_fraction)
        self.eval_batch_size = check_int("eval_batch_size", eval_batch_size, 1)
        if seed is not None:
            self.warn_seeded(f"EntityItemDataModule(seed={seed})")
        self.stream = KeyedStream.secret("entity_items") if seed is None else KeyedStream.seeded(seed, "entity_items", warn=False)
        self._step = 0
        entity_split([], tuple(float(f) for f in split))  # the fractions checked now, whenever the data comes
        self._pending = (transform, tuple(float(f) for f in split))
        if data is not None:  # given data is read now; a source's is loaded at setup (or first use), not when configured
            self._load(data)

    _LOADED = frozenset({"entity_ids", "item_ids", "entity_x", "item_x", "item_graph", "part", "all_pairs", "train_pairs",
                         "train_entities", "entity_items"})

    def __getattr__(self, name: str) -> Any:
        if name in EntityItemDataModule._LOADED and self.__dict__.get("_pending") is not None and "source" in self.__dict__:
            self._load(self.source.load())
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def setup(self, stage: str) -> None:
        if self.__dict__.get("_pending") is not None:
            self._load(self.source.load())

    def _load(self, data: HeteroData) -> None:
        """Read the data: ids, features, the split, the keyed cap and the per-entity item rows."""
        transform, split = self._pending
        if not isinstance(data, HeteroData):
            raise TypeError(f"`data` must be a torch_geometric HeteroData, got {type(data).__name__}.")
        if self.relation not in data.edge_types:
            raise ValueError(f"`relation` must be one of the data's edge types {data.edge_types}, got {self.relation!r}.")
        ent, _, item = self.relation
        self.entity_ids, self.item_ids = self._ids(data, ent), self._ids(data, item)
        self.entity_x, self.item_x = self._features(data, ent, transform), self._features(data, item, transform)
        pairs = data[self.relation].edge_index
        if self.sampled_items >= len(self.item_ids):
            raise ValueError(f"`sampled_items` ({self.sampled_items}) must be below the {len(self.item_ids)} items; 0 "
                             "ranks all items.")
        if pairs.dim() != 2 or pairs.size(0) != 2 or pairs.numel() == 0:
            raise ValueError(f"data[{self.relation}].edge_index must be a non-empty [2, m] tensor.")
        if int(pairs[0].max()) >= len(self.entity_ids) or int(pairs[1].max()) >= len(self.item_ids) or int(pairs.min()) < 0:
            raise ValueError("edge_index holds a row outside its node type's range.")
        self.item_graph = self._item_graph(data, item)
        self.part = entity_split(self.entity_ids, split)
        if self.train_fraction < 1.0:
            keep = torch.tensor([_unit_hash("train_fraction", i) < self.train_fraction for i in self.entity_ids])
            self.part = torch.where((self.part == 0) & ~keep, torch.full_like(self.part, -1), self.part)
        self._build(torch.unique(pairs.long(), dim=1))  # a repeated (entity, item) pair is one relation
        self._pending = None

    # -- construction ------------------------------------------------------------------------------------------
    @staticmethod
    def _ids(data: HeteroData, ntype: str) -> list[str]:
        """The node type's ids (row numbers when it has none), after checking that every source of its node count
        agrees: ``num_nodes`` when set, ``len(ids)``, ``len(names)``, ``x.size(0)`` (PyG's guess is never used)."""
        store = data[ntype]
        ids, names, x = (store[k] if k in store else None for k in ("ids", "names", "x"))
        sizes = {}
        if "num_nodes" in store and store["num_nodes"] is not None:
            sizes["num_nodes"] = int(store["num_nodes"])
        for key, value in (("ids", ids), ("names", names)):
            if value is not None:
                if isinstance(value, str) or not hasattr(value, "__len__"):
                    raise ValueError(f"data[{ntype!r}].{key} must be a list with one entry per node, got "
                                     f"{type(value).__name__}.")
                sizes[f"len({key})"] = len(value)
        if torch.is_tensor(x) and x.dim() >= 1:
            sizes["x.size(0)"] = int(x.size(0))
        if not sizes:
            raise ValueError(f"data[{ntype!r}] has no `ids`, `names`, `x` or `num_nodes`: give its node ids (and features "
                             "`x`, or `names` to embed), so that its node count is known.")
        if len(set(sizes.values())) > 1:
            raise ValueError(f"data[{ntype!r}] gives different node counts: "
                             + ", ".join(f"{k} = {v:,}" for k, v in sizes.items()) + "; they must all be equal.")
        ids = [str(i) for i in (ids if ids is not None else range(next(iter(sizes.values()))))]
        if len(set(ids)) != len(ids):
            raise ValueError(f"data[{ntype!r}].ids must be unique.")
        return ids

    @staticmethod
    def _features(data: HeteroData, ntype: str, transform: Any) -> Tensor:
        store = data[ntype]
        n = len(EntityItemDataModule._ids(data, ntype))  # the node count, every source of it checked to agree
        x = store["x"] if "x" in store else None
        if x is None:
            names = store["names"] if "names" in store else None
            if names is None or transform is None:
                raise ValueError(f"data[{ntype!r}] needs features `x`, or `names` and a `transform` (e.g. EmbedText); "
                                 f"it has {', '.join(f'`{k}`' for k in store.keys()) or 'nothing'}.")
            x = transform.embeddings(list(names))
            if not torch.is_tensor(x) or x.dim() != 2 or x.size(0) != n:
                raise ValueError(f"The transform gave {type(x).__name__} {tuple(getattr(x, 'shape', ()))} for the "
                                 f"{n:,} names of data[{ntype!r}]; expected a [{n}, d] tensor.")
        if not torch.is_tensor(x) or x.dim() != 2 or x.size(0) != n:
            raise ValueError(f"data[{ntype!r}].x must be a [num_nodes, d] tensor ({n:,} nodes), got "
                             f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}.")
        if not torch.isfinite(x).all():
            raise ValueError(f"data[{ntype!r}].x must be finite (it holds NaN or inf).")
        return torch.nn.functional.normalize(x.float(), dim=1)

    def _item_graph(self, data: HeteroData, item: str) -> Tensor:
        graphs = [et for et in data.edge_types if et[0] == item and et[2] == item]
        return data[graphs[0]].edge_index.long() if graphs else torch.zeros(2, 0, dtype=torch.long)

    def _build(self, pairs: Tensor) -> None:
        self.all_pairs = pairs  # val / test entities are evaluated on all their relations
        train = self.part[pairs[0]] == 0
        tp = pairs[:, train]
        keep = keyed_cap(self.entity_ids, self.item_ids, tp, self.max_relations, self._cap_key())
        self.train_pairs = tp[:, keep]
        self.train_entities = torch.nonzero(self.part == 0).view(-1)
        if self.train_entities.numel() == 0 or self.train_pairs.size(1) == 0:
            raise ValueError("No training entity (or relation) is left after the split.")
        row = torch.full((len(self.entity_ids),), -1, dtype=torch.long)
        row[self.train_entities] = torch.arange(self.train_entities.numel())
        items = torch.full((self.train_entities.numel(), self.max_relations), -1, dtype=torch.long)
        counts = torch.zeros(self.train_entities.numel(), dtype=torch.long)
        for e, i in self.train_pairs.t().tolist():
            r = int(row[e])
            items[r, counts[r]] = i
            counts[r] += 1
        self.entity_items = items  # [n, K], -1 padded

    def _cap_key(self) -> bytes:
        return hashlib.sha256(self.stream.key_now() + b"/keyed_cap").digest()

    # -- what the accountant charges ---------------------------------------------------------------------------
    @property
    def num_entities(self) -> int:
        return int(self.train_entities.numel())

    @property
    def sampling_spec(self) -> SamplingSpec:
        n = self.num_entities
        if self.recipe == "entity":
            m, k_units = n, 1
        else:
            m, k_units = int(self.train_pairs.size(1)), self.max_relations
        if not 0.0 < self.b <= m:
            raise ValueError(f"`expected_batch_size` must be in (0, {m}] for recipe {self.recipe!r}, got {self.b}.")
        rate = self.b / m
        # num_nodes: the bipartite graph's, so K' = min(K, n + items) never drops below the relations an entity can keep
        return SamplingSpec(population=m, contribution_bound=k_units, sampling_rate=rate,
                            expected_batch_size=self.b, steps_per_epoch=math.ceil(1.0 / rate),
                            privacy_unit=self.privacy_unit, num_units=n,
                            detail=EdgeTuples(num_nodes=n + len(self.item_ids)))

    # -- batches ------------------------------------------------------------------------------------------------
    def next_batch(self) -> dict[str, Tensor]:
        """Step ``_step``'s Poisson sample (this rank's share), from the keyed stream."""
        step, self._step = self._step, self._step + 1
        spec = self.sampling_spec
        rank, world = self.world()
        kept = self.stream.child(step, "sample").uniform(spec.population) < spec.sampling_rate
        rows = torch.nonzero(kept).view(-1)
        rows = rows[rank::world]
        if self.recipe == "entity":
            batch = {"query": self.entity_x[self.train_entities[rows]], "items": self.entity_items[rows]}
            if self.sampled_items:  # public: drawn from the stream alone, the same for every entity of the step
                u = self.stream.child(step, "sampled").uniform(len(self.item_ids))
                batch["sampled"] = torch.topk(u, self.sampled_items).indices
            return batch
        ent, item = self.train_pairs[:, rows]
        batch = {"query": self.entity_x[ent], "items": item[:, None]}
        if self.neg_per_pos:
            neg = self.stream.child(step, "negatives").randint(len(self.item_ids), rows.numel() * self.neg_per_pos)
            batch["negatives"] = neg.view(rows.numel(), self.neg_per_pos)
        return batch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepStream(self), batch_size=None)

    def eval_set(self, part: int) -> tuple[Tensor, Tensor]:
        """(entity rows, dense [E, n_items] relevance over all raw relations) of the validation (1) or test (2) part."""
        rows = torch.nonzero(self.part == part).view(-1)
        where = torch.full((len(self.entity_ids),), -1, dtype=torch.long)
        where[rows] = torch.arange(rows.numel())
        e, i = self.all_pairs
        sel = where[e] >= 0
        target = torch.zeros(rows.numel(), len(self.item_ids), dtype=torch.bool)
        target[where[e[sel]], i[sel]] = True
        return rows, target

    def _eval_loader(self, part: int) -> DataLoader:
        rows, target = self.eval_set(part)
        batches = [{"query": self.entity_x[r], "target": target[s], "index": s}
                   for r, s in zip(torch.split(rows, self.eval_batch_size),
                                   torch.split(torch.arange(rows.numel()), self.eval_batch_size))]
        return DataLoader(batches, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(1)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(2)

    def public_item_pairs(self) -> tuple[Tensor, Tensor]:
        """The public item graph as (query features, target item): each item's text queries its graph neighbours."""
        child, parent = self.item_graph
        return self.item_x[child], parent

    @property
    def nouns(self) -> tuple[str, str, str, str]:
        """(one entity, entities, relations, items) in the data's words: the source's ``nouns``, else the type names."""
        ent, _, item = self.relation
        return tuple(getattr(self.source, "nouns", None) or (f"{ent!r} entity", f"{ent!r} entities", "relations",
                                                              f"{item!r} items"))

    @property
    def unit_text(self) -> str:
        """The unit in the data's words, with the entities that are declared public and not protected."""
        one, many, relations, items = self.nouns
        return (f"one {one} with all its raw {relations} (add/remove; at most K = {self.max_relations} kept, chosen by "
                f"its own keyed hash); {items} public; {int((self.part == 1).sum())} validation {many} declared public "
                f"and not protected; {int((self.part == 2).sum())} test {many} for evaluation only")

    def report_baselines(self, epsilon: float, delta: float, ledger: Any = None) -> list[dict[str, Any]]:
        """DP popularity at the same (ε, δ), on the test entities: a release of its own. With the model's ``ledger``
        (not changed) the row also gives ε of both releases together, what the job as a whole spends."""
        import copy

        from lightning_dprel.methods.entity_items.evaluation import fast_ranking_metrics
        from lightning_dprel.methods.entity_items.popularity import dp_item_popularity

        counts, own = dp_item_popularity(self, epsilon, delta)
        both = None
        if ledger is not None:
            release_id, event = self.data_releases[-1]  # the release just made, charged beside the model's
            joint = copy.deepcopy(ledger)
            joint.charge_once(event, release_id)
            both = joint.epsilon(delta)
        rows, target = self.eval_set(2)
        scores = counts.float().expand(rows.numel(), -1)
        metrics = fast_ranking_metrics(scores, target)
        return [{"name": f"DP popularity (ε = {epsilon:g})", "metrics": {f"test_{k}": v for k, v in metrics.items()},
                 "epsilon": own.epsilon(delta), "epsilon_with_the_model": both,
                 "note": "its own release, not part of the model's ε"}]

    #: Validation entities are a part of their own, declared public: checkpoint selection never reads the test part.
    has_validation_graph = True

    @property
    def validation_name(self) -> str:
        return f"the {int((self.part == 1).sum())} validation {self.nouns[1]} (declared public, not protected)"

    @property
    def test_name(self) -> str:
        return self.nouns[1]

    @property
    def public_data(self) -> dict[str, Any]:
        """What is public, for ``privacy.json``: the items, their graph and the validation entities (not protected)."""
        return {"items": f"{len(self.item_ids)} items ({self.relation[2]}) and their texts",
                "item_graph": f"{self.item_graph.size(1)} item-item relations",
                "validation_entities": f"{int((self.part == 1).sum())} {self.relation[0]} entities declared public for "
                                       "model selection: not protected"}
