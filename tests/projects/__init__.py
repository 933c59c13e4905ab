"""Small Lightning projects written as they would be without lightning_dprel, and their made-private copies."""
