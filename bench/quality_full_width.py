"""`python -m engine quality`'s measurements on GLM-5.3-Flash's own widths: bench/gpu_engine.py's 4-layer KKKD build
(random bf16 weights, full width, on the GPU), synthetic token ids; the exact mode (bf16 weights, bf16 cache rows,
token-by-token KDA) against the served choices one at a time.

    python bench/quality_full_width.py [--tokens 512] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gpu_engine import RandomReader, TextConfig, prompt_ids  # noqa: E402

from engine import quality  # noqa: E402
from engine.models.glm5_next.model import Glm5NextForCausalLM  # noqa: E402
from engine.parallel import ParallelGroup  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    quality.add_arguments(parser)
    args = parser.parse_args(["unused", *sys.argv[1:]])
    raw = json.loads((ROOT / "engine/checkpoint/glm53_flash_config.json").read_text())
    text = dict(raw.get("text_config") or raw)
    text.update(
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        indexer_types=["full"] * 4,
        num_nextn_predict_layers=0,
    )
    raw = {"text_config": text}
    cfg = TextConfig.from_dict(raw)
    group = ParallelGroup.single("cuda")

    def factory(mode: dict[str, str]):
        reader = RandomReader(raw, quality.DTYPES[mode["weights"]], "cuda", group)
        return Glm5NextForCausalLM(cfg, reader, group, None, mode["kda"] == "chunked", dense=mode["dense"])

    args.mode = args.mode or ["dense=q4", "dense=fp8", "kv=fp8", "kda=chunked", "dense=q4,kv=fp8,kda=chunked"]
    result = quality.measure(args, "cuda", prompt_ids(cfg, args.tokens), factory)
    result["checkpoint"] = "random full-width KKKD (bench/gpu_engine.py), synthetic ids"
    print(quality.table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
