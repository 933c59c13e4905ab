"""A sampled softmax for entities linked to public items: each step draws S items from the public vocabulary, from the
keyed stream alone, and every entity of the step shares them as negatives. The draw reads no data, so removing an
entity changes no step's draw, and it still moves the released clipped sum by at most C (one clip per entity): the
mechanism, its unit and its accounting are those of the full softmax. The loss's weighting makes it the full softmax
when every item is drawn.
"""

from __future__ import annotations

import pytest
import torch

from lightning_dprel.core.example_views import TensorRows
from lightning_dprel.core.per_example_data import concat_examples
from lightning_dprel.methods.entity_items import EntityItemDataModule, EntityItemRanker
from test_entities_linked_to_public_items import D, K, REL, _first_released_sum, make_data, without_entity

pytestmark = [pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers.*")]

S = 12


def dm_of(data, **kw) -> EntityItemDataModule:
    opts = dict(relation=REL, recipe="entity", max_relations=K, expected_batch_size=48, sampled_items=S, seed=0)
    return EntityItemDataModule(data, **{**opts, **kw})


def test_the_draw_reads_no_data_and_is_shared_by_every_entity_of_the_step():
    data = make_data()
    full, removed = dm_of(data), dm_of(without_entity(data, 7))
    other = dm_of(make_data(seed=3))  # other data altogether, same item vocabulary size
    draws = []
    for _ in range(5):
        a, b, c = full.next_batch(), removed.next_batch(), other.next_batch()
        assert a["sampled"].shape == (S,) and a["sampled"].unique().numel() == S  # without replacement
        assert torch.equal(a["sampled"], b["sampled"]) and torch.equal(a["sampled"], c["sampled"])
        draws.append(a["sampled"])
    assert len({tuple(d.tolist()) for d in draws}) == 5  # a fresh draw every step


def test_with_every_item_drawn_the_loss_is_the_full_softmax():
    dm = dm_of(make_data(), sampled_items=0)
    torch.manual_seed(0)
    model = EntityItemRanker(dm.item_x, dim=D, item_bias=True, temperature=0.5)
    torch.nn.init.normal_(model.adapter.weight, std=0.3)
    torch.nn.init.normal_(model.item_bias, std=0.3)
    batch = dm.next_batch()
    every = torch.randperm(len(dm.item_ids))
    full = model.training_step(batch)
    sampled = model.training_step({**batch, "sampled": every})
    assert torch.allclose(full, sampled, rtol=1e-5, atol=1e-6)
    few = model.training_step({**batch, "sampled": every[:S]})
    assert torch.isfinite(few) and not torch.allclose(full, few)


def test_the_loss_of_an_entity_depends_on_its_own_items_and_the_draw_only():
    dm = dm_of(make_data())
    torch.manual_seed(0)
    model = EntityItemRanker(dm.item_x, dim=D, temperature=0.5)
    torch.nn.init.normal_(model.adapter.weight, std=0.3)
    batch = dm.next_batch()
    per_example = model.sampled_softmax_loss(batch["query"], batch["items"], batch["sampled"])
    alone = torch.stack([model.sampled_softmax_loss(batch["query"][i:i + 1], batch["items"][i:i + 1], batch["sampled"])[0]
                         for i in range(batch["query"].size(0))])
    assert torch.allclose(per_example, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip", [0.01, 10.0])
def test_removing_one_entity_moves_the_released_sum_by_at_most_c(tmp_path, clip):
    data = make_data()
    dm = dm_of(data)
    target = int(torch.nonzero((dm.entity_items >= 0).sum(1) == K)[0])
    full = dm.next_batch()  # the real step's batch: its Poisson sample and its draw
    rows = torch.cat([torch.arange(24, 64)[torch.arange(24, 64) != target], torch.tensor([target])])
    full = {"query": dm.entity_x[dm.train_entities[rows]], "items": dm.entity_items[rows], "sampled": full["sampled"]}
    without = {"query": full["query"][:-1], "items": full["items"][:-1], "sampled": full["sampled"]}  # same draw
    move = float((_first_released_sum(tmp_path, dm, full, clip) - _first_released_sum(tmp_path, dm, without, clip)).norm())
    assert 0 < move <= clip * (1 + 1e-5)
    if clip == 0.01:  # every entity is clipped: the removed one moves the sum by exactly C
        assert move >= 0.999 * clip


def test_the_unit_mechanism_and_sampling_spec_are_the_full_softmax_ones():
    data = make_data()
    sampled, full = dm_of(data), dm_of(data, sampled_items=0)
    assert sampled.privacy_unit == full.privacy_unit == "entity_public_items"
    assert sampled.sampling_spec == full.sampling_spec


def test_the_shared_draw_is_one_tensor_for_vmap_and_each_example():
    view = TensorRows(shared=("sampled",))
    batch = {"query": torch.randn(5, 3), "items": torch.zeros(5, 2, dtype=torch.long), "sampled": torch.arange(4)}
    assert view.size(batch) == 5
    assert view.in_dims(batch) == {"query": 0, "items": 0, "sampled": None}
    examples = list(view.examples(batch))
    assert all(torch.equal(e["sampled"], batch["sampled"]) and e["query"].shape == (1, 3) for e in examples)
    joined = concat_examples(examples, "hook", ("sampled",))
    assert all(torch.equal(joined[k], batch[k]) for k in batch)
    examples[2] = {**examples[2], "sampled": torch.arange(4) + 1}  # a hook that changed it for one example
    with pytest.raises(ValueError, match="shared public key 'sampled'"):
        concat_examples(examples, "hook", ("sampled",))
    mean = {**batch, "sampled": batch["query"].mean(0)}  # a batch statistic declared shared: every loss would read it
    with pytest.raises(ValueError, match="must hold integer ids"):
        view.size(mean)


@pytest.mark.parametrize("kwargs,match", [
    (dict(recipe="relation", sampled_items=4), "`sampled_items` is for recipe='entity'"),
    (dict(sampled_items=40), "must be below the 40 items"),
    (dict(sampled_items=-1), "sampled_items"),
])
def test_bad_sampled_items_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dm_of(make_data(), **kwargs)


def test_shared_keys_from_a_sampler_that_is_not_the_librarys_are_refused(tmp_path):
    """A subclass whose next_batch shares other entities' items (in-batch negatives) would move every loss by data
    the clip does not bound: refused before the first step."""

    class InBatchNegatives(EntityItemDataModule):
        def next_batch(self):
            batch = super().next_batch()
            return {**batch, "sampled": batch["items"].clamp(min=0).reshape(-1).unique()}

    dm = InBatchNegatives(make_data(), relation=REL, max_relations=K, expected_batch_size=48, sampled_items=S, seed=0)
    with pytest.raises(ValueError, match="only the library's samplers draw them|Only the library's samplers draw them"):
        _first_released_sum(tmp_path, dm, dm.next_batch(), 1.0)
