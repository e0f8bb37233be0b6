"""The hardware-aware cost model: profiles, model specs, roofline, calibration (paper §3.4, G).

Importing this package reads no file and starts nothing; profiles and configs are read when asked
for.
"""
