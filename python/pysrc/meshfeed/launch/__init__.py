"""Launchers of meshfeed jobs without mpirun, run as modules: ``python -m
meshfeed.launch.ray`` (one Ray actor per rank, on a local Ray instance or a running Ray
cluster). Importing :mod:`meshfeed` does not import them, nor what they need (Ray).
"""
