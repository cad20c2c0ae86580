"""Packing an image folder or file list into LMDB or WebDataset shards (``stallscope pack``)."""

from stallscope.data.packing.packer import PackError, PackOptions, PackResult, PackWriteError, pack
from stallscope.data.packing.verify import VerifyResult, verify

__all__ = ["PackError", "PackOptions", "PackResult", "PackWriteError", "VerifyResult", "pack", "verify"]
