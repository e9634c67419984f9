"""Vision inputs: image sources, preprocessing."""
