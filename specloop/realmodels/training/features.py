"""Target feature cache: teacher-forced target forwards over a corpus, on disk.

For a token stream cut into fixed-length chunks of ``chunk_len`` tokens, one target
forward per chunk (teacher forcing; each chunk is an independent context) stores, per
position i of the chunk:

* ``tokens``      int32   [n_chunks, chunk_len]          token id x_i;
* ``hidden_<name>`` float16 [n_chunks, chunk_len, H]     the target's hidden state at
  position i for each requested layer (an index into transformers' ``hidden_states``
  tuple: 0 = embeddings, -1 = the last layer after the final norm, i.e. the feature the
  LM head reads — what EAGLE/Medusa/Hydra heads consume; EAGLE-3 adds low/middle/high);
* ``topk_ids``    int32   [n_chunks, chunk_len, K]        the target's top-K next-token
  ids at position i (the distribution p_target(. | x_<=i) of token i+1);
* ``topk_probs``  float16 [n_chunks, chunk_len, K]        their probabilities (float32
  softmax of the raw logits, temperature 1).

Files are ``.npy`` memmaps preallocated for the whole part and filled chunk by chunk;
``meta.json`` records ``n_done`` after every flush, so an interrupted extraction
resumes where it stopped, and readers (training) may use the first ``n_done`` chunks
while extraction still runs. Location: ``$SPECLOOP_CACHE/features/<target>/<part>``
or ``~/.cache/specloop/features/<target>/<part>``.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["eagle3_layers", "default_layers", "FeaturePart", "features_root", "mix_features_root",
           "training_features_root",
           "create_part", "open_part", "extract_features", "chunk_stream"]

def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """Low / middle / high ``hidden_states`` indices EAGLE-3 fuses for a target with
    ``num_layers`` decoder layers (EAGLE-3 reference code: layers 2, L//2, L-3)."""
    if num_layers < 4:
        raise ValueError(f"EAGLE-3 needs a target with >= 4 layers, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


def default_layers(num_layers: int) -> tuple[int, ...]:
    """Layers the default cache stores: EAGLE-3's three plus the last (-1)."""
    return (*eagle3_layers(num_layers), -1)


def features_root(target: str) -> Path:
    """``$SPECLOOP_CACHE/features/<target>`` or ``~/.cache/specloop/features/<target>``."""
    root = os.environ.get("SPECLOOP_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "specloop"
    return base / "features" / re.sub(r"[^A-Za-z0-9._-]+", "_", target)


def _layer_name(layer: int) -> str:
    return "hidden_last" if layer == -1 else f"hidden_{layer}"


def chunk_stream(ids: np.ndarray, chunk_len: int) -> np.ndarray:
    """Cut a 1-D id stream into int32 [n_chunks, chunk_len] (the tail that does not
    fill a chunk is dropped).

    Raises:
        ValueError: chunk_len < 2, or a stream shorter than one chunk.
    """
    if chunk_len < 2:
        raise ValueError(f"chunk_len must be >= 2, got {chunk_len}")
    ids = np.asarray(ids, dtype=np.int32).reshape(-1)
    n = ids.size // chunk_len
    if n == 0:
        raise ValueError(f"token stream of {ids.size} tokens is shorter than one chunk ({chunk_len})")
    return ids[: n * chunk_len].reshape(n, chunk_len)


@dataclass
class FeaturePart:
    """One part (``train`` / ``val`` / ``chat``) of a feature cache, memory-mapped.

    Attributes:
        folder: the part's folder.
        meta: contents of meta.json (``n_chunks``, ``n_done``, ``chunk_len``,
            ``layers``, ``top_k``, ``hidden_size``, ``fingerprint``, ``target``).
    """

    folder: Path
    meta: dict

    @property
    def n_done(self) -> int:
        """Chunks whose features are complete (re-read from disk)."""
        self.meta = json.loads((self.folder / "meta.json").read_text(encoding="utf-8"))
        return int(self.meta["n_done"])

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.meta["layers"])

    def array(self, name: str, mode: str = "r") -> np.ndarray:
        """Memmap of one array (``tokens``, ``topk_ids``, ``topk_probs``, or
        ``hidden`` of a layer via `hidden`)."""
        return np.load(self.folder / f"{name}.npy", mmap_mode=mode)

    def hidden(self, layer: int, mode: str = "r") -> np.ndarray:
        """float16 memmap [n_chunks, chunk_len, H] of one stored layer.

        Raises:
            ValueError: the layer is not stored in this cache.
        """
        if layer not in self.layers:
            raise ValueError(f"layer {layer} not in this feature cache (stored: {self.layers})")
        return self.array(_layer_name(layer), mode)

    def _write_meta(self) -> None:
        tmp = self.folder / "meta.json.tmp"
        tmp.write_text(json.dumps(self.meta, indent=1), encoding="utf-8")
        tmp.replace(self.folder / "meta.json")


def create_part(folder: str | Path, chunks: np.ndarray, *, layers: tuple[int, ...], hidden_size: int,
                top_k: int, target: str, fingerprint: str, dtype: str = "float32") -> FeaturePart:
    """Create (or reopen, if it matches) a part for the int32 [n, L] ``chunks``.

    An existing part with the same fingerprint, shape, layers and top_k is reopened
    for resumption; a mismatching one raises.

    Raises:
        ValueError: an existing part at ``folder`` was built from different data or
            settings (delete it to rebuild), or top_k < 1.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    folder = Path(folder)
    n, length = chunks.shape
    meta = {"target": target, "fingerprint": fingerprint, "n_chunks": int(n), "chunk_len": int(length),
            "layers": [int(x) for x in layers], "hidden_size": int(hidden_size), "top_k": int(top_k),
            "n_done": 0, "seconds": 0.0, "dtype": dtype}
    if (folder / "meta.json").is_file():
        part = open_part(folder)
        keys = ("fingerprint", "n_chunks", "chunk_len", "layers", "hidden_size", "top_k", "dtype")
        if any(part.meta[k] != meta[k] for k in keys):
            raise ValueError(f"feature cache at {folder} was built from other data/settings "
                             f"({ {k: part.meta[k] for k in keys} }); delete it to rebuild")
        return part
    folder.mkdir(parents=True, exist_ok=True)
    fmt = np.lib.format
    tok = fmt.open_memmap(folder / "tokens.npy", mode="w+", dtype=np.int32, shape=(n, length))
    tok[:] = chunks
    tok.flush()
    for layer in layers:
        fmt.open_memmap(folder / f"{_layer_name(layer)}.npy", mode="w+", dtype=np.float16,
                        shape=(n, length, hidden_size)).flush()
    fmt.open_memmap(folder / "topk_ids.npy", mode="w+", dtype=np.int32, shape=(n, length, top_k)).flush()
    fmt.open_memmap(folder / "topk_probs.npy", mode="w+", dtype=np.float16, shape=(n, length, top_k)).flush()
    part = FeaturePart(folder, meta)
    part._write_meta()
    return part


def open_part(folder: str | Path) -> FeaturePart:
    """Open an existing part.

    Raises:
        FileNotFoundError: no ``meta.json`` in ``folder``.
    """
    folder = Path(folder)
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(f"no feature cache at {folder} (meta.json missing); "
                                "build it with `specloop draft features` / extract_features")
    return FeaturePart(folder, json.loads((folder / "meta.json").read_text(encoding="utf-8")))


@torch.no_grad()
def _forward_chunks(model: torch.nn.Module, ids: torch.Tensor, layers: tuple[int, ...],
                    top_k: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """One teacher-forced forward over int64 [B, L]: hidden states of ``layers``
    ([B, L, H] float32 each), top-k ids [B, L, K] and probs [B, L, K]."""
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    hidden = [out.hidden_states[layer] for layer in layers]
    probs = torch.softmax(out.logits.float(), dim=-1)
    top = torch.topk(probs, top_k, dim=-1)
    return hidden, top.indices, top.values


def extract_features(model: torch.nn.Module, part: FeaturePart, *, batch_size: int = 1,
                     max_chunks: int | None = None, flush_every: int = 4, progress: bool = True,
                     desc: str = "features") -> FeaturePart:
    """Fill ``part`` from its first unfinished chunk (resumable).

    Args:
        model: the target causal LM (transformers, eval mode), on any device.
        part: a part from `create_part`.
        batch_size: chunks per forward.
        max_chunks: stop once this many chunks are done (None = all).
        flush_every: forwards between flushes of the memmaps + meta.json.
        progress: tqdm bar (tokens).

    Returns:
        The part, with ``meta["n_done"]`` updated.
    """
    from tqdm.auto import tqdm
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    layers, top_k, length = part.layers, int(part.meta["top_k"]), int(part.meta["chunk_len"])
    total = part.meta["n_chunks"] if max_chunks is None else min(max_chunks, part.meta["n_chunks"])
    start = part.n_done
    tokens = part.array("tokens")
    hidden_maps = [part.hidden(layer, "r+") for layer in layers]
    top_ids, top_probs = part.array("topk_ids", "r+"), part.array("topk_probs", "r+")
    device = next(model.parameters()).device
    bar = tqdm(total=total * length, initial=start * length, desc=desc, unit="tok",
               disable=not progress, smoothing=0.05)
    done, since_flush, t0 = start, 0, time.perf_counter()
    while done < total:
        stop = min(done + batch_size, total)
        ids = torch.from_numpy(np.asarray(tokens[done:stop], dtype=np.int64)).to(device)
        hidden, ids_k, probs_k = _forward_chunks(model, ids, layers, top_k)
        for mem, h in zip(hidden_maps, hidden):
            mem[done:stop] = h.to(torch.float16).cpu().numpy()
        top_ids[done:stop] = ids_k.to(torch.int32).cpu().numpy()
        top_probs[done:stop] = probs_k.to(torch.float16).cpu().numpy()
        bar.update((stop - done) * length)
        done, since_flush = stop, since_flush + 1
        if since_flush >= flush_every or done == total:
            for mem in (*hidden_maps, top_ids, top_probs):
                mem.flush()
            part.meta["n_done"] = done
            part.meta["seconds"] = float(part.meta.get("seconds", 0.0)) + time.perf_counter() - t0
            t0, since_flush = time.perf_counter(), 0
            part._write_meta()
    bar.close()
    return part


def generate_chat_responses(loaded, path: str | Path, *, max_prompts: int = 48,
                            max_new_tokens: int = 192, progress: bool = True) -> list[dict]:
    """The target's own greedy chat responses to warm-up prompts, cached as JSONL.

    Prompts come round-robin from the *warm-up* splits of MT-bench, IFBench and
    HumanEval (never the held-out split). Generation is resumable: records already
    in ``path`` are kept and only the missing ones are generated.

    Args:
        loaded: the target `LoadedModel`.
        path: the JSONL cache file.
        max_prompts: number of prompts (responses).
        max_new_tokens: cap per response, in tokens.

    Returns:
        ``[{"id", "prompt", "response"}]`` in prompt order.
    """
    from tqdm.auto import tqdm
    from specloop.data.prompts import load_prompts
    path = Path(path)
    lists = [load_prompts(d, "warmup") for d in ("mt-bench", "ifbench", "humaneval")]
    prompts = []
    for i in range(max(len(x) for x in lists)):
        prompts.extend(lst[i] for lst in lists if i < len(lst))
    prompts = prompts[:max_prompts]
    done = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["id"]] = rec
    tok, model = loaded.tokenizer, loaded.model
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for prompt in tqdm(prompts, desc="chat responses", disable=not progress):
            key = f"{prompt.dataset}:{prompt.id}"
            if key in done:
                continue
            ids = tok.apply_chat_template([{"role": "user", "content": prompt.text}],
                                          add_generation_prompt=True, return_tensors="pt", return_dict=True)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
            text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            done[key] = {"id": key, "prompt": prompt.text, "response": text}
            fh.write(json.dumps(done[key]) + "\n")
            fh.flush()
    return [done[f"{p.dataset}:{p.id}"] for p in prompts]


def mix_features_root(name: str, mix: dict[str, float] | None) -> Path:
    """`features_root` of ``name`` (a target, or e.g. ``<target>-quick``), suffixed
    with `corpus.mix_tag` for a non-default corpus mix, so caches of different
    mixes never mix."""
    from specloop.realmodels.training.corpus import mix_tag
    tag = mix_tag(mix)
    return features_root(f"{name}-{tag}" if tag else name)


def training_features_root(config) -> Path:
    """The feature-cache root a `TrainConfig` reads: ``config.feature_root`` if set,
    else `mix_features_root` of the target and ``config.corpus_mix``."""
    if config.feature_root:
        return Path(config.feature_root)
    return mix_features_root(config.target, getattr(config, "corpus_mix", None))


def build_feature_cache(loaded, target: str, *, total_tokens: int = 1_200_000, chunk_len: int = 512,
                        top_k: int = 8, layers: tuple[int, ...] | None = None, chat_prompts: int = 48,
                        chat_tokens: int = 192, root: str | Path | None = None, progress: bool = True,
                        parts: tuple[str, ...] = ("val", "train", "chat"),
                        mix: dict[str, float] | None = None) -> dict[str, FeaturePart]:
    """Build the whole warm-up feature cache for ``target``: corpus (cached), then the
    ``val``, ``train`` and ``chat`` parts (each resumable), in that order.

    Args:
        loaded: the target `LoadedModel`.
        target: the target's name (cache folder).
        total_tokens: training-token budget of the text corpus (tokens).
        chunk_len: tokens per teacher-forced chunk.
        top_k: target next-token candidates kept per position.
        layers: ``hidden_states`` indices to store (default `default_layers`).
        chat_prompts / chat_tokens: size of the target's own chat-response part.
        root: cache root (default `features_root(target)`).
        parts: which parts to build, in order.
        mix: corpus source weights (default `corpus.DEFAULT_MIX`); a cached corpus
            built with another size or mix is rebuilt.

    Returns:
        part name -> `FeaturePart`.
    """
    from specloop.realmodels.training.corpus import (DEFAULT_MIX, build_corpus, chat_documents,
                                                     load_corpus, normalise_mix, save_corpus)
    root = Path(root) if root is not None else features_root(target)
    model = loaded.model
    num_layers = int(model.config.num_hidden_layers)
    layers = tuple(layers) if layers is not None else default_layers(num_layers)
    hidden_size = int(model.config.hidden_size)
    try:
        corpus = load_corpus(root / "corpus")
        if corpus.requested_tokens != total_tokens or corpus.mix != normalise_mix(mix or DEFAULT_MIX):
            raise FileNotFoundError
    except FileNotFoundError:
        corpus = build_corpus(loaded.tokenizer, total_tokens, mix=mix, progress=progress)
        save_corpus(corpus, root / "corpus")
    out = {}
    for name in parts:
        if name == "chat":
            records = generate_chat_responses(loaded, root / "chat_responses.jsonl",
                                              max_prompts=chat_prompts, max_new_tokens=chat_tokens,
                                              progress=progress)
            docs = chat_documents(records, loaded.tokenizer)
            eos = loaded.tokenizer.eos_token_id
            stream = np.concatenate([np.asarray(loaded.tokenizer(d.text, add_special_tokens=False)["input_ids"]
                                                + [eos], dtype=np.int32) for d in docs])
            fingerprint = f"chat-{len(docs)}-{stream.size}"
        else:
            stream = corpus.val_ids if name == "val" else corpus.train_ids
            fingerprint = f"{corpus.fingerprint}-{name}"
        chunks = chunk_stream(stream, chunk_len)
        part = create_part(root / name, chunks, layers=layers, hidden_size=hidden_size, top_k=top_k,
                           target=target, fingerprint=fingerprint,
                           dtype=str(next(model.parameters()).dtype).replace("torch.", ""))
        out[name] = extract_features(model, part, progress=progress, desc=f"features {name}")
    return out
