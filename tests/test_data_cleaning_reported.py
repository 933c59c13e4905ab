"""Graph preparation says what it cleaned, node texts that are None are refused and empty
ones warned (in the datamodule and in EmbedText alike), and ``help(<class>.__init__)`` shows the argument docs."""

from __future__ import annotations

import pydoc

import pytest
import torch
from torch_geometric.data import Data

from lightning_dprel.demos.boring_classes import rank_zero_messages

from lightning_dprel.demos import random_text_graph, save_tiny_bert

N = 20


def _clean_edges() -> list[tuple[int, int]]:
    ring = [(i, (i + 1) % N) for i in range(N)]
    chords = [(i, i + 5) for i in range(10)]
    return ring + chords  # 30 distinct undirected relations, no self-loop


def _dirty_graph(self_loops: int, duplicates: int, reverse: int, seed: int = 0) -> Data:
    clean = _clean_edges()
    extra = [(i, i) for i in range(self_loops)]
    extra += clean[:duplicates]  # exact repeats of listed edges
    extra += [(b, a) for a, b in clean[10 : 10 + reverse]]  # (v, u) of a listed (u, v)
    edges = torch.tensor(clean + extra, dtype=torch.long).t()
    edges = edges[:, torch.randperm(edges.shape[1], generator=torch.Generator().manual_seed(seed))]
    return Data(x=torch.randn(N, 4, generator=torch.Generator().manual_seed(seed)), edge_index=edges, num_nodes=N)


def _setup_messages(dm) -> list[str]:
    """What ``setup`` logs through Lightning's rank-zero logger (the channel of the capping line)."""
    with rank_zero_messages() as messages:
        dm.setup("fit")
    return messages


def _dm(source, **kwargs):
    from lightning_dprel.datamodules import RelationalDataModule

    opts = {"expected_batch_size": 4, "neg_per_pos": 1, "max_degree": 10, **kwargs}
    return RelationalDataModule(source, **opts)


# ------------------------------------------------------------------------------------------ item 3: edge cleaning
def test_every_edge_cleaning_step_is_logged_with_its_count():
    dm = _dm(_dirty_graph(3, 4, 5), test_source=_dirty_graph(2, 0, 6, seed=1))
    messages = _setup_messages(dm)
    assert ("cleaning `source`: dropped 3 self-loops, 4 duplicate edges, 5 reverse edges (relations are "
            "undirected); 30 relations remain.") in messages, messages
    assert ("cleaning `test_source`: dropped 2 self-loops, 6 reverse edges (relations are undirected); "
            "30 relations remain.") in messages, messages
    assert dm.train_edges.shape[1] == 30
    # logged next to (before) the capping line, through the same channel
    capping = [i for i, m in enumerate(messages) if m.startswith("capping to K=")]
    cleaning = [i for i, m in enumerate(messages) if m.startswith("cleaning `source`")]
    assert capping and cleaning and cleaning[0] < capping[0]


def test_single_counts_are_singular_and_a_clean_graph_logs_no_cleaning_line():
    messages = _setup_messages(_dm(_dirty_graph(1, 1, 1), test_source=_dirty_graph(0, 0, 0, seed=1)))
    assert ("cleaning `source`: dropped 1 self-loop, 1 duplicate edge, 1 reverse edge (relations are undirected); "
            "30 relations remain.") in messages, messages
    assert not [m for m in messages if m.startswith("cleaning `test_source`")], messages


# ------------------------------------------------------------------------------------------ item 3: node texts
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _text_graph(**replace) -> Data:
    g = random_text_graph(30, 60, seed=0)
    text = list(g.text)
    for i, t in replace.items():
        text[int(i.lstrip("n"))] = t
    g.text = text
    return g


def test_none_node_texts_are_refused_with_their_count_and_first_ids(tiny_bert):
    g = _text_graph(n3=None, n7=None, n12=float("nan"))
    dm = _dm(g, tokenizer=tiny_bert, max_length=8)
    with pytest.raises(ValueError, match=r"`source\.text` has 3 of 30 node texts that are None or NaN "
                                         r"\(first node ids: \[3, 7, 12\]\)"):
        dm.setup("fit")


def test_empty_node_texts_are_warned_with_their_count(tiny_bert):
    g = _text_graph(n4="", n9="   ", n11="\n")
    dm = _dm(g, tokenizer=tiny_bert, max_length=8)
    with pytest.warns(UserWarning, match=r"`source\.text` has 3 of 30 node texts that are empty or whitespace-only "
                                         r"\(first node ids: \[4, 9, 11\]\)"):
        dm.setup("fit")
    assert dm.train_inputs["input_ids"].shape[0] == 30


def test_embed_text_refuses_none_and_warns_on_empty_texts_the_same_way(tiny_bert):
    from lightning_dprel.transforms import EmbedText

    embed = EmbedText(tiny_bert, max_length=8, cache=False)
    with pytest.raises(ValueError, match=r"`data\.text` has 1 of 30 node texts that are None or NaN "
                                         r"\(first node ids: \[5\]\)"):
        embed(_text_graph(n5=None))
    with pytest.warns(UserWarning, match=r"`data\.text` has 2 of 30 node texts that are empty or whitespace-only "
                                         r"\(first node ids: \[0, 2\]\)"):
        out = embed(_text_graph(n0="", n2=" \t"))
    assert out.x.shape == (30, 32)


def test_one_shared_text_check():
    from lightning_dprel import transforms
    from lightning_dprel.datamodules.edge_tuples import graph_prep

    assert graph_prep.check_node_texts is transforms.check_node_texts
    assert transforms.check_node_texts(("a", 3), "x") == ["a", "3"]


# ------------------------------------------------------------------------------------------ item 7: help(__init__)
def _init_docs():
    from lightning_dprel.methods.dp_gcn.datamodule import NodeSplitDataModule
    from lightning_dprel.datamodules.edge_tuples.datamodule import RelationalDataModule
    from lightning_dprel.methods.relational.module import DPRelationalModule

    return [
        (RelationalDataModule, ("source", "test_source", "expected_batch_size", "sampling_seed", "max_degree"),
         "Coupled relational sampling"),
        (NodeSplitDataModule, ("num_splits", "sampling_rate", "sampling_seed", "allow_row_ids"), "Subgraph examples"),
        (DPRelationalModule, ("encoder", "clip_norm", "noise_multiplier", "per_tuple_mode"), "Entity-level DP"),
    ]


@pytest.mark.parametrize("index", range(3))
def test_help_of_init_shows_the_argument_docs(index):
    cls, names, prose = _init_docs()[index]
    doc = cls.__init__.__doc__ or ""
    rendered = pydoc.render_doc(cls.__init__, renderer=pydoc.plaintext)
    assert "Args:" in doc
    for name in names:
        assert f"{name}:" in doc and f"{name}:" in rendered, (cls.__name__, name)
    assert "prepare_data_per_node" not in rendered  # not Lightning's LightningDataModule docstring
    assert prose in (cls.__doc__ or "")  # the class keeps its prose
