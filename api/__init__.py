"""Shared vocabulary: Karpenter-compatible names, quantities and the models at karpflow's boundaries."""
