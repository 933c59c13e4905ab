"""Node-level DP-GCN with random graph splits (Igamberdiev & Habernal 2022), corrected to replace-one accounting."""

from lightning_dprel.methods.dp_gcn import accounting  # noqa: F401 - registers its unit and mechanisms
