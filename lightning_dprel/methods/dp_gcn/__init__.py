"""Node-level DP-GCN with random graph splits (Igamberdiev & Habernal 2022), corrected to replace-one accounting."""
