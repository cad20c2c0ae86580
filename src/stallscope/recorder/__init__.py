"""The hot path: patches installed in the target process and its DataLoader workers.

Everything here only appends plain values (timestamps, ids, byte counts) to a per-process
buffer that is flushed to that process's own event file. No analysis happens here.
"""
