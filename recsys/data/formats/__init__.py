"""The input formats (``data.format``), one module each, and their registry
(:mod:`recsys.data.formats.reader`): what a format is, how it is detected, read in memory and out
of core, what its time means and where its categories come from is decided in its module alone.

Built in, in the order detection asks them (a reader registered later is asked before them):
``movielens`` (:mod:`~recsys.data.formats.movielens`), ``parquet``
(:mod:`~recsys.data.formats.parquet`), ``comirec`` (:mod:`~recsys.data.formats.comirec`),
``csv`` then ``tsv`` (:mod:`~recsys.data.formats.csv`; a first line with commas and tabs is CSV)
and last ``sequences`` (:mod:`~recsys.data.formats.sequences`), which takes any first line.
"""

from recsys.data.formats.comirec import Comirec
from recsys.data.formats.csv import NamedColumns
from recsys.data.formats.movielens import MovieLens
from recsys.data.formats.parquet import Parquet
from recsys.data.formats.reader import (
    TEXT_SUFFIXES,
    Reader,
    TableReader,
    all_readers,
    data_suffixes,
    detect,
    reader_for,
    reader_names,
    register_reader,
    unregister_reader,
)
from recsys.data.formats.sequences import Sequences

# in the order detection asks them: registered the other way round, as the latest registered is asked first
BUILT_IN = (MovieLens(), Parquet(), Comirec(), NamedColumns("csv", ","), NamedColumns("tsv", "\t"), Sequences())
for _reader in reversed(BUILT_IN):
    register_reader(_reader)

__all__ = [
    "BUILT_IN",
    "TEXT_SUFFIXES",
    "Reader",
    "TableReader",
    "all_readers",
    "data_suffixes",
    "detect",
    "reader_for",
    "reader_names",
    "register_reader",
    "unregister_reader",
]
