"""Command line of the test-model generator (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import modelgen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="modelgen", description="Write the tiny test model or a bad variant."
    )
    parser.add_argument("directory", nargs="?", help="where to write the model")
    parser.add_argument(
        "--variant", choices=modelgen.VARIANTS, help="a bad variant instead of the good model"
    )
    parser.add_argument("--version", default="1", help="release (changes the weights' bytes)")
    parser.add_argument("--publisher", help="also write the publisher's listing of the good model here")
    parser.add_argument(
        "--publisher-format", default="model_manifest", choices=["model_manifest", "sha256sum", "hf_json"]
    )
    parser.add_argument("--eicar-database", help="write a ClamAV database with the EICAR signature here")
    args = parser.parse_args(argv)
    if not (args.directory or args.eicar_database or args.publisher):
        parser.error("nothing to do: give a directory, --publisher or --eicar-database")
    if args.directory:
        if args.variant:
            modelgen.write_variant(args.directory, args.variant, args.version)
        else:
            modelgen.write_good_model(args.directory, args.version)
    if args.publisher:
        modelgen.write_publisher_manifest(args.publisher, args.publisher_format, args.version)
    if args.eicar_database:
        modelgen.write_eicar_database(args.eicar_database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
