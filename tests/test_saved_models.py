"""Issue 12 (6): a trained model can be loaded, used to embed new texts, and exported without its secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_dprel.callbacks import PrivacyCallback
from lightning_dprel.cli import main
from lightning_dprel.datamodules import RelationalDataModule
from lightning_dprel.demos import WORDS, random_feature_graph, random_text_graph
from lightning_dprel.demos.boring_classes import quiet_trainer
from lightning_dprel.encoders import MLPEncoder, ResidualAdapter, TextEncoder
from lightning_dprel.methods.relational.module import DPRelationalModule
from lightning_dprel.transforms import EmbedText, embed_texts

NOISE_SEED, SAMPLING_SEED = 987654321, 123456789
TEXTS = ["heart lung fever", "alpha beta gamma delta", "red green blue"]


def _fit(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A 3-step private fit (seeded, so the test can look for the seeds in what is exported)."""
    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path / "cache"))
    dm_kw: dict = dict(expected_batch_size=8, neg_per_pos=1, max_length=16, sampling_seed=SAMPLING_SEED)
    if kind == "mlp":
        encoder, data = MLPEncoder(16, hidden_dim=8, out_dim=8), random_feature_graph(80, 200)
    elif kind == "adapter":
        encoder, data = ResidualAdapter(32, rank=2, directed=True), random_text_graph(80, 200)
        dm_kw.update(transform=EmbedText("tiny-bert", max_length=16), directed=True)
    else:
        encoder, data = TextEncoder("tiny-bert", lora_r=2), random_text_graph(80, 200)
    score = "directed_cosine" if kind == "adapter" else "cosine"
    with pytest.warns(UserWarning, match="seed"):
        dm = RelationalDataModule(data, **dm_kw)
        module = DPRelationalModule(encoder, noise_multiplier=1.0, noise_seed=NOISE_SEED, lr=0.05, score=score)
    trainer = quiet_trainer([PrivacyCallback(target_epsilon=None, delta=1e-4)], max_steps=3)
    trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("kind", ["mlp", "adapter", "text"])
@pytest.mark.filterwarnings(r"ignore:DPRelationalModule\(noise_seed=<int>\)")
def test_load_from_checkpoint_rebuilds_the_encoder(kind, tmp_path, monkeypatch):
    module, dm, trainer = _fit(kind, tmp_path, monkeypatch)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    loaded = DPRelationalModule.load_from_checkpoint(path, map_location="cpu")
    assert type(loaded.encoder) is type(module.encoder)
    _same_weights(loaded, module)
    assert loaded.privacy_ledger.state_dict() == module.privacy_ledger.state_dict() and loaded.privacy_ledger.private_steps == 3
    inputs = dm.test_inputs
    torch.testing.assert_close(loaded.eval().embed(inputs), module.eval().embed(inputs))
    assert loaded.input_spec == module.input_spec and loaded.input_spec["max_length"] == 16


def test_embed_texts_tokenises_with_the_encoders_tokenizer(tmp_path, monkeypatch):
    module, _, _ = _fit("text", tmp_path, monkeypatch)
    from transformers import AutoTokenizer

    from lightning_dprel.demos import resolve_pretrained

    enc = AutoTokenizer.from_pretrained(resolve_pretrained("tiny-bert"))(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="pt")
    expected = module.eval().encoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    torch.testing.assert_close(module.embed_texts(TEXTS), expected)
    # predict_step: texts, a dict of node inputs, or a RankingBatch give embeddings
    out = quiet_trainer().predict(module, dataloaders=DataLoader(TEXTS, batch_size=2))
    torch.testing.assert_close(torch.cat(out), expected)


def test_embed_texts_of_the_frozen_feature_adapter_embeds_with_the_frozen_model_first(tmp_path, monkeypatch):
    module, dm, _ = _fit("adapter", tmp_path, monkeypatch)
    assert module.input_spec["embed_text"] == {"model_name": "tiny-bert", "max_length": 16}
    x = embed_texts(TEXTS, "tiny-bert", max_length=16)
    torch.testing.assert_close(module.embed_texts(TEXTS), module.eval().encoder(x))
    out = quiet_trainer().predict(module, dataloaders=DataLoader([{"x": x}], batch_size=None))
    torch.testing.assert_close(out[0], module.encoder(x))
    mlp, _, _ = _fit("mlp", tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="dense features"):
        mlp.embed_texts(TEXTS)


def test_export_writes_weights_privacy_report_and_ledger_but_no_secret(tmp_path, monkeypatch):
    from lightning_dprel.export import export_model, load_exported

    module, _, _ = _fit("text", tmp_path, monkeypatch)
    out = export_model(module, tmp_path / "export")
    names = {p.name for p in out.iterdir()}
    assert {"weights.safetensors", "model.json", "privacy.json", "ledger.json", "peft_adapter"} <= names
    report = json.loads((out / "privacy.json").read_text())
    assert report["steps"] == 3 and report["private_steps"] == 3 and report["delta"] == 1e-4
    assert report["epsilon"] == pytest.approx(module.privacy_ledger.epsilon(1e-4)) and report["epsilon"] > 0
    assert report["noise_multiplier"] == 1.0 and report["accounting"] == "FREQ-CLIP corrected"
    assert json.loads((out / "ledger.json").read_text()) == json.loads(json.dumps(module.privacy_ledger.state_dict()))
    from safetensors.torch import load_file

    weights = load_file(out / "weights.safetensors")
    trainable = {n for n, p in module.encoder.named_parameters() if p.requires_grad}
    assert set(weights) == trainable and all("lora" in n for n in weights)
    # nothing that regenerates the noise or the batches: no seed, no stream position, no key
    for f in out.rglob("*"):
        if f.is_file():
            blob = f.read_bytes()
            for secret in (str(NOISE_SEED), str(SAMPLING_SEED), "noise_seed", "sampling_seed", '"counter"', "KeyedStream"):
                assert secret.encode() not in blob, (f.name, secret)
    # the export alone rebuilds the model
    again = load_exported(out)
    torch.testing.assert_close(again.embed_texts(TEXTS), module.embed_texts(TEXTS))
    assert again.privacy_ledger.state_dict() == module.privacy_ledger.state_dict()


@pytest.mark.slow
def test_main_job_keeps_the_selected_model_and_the_export_command_writes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_DPREL_CACHE", str(tmp_path / "cache"))
    cli = main(["fit", "--config", "configs/tiny_adapter.yaml", "--trainer.default_root_dir", str(tmp_path)])
    ckpt = tmp_path / "model.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in tmp_path.iterdir())
    loaded = DPRelationalModule.load_from_checkpoint(ckpt, map_location="cpu")
    _same_weights(loaded, cli.model)  # the selected iterate, not the last one
    torch.testing.assert_close(loaded.embed_texts(TEXTS), cli.model.embed_texts(TEXTS))
    main(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "export")])
    report = json.loads((tmp_path / "export" / "privacy.json").read_text())
    assert report["steps"] == cli.model.privacy_ledger.steps == 20 and report["accounting"] == "standard (Thm C.1)"
    assert report["delta"] == pytest.approx(next(cb.delta for cb in cli.trainer.callbacks if isinstance(cb, PrivacyCallback)))
    assert 0 < report["epsilon"] <= 8.0


def test_words_cover_the_test_texts():
    assert all(w in WORDS for t in TEXTS for w in t.split())
