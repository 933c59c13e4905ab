"""``EntityItemDataModule`` reads any bipartite ``HeteroData``: node counts from ``ids`` / ``names`` / ``x`` (no
``num_nodes`` needed, no PyG guess or warning), features embedded from ``names`` by a transform, and node counts that
disagree refused with a message naming each."""

from __future__ import annotations

import warnings
import zlib

import pytest
import torch
from torch_geometric.data import HeteroData

from lightning_dprel.methods.entity_items import EntityItemDataModule

REL = ("patient", "shows", "sign")
D = 6

pytestmark = pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*")


class FakeEmbed:
    """A transform with ``.embeddings(list) -> Tensor``: a fixed vector per text, and the lists it was given."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embeddings(self, texts: list[str]) -> torch.Tensor:
        self.calls.append(list(texts))
        return torch.stack([torch.randn(D, generator=torch.Generator().manual_seed(zlib.crc32(t.encode()))) for t in texts])


def bipartite(ne: int = 60, ni: int = 15, *, with_x: bool = False) -> HeteroData:
    """Entities and items with ids and names (and ``x`` when asked), never ``num_nodes``."""
    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["patient"].ids = [f"p{i}" for i in range(ne)]
    data["patient"].names = [f"patient number {i}" for i in range(ne)]
    data["sign"].ids = [f"s{j}" for j in range(ni)]
    data["sign"].names = [f"sign {j}" for j in range(ni)]
    if with_x:
        data["patient"].x = torch.randn(ne, D, generator=g)
        data["sign"].x = torch.randn(ni, D, generator=g)
    e = torch.arange(ne).repeat_interleave(3)
    i = torch.randint(0, ni, (3 * ne,), generator=g)
    data[REL].edge_index = torch.stack([e, i])
    return data


def make(data, **kw) -> EntityItemDataModule:
    return EntityItemDataModule(data, relation=REL, max_relations=3, expected_batch_size=8, seed=0, **kw)


def test_ids_and_names_without_num_nodes_are_read_and_embedded_without_a_warning():
    data, embed = bipartite(), FakeEmbed()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyG's "Unable to accurately infer 'num_nodes'" would fail here
        warnings.filterwarnings("ignore", ".*a public seed makes this randomness reproducible.*")
        dm = make(data, transform=embed)
    assert dm.entity_ids == [f"p{i}" for i in range(60)] and dm.item_ids == [f"s{j}" for j in range(15)]
    assert embed.calls == [list(data["patient"].names), list(data["sign"].names)]
    assert dm.entity_x.shape == (60, D) and dm.item_x.shape == (15, D)
    torch.testing.assert_close(dm.item_x, torch.nn.functional.normalize(FakeEmbed().embeddings(data["sign"].names), dim=1))
    assert dm.num_entities > 0 and dm.next_batch()["query"].size(1) == D


def test_ids_and_x_without_num_nodes_or_names():
    data = bipartite(with_x=True)
    for t in ("patient", "sign"):
        del data[t].names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", ".*a public seed makes this randomness reproducible.*")
        dm = make(data)
    torch.testing.assert_close(dm.entity_x, torch.nn.functional.normalize(data["patient"].x, dim=1))


def test_x_alone_gives_row_numbers_as_ids():
    data = bipartite(with_x=True)
    for t in ("patient", "sign"):
        del data[t].names, data[t].ids
    dm = make(data)
    assert dm.item_ids == [str(j) for j in range(15)]


@pytest.mark.parametrize("edit, match", [
    (lambda d: setattr(d["sign"], "names", d["sign"].names[:-1]), r"data\['sign'\] gives different node counts: "
                                                                     r"len\(ids\) = 15, len\(names\) = 14"),
    (lambda d: setattr(d["patient"], "x", torch.randn(59, D)), r"data\['patient'\] gives different node counts: .*"
                                                               r"len\(ids\) = 60, len\(names\) = 60, x.size\(0\) = 59"),
    (lambda d: setattr(d["sign"], "num_nodes", 16), r"num_nodes = 16, len\(ids\) = 15"),
    (lambda d: setattr(d["sign"], "names", "one string"), r"data\['sign'\].names must be a list"),
    (lambda d: [delattr(d["sign"], k) for k in ("ids", "names", "x")], r"data\['sign'\] has no `ids`, `names`, `x` or "
                                                                  "`num_nodes`"),
    (lambda d: setattr(d["patient"], "x", torch.full((60, D), float("nan"))), r"data\['patient'\].x must be finite"),
    (lambda d: setattr(d["patient"], "x", torch.randn(60)), r"data\['patient'\].x must be a \[num_nodes, d\] tensor"),
])
def test_disagreeing_node_counts_are_refused_clearly(edit, match):
    data = bipartite(with_x=True)
    edit(data)
    with pytest.raises(ValueError, match=match):
        make(data)


def test_names_without_a_transform_say_what_is_missing():
    with pytest.raises(ValueError, match=r"data\['patient'\] needs features `x`, or `names` and a `transform` .*it has "
                                         r"`ids`, `names`"):
        make(bipartite())


def test_a_transform_giving_the_wrong_rows_is_refused():
    class Short(FakeEmbed):
        def embeddings(self, texts):
            return super().embeddings(texts)[:-1]

    with pytest.raises(ValueError, match=r"The transform gave Tensor \(59, 6\) for the 60 names of data\['patient'\]"):
        make(bipartite(), transform=Short())
