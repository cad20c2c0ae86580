"""Packing an image folder or file list into LMDB or WebDataset shards (``stallscope pack``)."""

from stallscope.data.packing.packer import PackError, PackOptions, PackResult, pack
from stallscope.data.packing.verify import VerifyResult, verify

__all__ = ["PackError", "PackOptions", "PackResult", "VerifyResult", "pack", "verify"]
