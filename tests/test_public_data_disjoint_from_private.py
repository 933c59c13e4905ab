"""Public data must be disjoint from the private graph: no shared node (by name, else text, else feature row) and no
shared relation, or ``public=`` is refused.

Audit item (issue 32): ``RelationalDataModule(public=...)`` accepted the private graph itself, its relations listed
in ``privacy.json`` as ``charged: false``. Node ids are compared by what names a node across graphs (``node_names``,
else ``text``, else the feature row ``x``), never by ``node_id`` or row numbers, which each source numbers its own way
(an HPO term and a WordNet synset may share an integer).
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.datamodules.datasets import GraphPair, GraphSource
from lightning_dprel.datamodules.edge_tuples.public import PublicRelations
from lightning_dprel.demos import random_feature_graph

pytestmark = pytest.mark.filterwarnings("ignore:RelationalDataModule\\(sampling_seed=<int>\\)")
DIM = 8


class _Split(GraphSource):
    def __init__(self, train: Data) -> None:
        self.train = train

    def load(self) -> GraphPair:
        return GraphPair(train=self.train, val=random_feature_graph(60, 150, dim=DIM, seed=11),
                         test=random_feature_graph(60, 150, dim=DIM, seed=12), name="synthetic")


def _dm(train: Data, public) -> RelationalDataModule:
    return RelationalDataModule(_Split(train), expected_batch_size=16.0, neg_per_pos=1, max_degree=6, sampling_seed=3,
                                public=public)


def _named(names: list[str], texts: list[str], edges: list[tuple[int, int]], seed: int, **ids) -> Data:
    x = torch.randn(len(names), DIM, generator=torch.Generator().manual_seed(seed))
    return Data(x=x, edge_index=torch.tensor(edges).t(), num_nodes=len(names), node_names=names, text=texts, **ids)


PRIVATE_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 5)]


def _private() -> Data:
    return _named([f"HP:{i:07d}" for i in range(6)], [f"term {i}" for i in range(6)], PRIVATE_EDGES, 0,
                  node_id=torch.arange(6) + 1740)


def test_the_private_graph_itself_is_refused_as_public_data():
    train = random_feature_graph(120, 300, dim=DIM, seed=0)
    dm = _dm(train, public=train)
    with pytest.raises(ValueError, match=r"shares 120 nodes .* and \d+ relations .*private graph"):
        dm.setup("fit")
    copy = Data(x=train.x.clone(), edge_index=train.edge_index.flip(0), num_nodes=120)  # a copy, reversed relations
    with pytest.raises(ValueError, match=r"shares 120 nodes"):
        _dm(train, public=PublicRelations(copy, name="a copy")).setup("fit")


def test_shared_names_and_relations_are_counted_and_refused():
    # public nodes 0..2 are private nodes 3..5 (same names, other texts and features); public relation (0, 1) is the
    # private relation (3, 4); (2, 0) joins HP:5 and HP:3, which the private graph does not relate
    shared = _named(["HP:0000003", "HP:0000004", "HP:0000005", "00001740", "00001741"], list("abcde"),
                    [(0, 1), (2, 0), (1, 3), (3, 4)], 1)
    with pytest.raises(ValueError, match=r"shares 3 nodes \(by `node_names`\) and 1 relation"):
        PublicRelations(shared).prepare(private=_private())


def test_texts_identify_nodes_when_a_graph_has_no_names():
    private, public = _private(), _named(["x"] * 3, ["term 0", "term 1", "other"], [(0, 1), (1, 2)], 2)
    del public.node_names
    with pytest.raises(ValueError, match=r"shares 2 nodes \(by `text`\) and 1 relation"):
        PublicRelations(public).prepare(private=private)


def test_disjoint_public_data_is_accepted_and_numeric_ids_do_not_count():
    """The main job's setup in small: HPO terms private, WordNet synsets public; equal integers are not equal nodes."""
    wordnet = _named([f"{1740 + i:08d}" for i in range(5)], [f"synset {i}" for i in range(5)], [(0, 1), (1, 2), (3, 4)], 3,
                     node_id=torch.arange(5) + 1740)  # the same integers as the private node_ids
    pub = PublicRelations(wordnet, name="WordNet (public)")
    pub.prepare(private=_private())
    assert pub.num_relations == 3 and pub.describe()["disjoint_from_private"] == "node_names"
    train = random_feature_graph(120, 300, dim=DIM, seed=0)
    dm = _dm(train, public=random_feature_graph(90, 240, dim=DIM, seed=7))
    dm.setup("fit")
    assert dm.public.describe()["disjoint_from_private"] == "x"
