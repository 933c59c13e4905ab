"""One package per method; each imports the core and never another method."""
