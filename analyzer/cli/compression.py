"""``compression``: the weight-compression presets and spec grammar, and a spec resolved for N layers."""

from __future__ import annotations

import argparse
import json
from typing import Any

from analyzer import fmt
from analyzer.cli.common import positive_int
from analyzer.convert.compress import ASSUMED_ATTENTION, PRESETS, canonical_spec, parse_spec

HELP = f"""\
Compression spec: one line of comma-separated items (quote it in the shell: it contains [ ]).

  PRESET                     base | top8 | top12 (at most one; your items override it)
  PART=SCHEME                PART: ffn | attn | embed | lm_head; parts not named stay fp16
  layers[SET]=SCHEME         FFN and attention of those layers
  ffn[SET]=SCHEME            only the FFN (or attn[SET]: only attention) of those layers
  group=N                    output channels sharing one palette (default 16)

  SET     N | N-M | first:N | last:N, comma-separated; 0-based, inclusive
  SCHEME  fp16 | int8 (symmetric, per output channel) | pal2 pal3 pal4 pal6 pal8 (per_grouped_channel LUT;
          uniform by default, :kmeans for k-means: ~10x slower, and palettes under 10,000 weights need
          scikit-learn)

The most specific item wins (ffn[..]/attn[..] > layers[..] > ffn=/attn=), in any order.
The presets' attention precision outside the promoted layers ({ASSUMED_ATTENTION}) is an assumption: the write-up
states FFN, lm_head, embedding and the promoted layers only. Change it with e.g. 'top8,attn=int8'.
Weights are random unless you load safetensors, so no layer-sensitivity ranking exists: the presets
promote the first and last layers; name other layers yourself (e.g. layers[0-3,26-29]=int8).
Compressed sizes are read back from the built graph, never estimated from the spec.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``compression``: the presets, the spec format, and a spec resolved for N layers."""
    p = subparsers.add_parser(
        "compression", help="list weight-compression presets and explain the spec format",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", nargs="?", default="top8", help="a preset or spec to resolve (default: top8)")
    p.add_argument("--layers", type=positive_int, default=30,
                   help="decoder layers to resolve first:/last: rules for (default 30, EXAONE 4.0 1.2B)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=cmd_compression)
    return p


def compression_document(spec: str, num_layers: int) -> dict[str, Any]:
    plan = parse_spec(spec, num_layers)
    return {
        "presets": [{"name": p.name, "spec": p.spec, "description": p.description,
                     "canonical": canonical_spec(p.name, num_layers), "attention": p.attention,
                     "assumption": p.assumption} for p in PRESETS.values()],
        "help": HELP,
        "resolved": {"input": spec, **plan.to_json()},
    }


def cmd_compression(args) -> int:
    doc = compression_document(args.spec, args.layers)
    if args.json:
        print(json.dumps(doc))
        return 0
    print(fmt.table([(p["name"], p["description"], p["spec"]) for p in doc["presets"]],
                    ("preset", "what", "spec")))
    print()
    print(HELP)
    r = doc["resolved"]
    print(f"{args.spec} on {args.layers} layers = {r['spec']}")
    print(fmt.table([(row["layer"], row["ffn"], row["attn"]) for row in r["layers"]], ("layer", "ffn", "attn")))
    print(f"embed: {r['embed']}   lm_head: {r['lm_head']}" +
          (f"   palette group: {r['group_channels']} channels" if "pal" in r["spec"] else ""))
    return 0
