"""pyarrow schemas: the one place where column names and types of every table are defined."""

from schemas import captions, subsets  # noqa: F401
