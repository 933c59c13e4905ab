"""DP-GPL: private graph prompts by PATE over teacher prompts (Confident-GNMax), provable by default (docs/dp_gpl.md)."""

from lightning_dprel.methods.dp_gpl import accounting  # noqa: F401 - registers its unit and mechanism first
from lightning_dprel.methods.dp_gpl.aggregation import Answers, confident_gnmax, gnmax, pate_releases, vote_histogram
from lightning_dprel.methods.dp_gpl.datamodule import PromptDataModule
from lightning_dprel.methods.dp_gpl.dpsgd import DPPromptTuning, PrivateNodeExamples, dpsgd_baseline_accuracy
from lightning_dprel.methods.dp_gpl.egonets import EgoBatch, EgoNets
from lightning_dprel.methods.dp_gpl.module import DP_GPL_PAPER_WARNING, DPGPLModule
from lightning_dprel.methods.dp_gpl.pretrain import GraphEncoder, pretrain
from lightning_dprel.methods.dp_gpl.query_groups import group_votes, public_clusters
from lightning_dprel.methods.dp_gpl.prompts import GPF, AnswerHead, GPFPlus, build_prompt
from lightning_dprel.methods.dp_gpl.tuning import PromptedModel, TuningConfig, train_teachers_and_vote, tune_prompts

__all__ = ["Answers", "confident_gnmax", "gnmax", "group_votes", "public_clusters", "pate_releases", "vote_histogram", "PromptDataModule", "EgoBatch", "EgoNets",
           "DPGPLModule", "DP_GPL_PAPER_WARNING", "GraphEncoder", "pretrain", "GPF", "GPFPlus", "AnswerHead", "build_prompt",
           "PromptedModel", "TuningConfig", "train_teachers_and_vote", "tune_prompts", "DPPromptTuning", "PrivateNodeExamples",
           "dpsgd_baseline_accuracy"]
