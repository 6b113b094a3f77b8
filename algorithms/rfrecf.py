"""RFRecF lives in :mod:`algorithms.rfrec`; this module is the registry's entry point."""

from algorithms.rfrec import ALGORITHMS, RFRecFConfig

ALGORITHM = ALGORITHMS["rfrecf"]

__all__ = ["ALGORITHM", "ALGORITHMS", "RFRecFConfig"]
