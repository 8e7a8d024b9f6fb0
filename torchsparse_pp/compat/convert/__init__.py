"""Checkpoint conversion between the peers' layouts and torchsparse_pp's (``torchsparse-pp convert``)."""
from .convert import Report, to_native, to_peer
from .names import TABLES, Table, table_for

__all__ = ["to_native", "to_peer", "table_for", "Table", "TABLES", "Report"]
