"""A Lightning project: an MLP classifier on a TensorDataset."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLPClassifier(pl.LightningModule):
    def __init__(self, num_features: int, num_classes: int, hidden: int = 32, lr: float = 0.5):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class TabularData(pl.LightningDataModule):
    def __init__(self, x, y, batch_size: int = 64, val_fraction: float = 0.2):
        super().__init__()
        self.x, self.y, self.batch_size, self.val_fraction = x, y, batch_size, val_fraction

    def setup(self, stage=None):
        n_val = int(len(self.x) * self.val_fraction)
        self.train = TensorDataset(self.x[n_val:], self.y[n_val:])
        self.val = TensorDataset(self.x[:n_val], self.y[:n_val])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=512)


def make_trainer(max_epochs: int = 3, **kwargs):
    return pl.Trainer(max_epochs=max_epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)
