"""The SimPy GPU simulator, imported as ``bastion.sim``.

The code lives in the repository's top-level ``sim/`` folder; ``bastion/sim`` links to it, and
the wheel installs it as ``bastion/sim`` (no top-level ``sim`` module is installed). See
docs/simulator.md.
"""
