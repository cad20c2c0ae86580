"""A script that never builds a DataLoader: the verdict must be 'unknown', said plainly."""
import sys

total = sum(i * i for i in range(10000))
print("total", total)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
