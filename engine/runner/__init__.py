"""How a step runs (not what the model computes): step plans and the executor every rank applies them with
(`executor.py`), and the lane decoder that replays decode steps from captured CUDA graphs (`lanes.py`). The model
(engine/models/) gives layers and its static `decode_step`; it never imports this package."""
