"""The SimPy GPU simulator (not built yet)."""
