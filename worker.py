"""Entry point of the karpflow worker (see issue 3)."""
