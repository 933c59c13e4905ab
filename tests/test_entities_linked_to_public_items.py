"""Private entities linked to public items (issue 34): unit ``entity_public_items``, the per-entity keyed cap, the
datamodule's two recipes, sensitivity through the real private step, evaluation and the DP popularity baseline.

The guarantee is for the *raw* data: removing one entity (and all its relations) from the HeteroData must change
nothing but that entity's kept tuples (its own keyed hash chooses its ≤ K relations, a public hash of its id its split),
and the released clipped sum by at most C·i (relation sampling, i ≤ K of its tuples) or C (entity-as-example).
"""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch
from torch_geometric.data import HeteroData

from ddp_helpers import SaveReleasedSums
from lightning_dprel.accounting.registry import check_unit
from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.methods.entity_items import (
    EntityItemDataModule, EntityItemRanker, dp_item_popularity, keyed_cap, ranking_metrics,
)
from lightning_dprel.methods.entity_items.popularity import gaussian_sigma_for

REL = ("user", "bought", "item")
K = 4
D = 8


pytestmark = [pytest.mark.filterwarnings("ignore:.*a public seed makes this randomness reproducible.*"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers.*")]


def make_data(ne=240, ni=40, *, max_deg=12, seed=0, item_graph=True) -> HeteroData:
    """Entities with 1..max_deg distinct items each (most above K), in shuffled column order."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["user"].ids = [f"u{i}" for i in range(ne)]
    data["user"].x = torch.randn(ne, D, generator=g)
    data["item"].ids = [f"i{j}" for j in range(ni)]
    data["item"].x = torch.randn(ni, D, generator=g)
    deg = torch.randint(1, max_deg + 1, (ne,), generator=g)
    cols = [(e, int(j)) for e in range(ne) for j in torch.randperm(ni, generator=g)[: int(deg[e])]]
    pairs = torch.tensor(cols).t()
    data[REL].edge_index = pairs[:, torch.randperm(pairs.size(1), generator=g)]
    if item_graph:
        data["item", "is_a", "item"].edge_index = torch.stack([torch.arange(1, ni), torch.zeros(ni - 1, dtype=torch.long)])
    return data


def without_entity(data: HeteroData, r: int) -> HeteroData:
    """The raw data with entity row ``r`` and all its relations removed (rows above it re-indexed)."""
    out = HeteroData()
    keep = torch.arange(data["user"].num_nodes) != r
    out["user"].ids = [u for j, u in enumerate(data["user"].ids) if j != r]
    out["user"].x = data["user"].x[keep]
    out["item"].ids, out["item"].x = list(data["item"].ids), data["item"].x.clone()
    e, i = data[REL].edge_index
    sel = e != r
    out[REL].edge_index = torch.stack([e[sel] - (e[sel] > r).long(), i[sel]])
    for et in data.edge_types:
        if et != REL:
            out[et].edge_index = data[et].edge_index.clone()
    return out


def dm_of(data, **kw) -> EntityItemDataModule:
    opts = dict(relation=REL, recipe="relation", max_relations=K, expected_batch_size=16, seed=0)
    return EntityItemDataModule(data, **{**opts, **kw})


def kept_tuples(dm) -> dict[str, set[tuple[str, str]]]:
    """Training entity id → its kept (entity id, item id) tuples; checks train_pairs and the entity rows agree."""
    out: dict[str, set] = {}
    for e, i in dm.train_pairs.t().tolist():
        out.setdefault(dm.entity_ids[e], set()).add((dm.entity_ids[e], dm.item_ids[i]))
    rows = {dm.entity_ids[int(dm.train_entities[r])]: {(dm.entity_ids[int(dm.train_entities[r])], dm.item_ids[i])
                                                        for i in row if i >= 0}
            for r, row in enumerate(dm.entity_items.tolist())}
    assert {k: v for k, v in rows.items() if v} == out
    return out


def split_of(dm) -> dict[str, int]:
    return dict(zip(dm.entity_ids, dm.part.tolist()))


# ---------------------------------------------------------------------- 1. removal from the raw data
@pytest.mark.parametrize("recipe,fraction", [("entity", 1.0), ("relation", 1.0), ("relation", 0.5)])
def test_removing_an_entity_from_the_raw_data_changes_only_its_own_tuples(recipe, fraction):
    data = make_data()
    full = dm_of(data, recipe=recipe, train_fraction=fraction)
    degree = torch.bincount(data[REL].edge_index[0], minlength=240)
    assert (degree[full.train_entities] > K).float().mean() > 0.5  # the cap matters for most entities
    tuples, split = kept_tuples(full), split_of(full)
    assert all(len(t) == min(int(degree[full.entity_ids.index(u)]), K) for u, t in tuples.items())
    for r in full.train_entities[:50].tolist():
        gone = full.entity_ids[r]
        dm = dm_of(without_entity(data, r), recipe=recipe, train_fraction=fraction)
        after = kept_tuples(dm)
        assert gone not in after and after == {u: t for u, t in tuples.items() if u != gone}
        flat_before = set().union(*tuples.values())
        assert flat_before - set().union(*after.values()) == tuples[gone]
        assert split_of(dm) == {u: p for u, p in split.items() if u != gone}


def test_entity_row_order_does_not_change_the_kept_tuples():
    data = make_data()
    perm = torch.randperm(240, generator=torch.Generator().manual_seed(5))
    inv = torch.argsort(perm)
    shuffled = HeteroData()
    shuffled["user"].ids = [data["user"].ids[int(p)] for p in perm]
    shuffled["user"].x = data["user"].x[perm]
    shuffled["item"].ids, shuffled["item"].x = data["item"].ids, data["item"].x
    e, i = data[REL].edge_index
    shuffled[REL].edge_index = torch.stack([inv[e], i])
    assert kept_tuples(dm_of(shuffled)) == kept_tuples(dm_of(data))
    assert split_of(dm_of(shuffled)) == split_of(dm_of(data))


# ---------------------------------------------------------------------- 2. keyed_cap
def test_keyed_cap_keeps_min_degree_k_per_entity_by_its_own_key():
    data = make_data()
    ids, items, pairs = data["user"].ids, data["item"].ids, data[REL].edge_index
    degree = torch.bincount(pairs[0], minlength=240)
    key_a, key_b = b"a" * 32, b"b" * 32
    for k in (1, 3, K):
        keep = keyed_cap(ids, items, pairs, k, key_a)
        assert torch.equal(torch.bincount(pairs[0][keep], minlength=240), degree.clamp(max=k))
    keep_a, keep_b = keyed_cap(ids, items, pairs, K, key_a), keyed_cap(ids, items, pairs, K, key_b)
    assert torch.equal(keep_a, keyed_cap(ids, items, pairs, K, key_a))  # deterministic
    changed = {int(e) for e in pairs[0][keep_a != keep_b]}
    assert changed and all(degree[e] > K for e in changed)  # only entities with a real choice move
    perm = torch.randperm(pairs.size(1), generator=torch.Generator().manual_seed(1))
    assert torch.equal(keyed_cap(ids, items, pairs[:, perm], K, key_a), keep_a[perm])  # column order is irrelevant
    sub = pairs[0] < 100  # an entity's choice reads only its own relations
    assert torch.equal(keyed_cap(ids, items, pairs[:, sub], K, key_a), keep_a[sub])


@pytest.mark.parametrize("key,k,match", [
    (b"short", K, "at least 16 bytes"), ("a" * 32, K, "at least 16 bytes"),
    (b"a" * 32, 0, r"`max_relations` \(K\) must be an int >= 1"), (b"a" * 32, True, "must be an int >= 1"),
    (b"a" * 32, 2.0, "must be an int >= 1"),
])
def test_keyed_cap_refuses_a_bad_key_or_k(key, k, match):
    data = make_data(ne=10)
    with pytest.raises(ValueError, match=match):
        keyed_cap(data["user"].ids, data["item"].ids, data[REL].edge_index, k, key)


# ---------------------------------------------------------------------- 3. sensitivity through the real step
def _first_released_sum(tmp_path, dm, batch, clip):
    """The clipped sum the DP optimizer noises at the first step of a fit whose only batch is ``batch``."""
    dm.next_batch = lambda: batch
    torch.manual_seed(0)
    model = EntityItemRanker(dim=D, item_bias=True, temperature=0.5, lr=1e-2)
    cb, saver = PrivacyCallback(delta=1e-5, clip_norm=clip, noise_multiplier=1.0), SaveReleasedSums(tmp_path)
    pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
               callbacks=[cb, saver]).fit(model, dm)
    assert cb.steps == 1 and "entities, public items" in cb.summary
    return saver.sums[0]


@pytest.mark.parametrize("clip", [0.01, 10.0])
@pytest.mark.parametrize("recipe,negatives", [("entity", 0), ("relation", 0), ("relation", 3)])
def test_removing_one_entity_moves_the_released_sum_by_at_most_c_times_its_tuples(tmp_path, recipe, negatives, clip):
    dm = dm_of(make_data(), recipe=recipe, neg_per_pos=negatives)
    counts = (dm.entity_items >= 0).sum(1)
    target = int(torch.nonzero(counts == K)[0])  # a training entity that holds K tuples
    others = torch.arange(24, 64)
    others = others[others != target]
    if recipe == "entity":
        rows = torch.cat([others, torch.tensor([target])])
        full = {"query": dm.entity_x[dm.train_entities[rows]], "items": dm.entity_items[rows]}
        drop, i = slice(0, -1), 1
    else:
        mine = torch.nonzero(dm.train_pairs[0] == dm.train_entities[target]).view(-1)
        rows = torch.cat([others, mine])
        ent, item = dm.train_pairs[:, rows]
        full = {"query": dm.entity_x[ent], "items": item[:, None]}
        if negatives:
            full["negatives"] = torch.randint(len(dm.item_ids), (rows.numel(), negatives),
                                              generator=torch.Generator().manual_seed(2))
        drop, i = slice(0, others.numel()), mine.numel()
        assert i == K
    without = {k: v[drop] for k, v in full.items()}
    move = float((_first_released_sum(tmp_path, dm, full, clip) - _first_released_sum(tmp_path, dm, without, clip)).norm())
    assert 0 < move <= clip * i * (1 + 1e-5)
    if clip == 0.01 and recipe == "entity":  # every example is clipped: the one removed row moves it by exactly C
        assert move >= 0.999 * clip


# ---------------------------------------------------------------------- 4. unit and spec
def test_unit_mechanism_and_sampling_spec_of_both_recipes():
    data = make_data()
    degree = torch.bincount(data[REL].edge_index[0], minlength=240)
    ent, rel = dm_of(data, recipe="entity"), dm_of(data, recipe="relation", neg_per_pos=2)
    n = int((ent.part == 0).sum())
    for dm in (ent, rel):
        assert dm.sampling_spec.privacy_unit == "entity_public_items" and dm.num_entities == n
        assert dm.sampling_spec.num_nodes == n + len(dm.item_ids) and dm.sampling_spec.units == n
        check_unit("entity_items", dm.sampling_spec.privacy_unit)
        with pytest.raises(ValueError, match="Privacy unit mismatch: mechanism 'standard'"):
            check_unit("standard", dm.sampling_spec.privacy_unit)
    with pytest.raises(ValueError, match="Privacy unit mismatch: mechanism 'entity_items'"):
        check_unit("entity_items", "entity")
    s = ent.sampling_spec
    assert (s.max_degree, s.num_edges, s.neg_per_pos) == (1, n, 0) and s.sampling_rate == pytest.approx(16 / n)
    m = int(degree[ent.train_entities].clamp(max=K).sum())
    s = rel.sampling_spec
    assert (s.max_degree, s.num_edges, s.neg_per_pos) == (K, m, 0) and s.sampling_rate == pytest.approx(16 / m)
    assert rel.train_pairs.size(1) == m
    b = ent.next_batch()  # one clipped example per entity, its ≤ K items
    assert b["items"].shape[1] == K and b["query"].shape[0] == b["items"].shape[0] > 0
    b = rel.next_batch()  # one tuple per relation with k public negatives
    assert b["items"].shape[1] == 1 and b["negatives"].shape == (b["items"].shape[0], 2)


# ---------------------------------------------------------------------- 5. bad input
def _no_x(data):
    del data["user"].x
    data["user"].names = list(data["user"].ids)
    return data


def _dup(data):
    data["item"].ids = ["same"] * data["item"].num_nodes
    return data


@pytest.mark.parametrize("edit,kwargs,error,match", [
    (lambda d: {"x": 1}, {}, TypeError, "must be a torch_geometric HeteroData"),
    (None, {"relation": ("user", "sold", "item")}, ValueError, "`relation` must be one of the data's edge types"),
    (None, {"recipe": "tuples"}, ValueError, r"`recipe` must be one of \('entity', 'relation'\)"),
    (None, {"recipe": "entity", "neg_per_pos": 2}, ValueError, "`neg_per_pos` is for recipe='relation'"),
    (_dup, {}, ValueError, r"data\['item'\].ids must be unique"),
    (_no_x, {}, ValueError, r"data\['user'\] needs features `x`, or `names` and a `transform`"),
    (None, {"split": (0.8, 0.1, 0.2)}, ValueError, "`split` must be three fractions >= 0 summing to 1"),
    (None, {"split": (0.8, 0.2)}, ValueError, "`split` must be three fractions"),
    (None, {"train_fraction": 0.0}, ValueError, r"`train_fraction` must be in \(0, 1\]"),
    (None, {"train_fraction": 1.5}, ValueError, r"`train_fraction` must be in \(0, 1\]"),
    (None, {"max_relations": 0}, ValueError, "max_relations"),
])
def test_bad_input_is_refused_with_a_clear_error(edit, kwargs, error, match):
    data = make_data(ne=40)
    if edit is not None:
        data = edit(data)
    with pytest.raises(error, match=match):
        dm_of(data, **kwargs)


@pytest.mark.parametrize("recipe", ["entity", "relation"])
def test_an_expected_batch_size_above_the_sampled_population_is_refused(recipe):
    dm = dm_of(make_data(ne=40), recipe=recipe, expected_batch_size=1e6)
    with pytest.raises(ValueError, match=rf"`expected_batch_size` must be in \(0, \d+\] for recipe '{recipe}'"):
        dm.sampling_spec
    population = dm.num_entities if recipe == "entity" else dm.train_pairs.size(1)
    dm_of(make_data(ne=40), recipe=recipe, expected_batch_size=population).sampling_spec  # b = n is allowed
    with pytest.raises(ValueError, match="`expected_batch_size` must be in"):
        dm_of(make_data(ne=40), recipe=recipe, expected_batch_size=population + 1).sampling_spec


# ---------------------------------------------------------------------- 6. train_fraction
def test_train_fraction_keeps_about_half_and_never_moves_an_entity_to_validation_or_test():
    data = make_data(ne=600)
    full, half = dm_of(data), dm_of(data, train_fraction=0.5)
    n = full.num_entities
    assert abs(half.num_entities - n / 2) <= 4 * math.sqrt(n / 4)  # Binomial(n, 1/2), 4 standard deviations
    assert torch.equal(full.part == 1, half.part == 1) and torch.equal(full.part == 2, half.part == 2)
    assert set(torch.unique(half.part).tolist()) == {-1, 0, 1, 2}
    assert torch.equal((half.part == 0) | (half.part == -1), full.part == 0)
    before, after = kept_tuples(full), kept_tuples(half)
    assert after == {u: t for u, t in before.items() if half.part[half.entity_ids.index(u)] == 0}
    assert set(half.eval_set(1)[0].tolist()) == set(full.eval_set(1)[0].tolist())


# ---------------------------------------------------------------------- 7. evaluation
def test_ranking_metrics_match_a_hand_computed_map_and_recall():
    n_items = 30
    scores = -torch.arange(n_items, dtype=torch.float32).repeat(3, 1)  # item j ranked j + 1 for every entity
    target = torch.zeros(3, n_items, dtype=torch.bool)
    target[0, [0, 2]] = True  # ranks 1, 3: AP = (1/1 + 2/3) / 2, recall@20 = 1
    target[1, [1, 20, 24]] = True  # ranks 2, 21, 25: AP = (1/2 + 2/21 + 3/25) / 3, recall@20 = 1/3
    # entity 2 has no relevant item: skipped
    ap = [(1 + 2 / 3) / 2, (1 / 2 + 2 / 21 + 3 / 25) / 3]
    out = ranking_metrics(scores, target)
    assert out["map"] == pytest.approx(sum(ap) / 2, rel=1e-6)
    assert out["recall@20"] == pytest.approx((1 + 1 / 3) / 2, rel=1e-6)
    assert ranking_metrics(scores, target, top_k=2)["recall@2"] == pytest.approx((1 / 2 + 1 / 3) / 2, rel=1e-6)
    with pytest.raises(ValueError, match=r"`scores` and `target` must be \[E, n_items\] alike"):
        ranking_metrics(scores[:, :5], target)


def test_eval_targets_are_all_raw_relations_of_validation_and_test_entities():
    data = make_data()
    dm = dm_of(data)
    raw: dict[int, set[int]] = {}
    for e, i in data[REL].edge_index.t().tolist():
        raw.setdefault(e, set()).add(i)
    uncapped = 0
    for part in (1, 2):
        rows, target = dm.eval_set(part)
        assert torch.equal(rows, torch.nonzero(dm.part == part).view(-1)) and rows.numel() > 0
        assert target.shape == (rows.numel(), 40)
        for r, t in zip(rows.tolist(), target):
            assert set(torch.nonzero(t).view(-1).tolist()) == raw[r]
            uncapped += len(raw[r]) > K
        assert not set(rows.tolist()) & set(dm.train_pairs[0].tolist())  # never trained on
    assert uncapped > 0  # the cap would have changed these targets


# ---------------------------------------------------------------------- 8. DP popularity
@pytest.fixture(scope="module")
def popularity_data():
    return make_data(ne=300, ni=3000, max_deg=10, item_graph=False)


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-5), (1.0, 1e-4), (4.0, 1e-6)])
def test_dp_popularity_charges_at_most_the_requested_epsilon(popularity_data, epsilon, delta):
    dm = dm_of(popularity_data)
    _, ledger = dp_item_popularity(dm, epsilon, delta, seed=0)
    assert 0.98 * epsilon <= ledger.epsilon(delta) <= epsilon
    _, twice = dp_item_popularity(dm, epsilon, delta, ledger=ledger, seed=1)
    assert twice is ledger and ledger.epsilon(delta) > epsilon  # a second release is charged to the same ledger


def test_dp_popularity_noise_has_std_sigma_root_k(popularity_data):
    dm = dm_of(popularity_data)
    noisy, _ = dp_item_popularity(dm, 1.0, 1e-5, seed=3)
    counts = torch.bincount(dm.train_pairs[1], minlength=3000).double()
    noise = noisy.double() - counts
    std = gaussian_sigma_for(1.0, 1e-5) * math.sqrt(K)
    assert float(noise.std()) == pytest.approx(std, rel=0.05)  # 3000 draws: the sample std is within ~1.3 %
    assert abs(float(noise.mean())) <= 4 * std / math.sqrt(3000)
    again, _ = dp_item_popularity(dm, 1.0, 1e-5, seed=3)
    assert torch.equal(again, noisy)


def test_dp_popularity_counts_move_by_at_most_root_k_when_one_entity_is_removed(popularity_data):
    dm = dm_of(popularity_data)
    moves = []
    for r in dm.train_entities[:10].tolist():
        other = dm_of(without_entity(popularity_data, r))
        a, _ = dp_item_popularity(dm, 1.0, 1e-5, seed=7)
        b, _ = dp_item_popularity(other, 1.0, 1e-5, seed=7)  # same seed, same item count: the same noise
        i = int((dm.train_pairs[0] == r).sum())
        move = float((a.double() - b.double()).norm())
        assert move == pytest.approx(math.sqrt(i), abs=1e-4)  # i distinct kept items, each count −1
        moves.append(move)
    assert max(moves) <= math.sqrt(K) + 1e-4 and max(moves) == pytest.approx(math.sqrt(K), abs=1e-4)


def test_fast_ranking_metrics_agree_with_torchmetrics_on_signed_scores():
    from lightning_dprel.methods.entity_items import fast_ranking_metrics, ranking_metrics

    g = torch.Generator().manual_seed(3)
    scores = torch.randn(40, 300, generator=g) * 5 - 2  # many scores <= 0
    target = torch.rand(40, 300, generator=g) < 0.05
    target[0] = False  # an entity with nothing relevant is skipped by both
    slow, fast = ranking_metrics(scores, target), fast_ranking_metrics(scores, target)
    assert slow.keys() == fast.keys()
    for k in slow:
        assert fast[k] == pytest.approx(slow[k], rel=1e-6) and 0 < slow[k] < 1
