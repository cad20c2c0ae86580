"""The built-in demo: a realistic JPEG dataset and a reference training script with plantable bottlenecks."""
